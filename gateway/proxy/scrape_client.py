"""The replica metrics scraper's HTTP client in the proxy.

``gateway.metrics_scraper.MetricsScraper`` takes any client with an httpx-like ``get(url, timeout=)``. Its
default, an ``httpx.AsyncClient``, cost 1.4 ms of event-loop CPU per scrape of a simulated replica's 27 kB
``/metrics`` (parse included) against 0.4-0.6 ms through aiohttp; at 10 scrapes a second per replica that was
the proxy's largest background cost (py-spy: 14% of its samples) and it delayed requests arriving during a
scrape. ``AiohttpScrapeClient`` answers the same calls through aiohttp, the data-plane client, on its own small
pool. ``KeepAliveScrapeClient``, the proxy's, sends the one request a scrape is over a kept-alive connection per
replica and reads the answer with httptools (the C HTTP parser uvicorn uses): no client session, request object,
stream reader or timeout handle per scrape (docs/request-path.md, "What it costs, measured"). It hands any URL
other than plain ``http://`` to aiohttp.
"""

from __future__ import annotations

import asyncio
import functools
from urllib.parse import urlsplit

import aiohttp
import httptools
import httpx

from gateway.proxy.relay import upstream_url


class _Response:
    __slots__ = ("status_code", "content", "url")

    def __init__(self, status_code: int, content: bytes, url: str) -> None:
        self.status_code = status_code
        self.content = content
        self.url = url

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def raise_for_status(self) -> None:
        if self.status_code >= 400:
            raise httpx.HTTPError(f"{self.url} answered {self.status_code}")


class AiohttpScrapeClient:
    def __init__(self, max_connections: int = 64) -> None:
        self._max = max_connections
        self._session: aiohttp.ClientSession | None = None

    async def get(self, url: str, timeout: float) -> _Response:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max, keepalive_timeout=30),
                skip_auto_headers=("User-Agent",),
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        try:
            async with self._session.get(upstream_url(url), timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                return _Response(resp.status, await resp.read(), url)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            # The scraper counts httpx errors as failed scrapes (the replica's snapshot just ages).
            raise httpx.HTTPError(f"{type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class _Connection(asyncio.Protocol):
    """One kept-alive connection to a replica: a GET at a time, its answer read by httptools' response parser
    (Content-Length or chunked bodies alike)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._parser = httptools.HttpResponseParser(self)
        self._body: list[bytes] = []
        self._waiter: asyncio.Future | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(exc)
            self.close()

    def connection_lost(self, exc) -> None:
        self.closed = True
        self._fail(exc or ConnectionResetError("the replica closed the connection"))

    # httptools' callbacks
    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        waiter, self._waiter = self._waiter, None
        answer = (self._parser.get_status_code(), b"".join(self._body), self._parser.should_keep_alive())
        self._body = []
        if waiter is not None and not waiter.done():
            waiter.set_result(answer)

    def _fail(self, exc: BaseException) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc if isinstance(exc, Exception) else ConnectionError(str(exc)))

    def request(self, raw: bytes) -> asyncio.Future:
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(raw)
        return self._waiter

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


@functools.lru_cache(maxsize=1024)
def _target(url: str) -> tuple[str, int, bytes] | None:
    """(host, port, the request's bytes) for a plain ``http://`` URL; None for anything else."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        return None
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    host = parts.netloc.rpartition("@")[2]
    raw = f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept-Encoding: identity\r\n\r\n".encode("latin-1")
    return parts.hostname, parts.port or 80, raw


class KeepAliveScrapeClient:
    """The scraper's client in the proxy: one kept-alive connection per replica (the scraper has at most one scrape
    of a replica outstanding, 10 a second, where the replica's server keeps an idle connection 5 s)."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], _Connection] = {}
        self._other = AiohttpScrapeClient()

    async def get(self, url: str, timeout: float) -> _Response:
        target = _target(url)
        if target is None:
            return await self._other.get(url, timeout)
        host, port, raw = target
        conn = self._idle.pop((host, port), None)
        try:
            async with asyncio.timeout(timeout):
                if conn is None or conn.closed:
                    _, conn = await asyncio.get_running_loop().create_connection(_Connection, host, port)
                status, body, keep_alive = await conn.request(raw)
        except (TimeoutError, OSError, httptools.HttpParserError) as exc:
            if conn is not None:
                conn.close()  # a half-read answer: the connection cannot be reused
            raise httpx.HTTPError(f"{type(exc).__name__}: {exc}") from exc
        except asyncio.CancelledError:  # the replica left the targets while its scrape waited
            if conn is not None:
                conn.close()
            raise
        if keep_alive and not conn.closed and (host, port) not in self._idle:
            self._idle[(host, port)] = conn
        else:
            conn.close()
        return _Response(status, body, url)

    def forget(self, urls) -> None:
        """Close the kept connections to replicas no longer scraped."""
        keep = {t[:2] for t in map(_target, urls) if t is not None}
        for key in [k for k in self._idle if k not in keep]:
            self._idle.pop(key).close()

    async def aclose(self) -> None:
        for conn in self._idle.values():
            conn.close()
        self._idle.clear()
        await self._other.aclose()
