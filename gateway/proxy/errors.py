"""OpenAI-shaped error bodies and the ASGI helpers that send them."""

import json


class ProxyError(Exception):
    """Raised anywhere on the request path; becomes one OpenAI-shaped error response."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        retry_after: int | None = None,
        usage_status: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.retry_after = retry_after
        # When set, the request was authenticated and is metered with this status (shed, rate_limited…).
        self.usage_status = usage_status

    def body(self) -> bytes:
        return error_body(self.message, type=self.type, code=self.code, param=self.param)


def error_body(message: str, *, type: str, code: str | None = None, param: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": type, "param": param, "code": code}}).encode()


def sse_error_event(message: str, *, type: str = "upstream_error", code: str | None = None) -> bytes:
    """A mid-stream failure ends the stream the way vLLM does: an error event, then [DONE]."""
    return b"data: " + error_body(message, type=type, code=code) + b"\n\ndata: [DONE]\n\n"


async def send_json(send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def send_error(send, err: ProxyError, headers: list[tuple[bytes, bytes]]) -> None:
    extra = list(headers)
    if err.retry_after is not None:
        extra.append((b"retry-after", str(int(err.retry_after)).encode()))
    await send_json(send, err.status, err.body(), extra)
