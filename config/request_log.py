"""The request id in every log line of a Django request, and logs as JSON lines for a log collector.

``RequestIdMiddleware`` takes the caller's ``X-Request-Id`` (an ingress or another service sets one) when it is a
plain token, else makes one, keeps it for the request's log records and returns it as ``X-Request-Id``.
``JsonFormatter`` writes one JSON object per record; ``INFERCAP_LOG_FORMAT=json`` selects it
(config/settings/logging.py)."""

from __future__ import annotations

import json
import logging
import re
import uuid
from contextvars import ContextVar

request_id: ContextVar[str] = ContextVar("request_id", default="")
_TOKEN = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


class RequestIdMiddleware:
    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        given = request.headers.get("X-Request-Id", "")
        rid = given if _TOKEN.match(given) else uuid.uuid4().hex
        token = request_id.set(rid)
        try:
            response = self.get_response(request)
        finally:
            request_id.reset(token)
        response["X-Request-Id"] = rid
        return response


class RequestIdFilter(logging.Filter):
    """Puts the current request's id on each record (empty outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if getattr(record, "request_id", ""):
            entry["request_id"] = record.request_id
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)
