"""JSON log lines carrying the request id, which the response returns as X-Request-Id (config/request_log.py)."""

import json
import logging

import pytest

from config.request_log import JsonFormatter, RequestIdFilter, request_id


@pytest.mark.django_db
def test_the_request_id_is_taken_or_made_and_returned(client):
    assert client.get("/api/v1/", HTTP_X_REQUEST_ID="ingress-42")["X-Request-Id"] == "ingress-42"
    made = client.get("/api/v1/", HTTP_X_REQUEST_ID="not a token; <script>")["X-Request-Id"]
    assert len(made) == 32 and made.isalnum()


def test_a_record_logged_during_a_request_is_a_json_line_with_its_id():
    record = logging.LogRecord("infercap.x", logging.WARNING, __file__, 1, "replica %s down", ("r1",), None)
    token = request_id.set("abc123")
    try:
        RequestIdFilter().filter(record)
    finally:
        request_id.reset(token)
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "replica r1 down" and line["request_id"] == "abc123" and line["level"] == "WARNING"
