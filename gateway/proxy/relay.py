"""The upstream exchange: one request to one replica over the pooled aiohttp session, relaying SSE events
to the client as they arrive. The first byte to the client is sent only once the replica has produced
output, so a failure before it may be retried on another replica; a stream that breaks after it raises
``StreamBroken``, and the caller resumes it elsewhere (``resume.py``) or ends it with an error event."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
import yarl

from gateway.proxy.errors import error_body, sse_error_event
from gateway.proxy.model_names import ModelRename

_USAGE_MARKERS = (b'"usage":{', b'"usage": {')
# What one stream keeps of its relayed bytes to resume it (~5,000 tokens of vLLM's chunks): bounded, so a thousand
# long streams cost the proxy at most a GiB; a longer answer that breaks ends with an error event.
RELAYED_BYTES_KEPT = 1 << 20
_ERROR_MARKERS = (b'data: {"error"', b'data: {"object":"error"')
# Token chunks (and the role and usage chunks: all of vLLM's JSON events open with their id), the stream's end.
_TOKEN_EVENT = b'data: {"id"'
# Role chunks come first (one per choice) and carry no token: a read of one event is searched for one only
# until a token came.
_ROLE_MARKER = b'"role":"assistant"'
_DONE_EVENT = b"data: [DONE]"


ROUTE_MISSING = b'{"detail":"Not Found"}'  # FastAPI's 404 for a route the engine does not serve


class UpstreamFailed(Exception):
    """The replica failed before anything reached the client (connect error, 5xx, reset): retryable."""

    def __init__(self, message: str, status: int = 502) -> None:
        super().__init__(message)
        self.status = status


class StreamBroken(Exception):
    """The replica's stream broke after output reached the client (connection reset or closed without [DONE]):
    ``buf`` is the incomplete event it left. Resumable on another replica (``resume.py``)."""

    def __init__(self, buf: bytes) -> None:
        super().__init__("replica stream ended early")
        self.buf = buf


class ResumeRefused(UpstreamFailed):
    """The replica asked to continue a broken stream answered with a client error (the context is full now, say):
    no other replica will do better, and the client's stream ends with an error event."""


class PriorityRefused(UpstreamFailed):
    """The replica refused the ``priority`` field with a 400: it runs vLLM's default fcfs scheduler. Nothing
    reached the client; the caller resends without the field."""

    def __init__(self) -> None:
        super().__init__("replica refused 'priority' (fcfs scheduler)", status=400)


class AdapterMissing(UpstreamFailed):
    """The replica answered 404 to a request naming a LoRA adapter it was thought to hold (unloaded since: another
    proxy process, an operator, an engine restart). Nothing reached the client; the caller loads it again."""

    def __init__(self) -> None:
        super().__init__("replica does not hold the adapter", status=503)


def _refuses_priority(status: int, body: bytes, priority_sent: bool) -> bool:
    return priority_sent and status == 400 and b"priority" in body.lower()


@dataclass
class Outcome:
    """What happened, for metering; filled in as the exchange progresses."""

    status: str = "ok"
    started_client: bool = False  # the response head went to the client: no retry any more
    first_token_at: float | None = None
    last_read_at: float | None = None
    done: bool = False  # [DONE] went to the client: a disconnect after this is a normal close
    finished_at: float | None = None
    usage: dict | None = None
    content_events: int = 0
    error: str = ""
    extra_headers: list = field(default_factory=list)
    # The SSE bytes sent to the client, to resume a broken stream (resume.py); None once past RELAYED_BYTES_KEPT.
    relayed: list | None = field(default_factory=list)
    relayed_bytes: int = 0
    # Called once when the replica's first bytes arrive (the router's pending prefill: routing/prefill.py).
    on_first_token: Callable[[], None] | None = None


def _split_usage(out: bytes, forward_usage: bool, outcome: Outcome) -> bytes:
    """Read the usage block out of complete events; drop the usage-only event if the client did not ask for it."""
    kept = []
    for event in out.split(b"\n\n"):
        if not event:
            continue
        if any(marker in event for marker in _USAGE_MARKERS) and event.startswith(b"data: {"):
            try:
                obj = json.loads(event[6:])
            except ValueError:
                kept.append(event)
                continue
            usage = obj.get("usage")
            if isinstance(usage, dict):
                outcome.usage = usage
            if not forward_usage and obj.get("choices") == []:
                continue
        kept.append(event)
    return b"\n\n".join(kept) + b"\n\n" if kept else b""


