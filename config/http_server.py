"""uvicorn's HTTP/1.1 protocol (httptools) with the bounds it lacks: a request's headers must arrive within
``header_timeout_s`` of the connection opening or the request's first byte, and its body within ``body_timeout_s``
of the headers; otherwise the server answers 408 and closes. Without them a client trickling a header line every
few seconds (slow loris) holds a socket and its memory forever: uvicorn only times out idle keep-alive connections.

Shipped command lines select it with ``--http config.http_server:BoundedHttpToolsProtocol``; the bounds come from
``INFERCAP_HTTP_HEADER_TIMEOUT_S`` and ``INFERCAP_HTTP_BODY_TIMEOUT_S``. Which bound lives here and which in the
ingress: docs/security.md.
"""

from __future__ import annotations

import asyncio
import os

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


def _seconds(name: str, default: float) -> float:
    value = float(os.environ.get(name) or default)
    if value <= 0:
        raise ValueError(f"{name} must be a positive number of seconds, not {value:g}")
    return value


REQUEST_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: 16\r\n"
    b"connection: close\r\n\r\nRequest Timeout\n"
)


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    header_timeout_s: float = _seconds("INFERCAP_HTTP_HEADER_TIMEOUT_S", 10.0)
    body_timeout_s: float = _seconds("INFERCAP_HTTP_BODY_TIMEOUT_S", 30.0)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.header_timeout_s)  # a connection that never sends a byte is bounded too

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._deadline is None:  # the next request on a kept-alive connection: its first byte arrived
            self._arm(self.header_timeout_s)

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()
        if not self.parser.should_upgrade():  # a WebSocket leaves this protocol: no body to wait for
            self._arm(self.body_timeout_s)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._timed_out)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _timed_out(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self.cycle is None or not self.cycle.response_started or self.cycle.response_complete:
            self.transport.write(REQUEST_TIMEOUT)
        # connection_lost tells an application still reading the body that the client is gone (http.disconnect).
        self.transport.close()
