"""The reliability harness reads why a request was refused from the proxy's OpenAI-shaped error body, so the
overload bench can say which refusals fair pain chose (``overloaded``, ``evicted``) and which it did not
(``queue_age``)."""

import pytest

from benchmarks.harness.reliability.harness import error_code
from gateway.proxy.errors import error_body


def test_the_code_of_the_proxys_own_refusal_is_read():
    assert error_code(error_body("too old", type="server_overloaded", code="queue_age")) == "queue_age"
    assert error_code(error_body("bad", type="invalid_request_error")) is None  # no code given


@pytest.mark.parametrize("body", [b"", b"not json", b"[]", b'{"error": "flat"}', b'{"error": {"message": "x"}}'])
def test_anything_else_has_no_code(body):
    assert error_code(body) is None