@functools.lru_cache(maxsize=4096)
def upstream_url(url: str) -> yarl.URL:
    """A replica's URL parsed once, not per request (aiohttp parses a string each call: yarl was ~15 % of a proxy
    worker's CPU in ``bench proxy --opt profile``). The platform builds these URLs itself: nothing to quote."""
    return yarl.URL(url, encoded=True)


@functools.lru_cache(maxsize=64)
def _timeout(connect_timeout_s: float) -> aiohttp.ClientTimeout:
    # No read timeout here: the request's watchdog enforces TTFT and stream-idle limits (never a total one).
    return aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s)


async def _post(session: aiohttp.ClientSession, url: str, payload: bytes, headers: dict, connect_timeout_s: float):
    try:
        return await session.post(
            upstream_url(url), data=payload, headers=headers, timeout=_timeout(connect_timeout_s)
        )
    except (aiohttp.ClientError, OSError) as exc:
        raise UpstreamFailed(f"replica unreachable: {type(exc).__name__}") from exc


async def stream_exchange(
    session: aiohttp.ClientSession,
    url: str,
    payload: bytes,
    headers: dict,
    send,
    *,
    response_headers: list,
    forward_usage: bool,
    outcome: Outcome,
    connect_timeout_s: float,
    priority_sent: bool = False,
    rename: ModelRename | None = None,
    transform=None,
    adapter_request: bool = False,
) -> None:
    """``transform``: applied to each run of whole events before anything else reads them (a resumed stream's
    ``resume.Continued``); None on a first attempt. ``adapter_request``: a 404 is ``AdapterMissing``."""
    resp = await _post(session, url, payload, headers, connect_timeout_s)
    async with resp:
        if resp.status >= 500:
            raise UpstreamFailed(f"replica answered {resp.status}")
        if adapter_request and resp.status == 404:
            raise AdapterMissing()
        if resp.status != 200:
            if outcome.started_client:  # a continuation: the client's response is under way
                if _refuses_priority(resp.status, await resp.read(), priority_sent):
                    raise PriorityRefused()
                raise ResumeRefused(f"replica answered {resp.status} to the continuation", status=resp.status)
            await _pass_client_error(resp, send, response_headers, outcome, priority_sent)
            return
        buf, done, closed = await _relay_events(
            resp.content, send, response_headers, forward_usage, outcome, rename, transform
        )
        if not closed:
            if rename is not None:
                buf = rename.to_client(buf)
            if outcome.started_client and not done:
                raise StreamBroken(buf)
            await end_stream(send, response_headers, outcome, buf=buf, done=done)


async def _pass_client_error(resp, send, response_headers: list, outcome: Outcome, priority_sent: bool) -> None:
    """A client error from the replica (prompt too long, bad parameter) goes to the client unchanged, except an
    fcfs replica's refusal of ``priority``, which the caller resends without it."""
    body = await resp.read()
    if _refuses_priority(resp.status, body, priority_sent):
        raise PriorityRefused()
    outcome.status = "upstream_error"
    outcome.error = f"replica answered {resp.status}"
    outcome.started_client = True
    await send(
        {
            "type": "http.response.start",
            "status": resp.status,
            "headers": [(b"content-type", b"application/json"), *response_headers],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _relay_events(
    content, send, response_headers: list, forward_usage: bool, outcome: Outcome, rename=None, transform=None
) -> tuple[bytes, bool, bool]:
    """Forward whole SSE events as they arrive; the response head goes out with the first ones, so until then a
    failure is retryable (UpstreamFailed). Returns what is left: (incomplete event, [DONE] seen, response ended).
    Runs for every token: a read of one event (the usual case) is told by its start, with no call and one scan of
    its bytes; a read of several goes through ``_read_events``."""
    buf = b""
    done = closed = False
    relayed = outcome.relayed
    try:
        while True:
            data = await content.readany()
            if not data:
                break
            outcome.last_read_at = now = time.perf_counter()
            if outcome.first_token_at is None:
                _first_bytes(outcome, now)
            buf = buf + data if buf else data
            cut = buf.rfind(b"\n\n")
            if cut < 0:
                continue
            out, buf = buf[: cut + 2], buf[cut + 2 :]
            if transform is not None:
                out = transform(out)
            if b'"usage"' in out and (_USAGE_MARKERS[0] in out or _USAGE_MARKERS[1] in out):
                out = _split_usage(out, forward_usage, outcome)
            if rename is not None:
                out = rename.to_client(out)
            if out.find(b"\n\n") == len(out) - 2:  # one event: its start says what it is
                if out.startswith(_TOKEN_EVENT):
                    if outcome.content_events or _ROLE_MARKER not in out:
                        outcome.content_events += 1
                elif out.startswith(_DONE_EVENT):
                    done, outcome.finished_at = True, time.perf_counter()
                elif out.startswith(_ERROR_MARKERS):
                    _errored(outcome)
            elif out:
                done = _read_events(out, outcome) or done
            if closed:
                continue  # after [DONE]: only drain the upstream to EOF so its connection is reused
            if relayed is not None:
                relayed.append(out)
                outcome.relayed_bytes += len(out)
                if outcome.relayed_bytes > RELAYED_BYTES_KEPT:
                    relayed = outcome.relayed = None
            if not outcome.started_client:
                outcome.started_client = True
                await send({"type": "http.response.start", "status": 200, "headers": response_headers})
            if done and not buf:
                # [DONE] ends the client's response in the same write: one syscall fewer per request.
                await send({"type": "http.response.body", "body": out, "more_body": False})
                closed = outcome.done = True
            elif out:
                await send({"type": "http.response.body", "body": out, "more_body": True})
                outcome.done = done
    except (aiohttp.ClientError, OSError) as exc:
        if not outcome.started_client:
            raise UpstreamFailed(f"replica connection failed: {type(exc).__name__}") from exc
    return buf, done, closed


def _first_bytes(outcome: Outcome, now: float) -> None:
    outcome.first_token_at = now
    if outcome.on_first_token is not None:
        outcome.on_first_token()


def _read_events(out: bytes, outcome: Outcome) -> bool:
    """What a read of several whole events carries: its token chunks (role chunks carry none), an error event;
    whether [DONE] is among them."""
    outcome.content_events += out.count(_TOKEN_EVENT) - out.count(_ROLE_MARKER)
    if _ERROR_MARKERS[0] in out or _ERROR_MARKERS[1] in out:
        _errored(outcome)
    if _DONE_EVENT in out:
        outcome.finished_at = time.perf_counter()
        return True
    return False


def _errored(outcome: Outcome) -> None:
    outcome.status = "upstream_error"
    outcome.error = "replica reported an error mid-stream"


async def end_stream(send, response_headers: list, outcome: Outcome, *, buf: bytes, done: bool) -> None:
    """The upstream ended (or broke after the head went out) without [DONE] closing the response: send what is
    left, and an error event if [DONE] never came."""
    if not outcome.started_client:
        if not done:
            raise UpstreamFailed("replica closed the stream without output")
        outcome.started_client = True
        await send({"type": "http.response.start", "status": 200, "headers": response_headers})
    if buf:
        await send({"type": "http.response.body", "body": buf, "more_body": True})
    if not done:
        outcome.status = "upstream_error"
        outcome.error = "replica stream ended early"
        await send({"type": "http.response.body", "body": sse_error_event(outcome.error), "more_body": True})
    outcome.done = True
    if outcome.finished_at is None:
        outcome.finished_at = time.perf_counter()
    await send({"type": "http.response.body", "body": b""})


async def plain_exchange(
    session: aiohttp.ClientSession,
    url: str,
    payload: bytes,
    headers: dict,
    send,
    *,
    response_headers: list,
    outcome: Outcome,
    connect_timeout_s: float,
    priority_sent: bool = False,
    rename: ModelRename | None = None,
    adapter_request: bool = False,
) -> None:
    resp = await _post(session, url, payload, headers, connect_timeout_s)
    async with resp:
        try:
            body = await resp.read()
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamFailed(f"replica connection failed: {type(exc).__name__}") from exc
        if resp.status >= 500:
            raise UpstreamFailed(f"replica answered {resp.status}")
        if adapter_request and resp.status == 404:
            raise AdapterMissing()
        if _refuses_priority(resp.status, body, priority_sent):
            raise PriorityRefused()
    outcome.first_token_at = outcome.finished_at = time.perf_counter()
    if rename is not None:
        body = rename.to_client(body)
    if resp.status == 404 and body.strip() == ROUTE_MISSING:
        # The engine has no such route (a generating model asked for embeddings, or a pooling one for completions):
        # said in OpenAI's shape, not FastAPI's.
        path = url.split("/v1/", 1)[-1]
        body = error_body(
            f"This model's replicas do not serve /v1/{path}.", type="invalid_request_error", code="unsupported_api"
        )
    if resp.status == 200:
        try:
            usage = json.loads(body).get("usage")
            outcome.usage = usage if isinstance(usage, dict) else None
        except (ValueError, AttributeError):
            outcome.status = "upstream_error"
    else:
        outcome.status = "upstream_error"
        outcome.error = f"replica answered {resp.status}"
    outcome.started_client = True
    await send(
        {
            "type": "http.response.start",
            "status": resp.status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *response_headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
