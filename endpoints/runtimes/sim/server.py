"""The simulated replica: an aiohttp server speaking vLLM's OpenAI-compatible HTTP API, backed by ``engine``.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions`` (stream and not), ``GET /v1/models``, ``/health``,
``/ping``, ``/version``, ``/load``, ``/metrics``; admin: ``GET|POST /admin/faults`` (JSON settings of
``faults.Faults``), ``POST /admin/crash``, ``POST /reset_prefix_cache``, ``GET /admin/received`` (the engine-facing
fields of the last requests, as a router or proxy sent them). Responses echo ``X-Request-Id``.

The engine runs in real time scaled by ``speed``: a modeled 20 ms step takes 2 ms of wall time at speed 10.
Everything the replica reports (usage, ``/metrics`` latencies) is in simulated seconds. A client that
disconnects aborts its request (blocks freed, ``finished_reason="abort"`` counted), streaming or not.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from collections import deque

from aiohttp import web

from .engine import FINISHED, Engine, Sequence
from .faults import Faults
from .metrics import ReplicaMetrics
from .profiles import EngineProfile
from .protocol import (
    BadRequest,
    ParsedRequest,
    chat_chunk,
    completion_chunk,
    error_body,
    full_response,
    parse_request,
    usage_block,
    usage_chunk,
)
from .tokens import block_hashes, output_text, partial_block

logger = logging.getLogger(__name__)
VERSION = "0.11.0+infercap.sim"
CRASH_EXIT_CODE = 75
STEP_CATCH_UP_S = 1.0  # wall seconds a late engine may catch up on (CPU starvation on a shared machine)
RECEIVED_KEPT = 256


class _Live:
    """A request being served: the engine sequence plus what the HTTP side needs to stream it."""

    __slots__ = ("seq", "event", "arrival_s", "first_token_s", "last_token_s", "parsed")

    def __init__(self, seq: Sequence, parsed: ParsedRequest, arrival_s: float):
        self.seq = seq
        self.parsed = parsed
        self.event = asyncio.Event()
        self.arrival_s = arrival_s
        self.first_token_s: float | None = None  # on this server's clock (engine times ignore the slow factor)
        self.last_token_s = arrival_s


_TEXT_MARK = "\u0000text\u0000"


def _content_template(parsed: ParsedRequest, created: int) -> tuple[bytes, bytes]:
    """The SSE frame of a content chunk split around its text: the same bytes ``_sse`` writes, built once.

    Output words (``tokens.OUTPUT_WORDS``) need no JSON escaping, so a frame is prefix + word + suffix.
    """
    if parsed.chat:
        chunk = chat_chunk(parsed, created, {"content": _TEXT_MARK})
    else:
        chunk = completion_chunk(parsed, created, _TEXT_MARK)
    head, tail = _sse(chunk).split(json.dumps(_TEXT_MARK)[1:-1].encode())
    return head, tail


def _sse(payload: dict | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


class ReplicaServer:
    def __init__(
        self,
        profile: EngineProfile,
        *,
        speed: float = 1.0,
        served_model_name: str | None = None,
        scheduling_policy: str = "priority",
        faults: Faults | None = None,
        on_crash=None,
    ):
        if speed <= 0:
            raise ValueError("speed must be positive")
        self.profile = profile
        self.speed = speed
        self.model = served_model_name or profile.model_name
        self.scheduling_policy = scheduling_policy
        self.engine = Engine(profile, scheduling_policy=scheduling_policy)
        self.metrics = ReplicaMetrics(self.engine, self.model)
        self.faults = faults or Faults()
        self.on_crash = on_crash or (lambda: os._exit(CRASH_EXIT_CODE))
        self.created = int(time.time())
        self.received = 0
        # What the engine was asked for, per accepted request: lets tests check what a proxy forwards.
        self.received_log: deque[dict] = deque(maxlen=RECEIVED_KEPT)
        self.crashed = False
        self._live: set[_Live] = set()
        self._runner: web.AppRunner | None = None
        self._engine_task: asyncio.Task | None = None
        self._t0 = 0.0
        self.url = ""

    # -- lifecycle ---------------------------------------------------------------------------------
    def now(self) -> float:
        return (asyncio.get_running_loop().time() - self._t0) * self.speed

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_route("*", "/ping", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/load", self.load)
        app.router.add_get("/metrics", self.metrics_view)
        app.router.add_get("/admin/faults", self.get_faults)
        app.router.add_get("/admin/received", self.get_received)
        app.router.add_post("/admin/faults", self.set_faults)
        app.router.add_post("/admin/crash", self.crash_view)
        app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        loop = asyncio.get_running_loop()
        self._t0 = loop.time()
        self._wake = asyncio.Event()
        self._runner = web.AppRunner(self.make_app(), handler_cancellation=True, access_log=None, shutdown_timeout=0.2)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        bound = site._server.sockets[0].getsockname()[1]
        self.url = f"http://{host}:{bound}"
        self._engine_task = loop.create_task(self._run_engine())
        if self.faults.crash_after_s is not None:
            loop.call_later(self.faults.crash_after_s, self.crash)
        return self.url

    async def stop(self) -> None:
        if self._engine_task is not None:
            self._engine_task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def crash(self) -> None:
        logger.warning("simulated crash")
        self.crashed = True
        self.on_crash()

    # -- engine loop -------------------------------------------------------------------------------
    async def _run_engine(self) -> None:
        loop = asyncio.get_running_loop()
        # Steps end on an absolute timeline, so wake-up latency on a busy machine does not add up step after step
        # (it slowed the modeled rates by 20–30 % under load); a step that ends late is followed at once by the
        # next one. After a hang, an idle engine or a stall longer than STEP_CATCH_UP_S the timeline restarts.
        step_end = None
        while True:
            while self.faults.hang:
                step_end = None
                await asyncio.sleep(0.01)
            plan = self.engine.plan(self.now(), 1)
            if plan is None:
                step_end = None
                self._wake.clear()
                await self._wake.wait()
                continue
            if step_end is None or loop.time() - step_end > STEP_CATCH_UP_S:
                step_end = loop.time()
            step_end += plan.duration(1) * self.faults.slow_factor / self.speed
            await asyncio.sleep(max(0.0, step_end - loop.time()))
            while self.faults.hang:  # a hang freezes the step in progress too: streams stop mid-way
                await asyncio.sleep(0.01)
            now = self.now()
            finished = self.engine.commit(plan, 1, now)
            self.metrics.iteration_tokens.observe(plan.prefill_tokens + len(plan.seqs) - len(plan.admitted))
            for seq in plan.seqs:
                live = seq.tag
                if live is None or seq.generated == 0:
                    continue
                if seq.generated == 1:
                    live.first_token_s = now
                    self.metrics.ttft.observe(now - live.arrival_s)
                    self.metrics.queue.observe(max(0.0, (seq.scheduled_s or now) - live.arrival_s))
                    self.metrics.prefill.observe(max(0.0, now - (seq.scheduled_s or now)))
                else:
                    self.metrics.itl.observe(now - live.last_token_s)
                live.last_token_s = now
                live.event.set()
            for seq in finished:
                self._observe_finished(seq.tag, now)

    def _observe_finished(self, live: _Live, now: float) -> None:
        seq, m = live.seq, self.metrics
        first = live.first_token_s if live.first_token_s is not None else now
        decode = max(0.0, now - first)
        m.e2e.observe(now - live.arrival_s)
        m.decode.observe(decode)
        m.inference.observe(max(0.0, now - (seq.scheduled_s or now)))
        m.prompt_tokens.observe(seq.prompt_tokens)
        m.generation_tokens.observe(seq.generated)
        if live.parsed.max_tokens_param is not None:
            m.max_tokens.observe(live.parsed.max_tokens_param)
        if seq.generated > 1:
            m.tpot.observe(decode / (seq.generated - 1))

    # -- OpenAI endpoints --------------------------------------------------------------------------
    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    def _error(self, exc: BadRequest, request_id: str | None = None) -> web.Response:
        headers = {"X-Request-Id": request_id} if request_id else None
        body = error_body(str(exc), status=exc.status, kind=exc.kind, param=exc.param)
        return web.json_response(body, status=exc.status, headers=headers)

    async def _serve(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        header_id = request.headers.get("X-Request-Id")
        self.received += 1
        if self.faults.crash_after_requests is not None and self.received >= self.faults.crash_after_requests:
            self.crash()
        if self.faults.should_error():
            status = int(self.faults.error_status)
            kind = "ServiceUnavailableError" if status == 503 else "InternalServerError"
            return self._error(
                BadRequest("simulated engine error (fault injection)", status=status, kind=kind), header_id
            )
        try:
            try:
                body = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise BadRequest("the request body is not valid JSON") from None
            parsed = parse_request(
                body,
                chat=chat,
                served_model=self.model,
                max_model_len=self.profile.max_model_len,
                scheduling_policy=self.scheduling_policy,
                header_request_id=header_id,
            )
        except BadRequest as exc:
            return self._error(exc, header_id)
        self.received_log.append(
            {
                "request_id": parsed.request_id,
                "priority": parsed.priority,
                "cache_salt": parsed.cache_salt,
                "fields": sorted(body),
            }
        )
        if self.faults.hang:
            await asyncio.Event().wait()  # accepted, never answered (until the client gives up)
        now = self.now()
        seq = Sequence(
            request_id=parsed.request_id,
            prompt_tokens=parsed.prompt_tokens,
            max_tokens=parsed.max_tokens,
            block_hashes=block_hashes(parsed.prompt_text, salt=parsed.cache_salt),
            priority=parsed.priority,
            arrival_s=now,
            stop_reason=parsed.finish_reason,
            prompt_tail=partial_block(parsed.prompt_text),
            cache_salt=parsed.cache_salt,
        )
        live = _Live(seq, parsed, now)
        seq.tag = live
        try:
            self.engine.add(seq)
        except ValueError as exc:
            return self._error(BadRequest(str(exc)), parsed.request_id)
        self._live.add(live)
        self._wake.set()
        try:
            if parsed.stream:
                return await self._stream(request, live)
            fail_at = self.faults.fail_after_tokens
            while seq.state != FINISHED:
                await live.event.wait()
                live.event.clear()
                if fail_at is not None and seq.generated >= fail_at and seq.state != FINISHED:
                    failure = BadRequest("simulated engine failure (fault injection)", status=500)
                    return self._error(failure, parsed.request_id)
            usage = usage_block(seq.prompt_tokens, seq.generated, seq.cached_tokens, streaming=False)
            payload = full_response(parsed, int(time.time()), output_text(0, seq.generated), seq.finish_reason, usage)
            return web.json_response(payload, headers={"X-Request-Id": parsed.request_id})
        finally:
            self._live.discard(live)
            if seq.state != FINISHED:  # the client went away (or the handler failed): free the slot now
                self.engine.abort(seq, self.now())
                self._wake.set()

    async def _stream(self, request: web.Request, live: _Live) -> web.StreamResponse:
        parsed, seq = live.parsed, live.seq
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Request-Id": parsed.request_id,
            }
        )
        await response.prepare(request)
        created, emitted = int(time.time()), 0  # one value for every chunk of a response, as vLLM
        template = None
        while True:
            await live.event.wait()
            live.event.clear()
            frames = []
            if parsed.chat and emitted == 0 and seq.generated > 0:
                first = chat_chunk(parsed, created, {"role": "assistant", "content": ""})
                if parsed.continuous_usage:
                    first["usage"] = usage_block(seq.prompt_tokens, 0, seq.cached_tokens, streaming=True)
                frames.append(_sse(first))
            fail_at = self.faults.fail_after_tokens
            if template is None:
                template = _content_template(parsed, created)
            while emitted < seq.generated:
                if fail_at is not None and emitted >= fail_at:
                    # vLLM's mid-stream failure: an error event, then [DONE]; the request is aborted.
                    error = error_body(
                        "simulated engine failure mid-stream (fault injection)", status=500, kind="InternalServerError"
                    )
                    await response.write(b"".join(frames) + _sse(error) + _sse("[DONE]"))
                    await response.write_eof()
                    return response
                last = emitted + 1 == seq.max_tokens
                reason = seq.finish_reason if last else None
                text = output_text(emitted, 1)
                if not last and not parsed.continuous_usage:
                    frames.append(template[0] + text.encode() + template[1])  # the hot path: no JSON encoding
                    emitted += 1
                    continue
                if parsed.chat:
                    chunk = chat_chunk(parsed, created, {"content": text}, reason, final=last)
                else:
                    chunk = completion_chunk(parsed, created, text, reason)
                emitted += 1
                if parsed.continuous_usage:
                    chunk["usage"] = usage_block(seq.prompt_tokens, emitted, seq.cached_tokens, streaming=True)
                frames.append(_sse(chunk))
            if frames:
                await response.write(b"".join(frames))
            if seq.state == FINISHED:
                break
        if parsed.include_usage:
            usage = usage_block(seq.prompt_tokens, seq.generated, seq.cached_tokens, streaming=True)
            await response.write(_sse(usage_chunk(parsed, created, usage)))
        await response.write(_sse("[DONE]"))
        await response.write_eof()
        return response

    async def models(self, request: web.Request) -> web.Response:
        card = {
            "id": self.model,
            "object": "model",
            "created": self.created,
            "owned_by": "vllm",
            "root": self.profile.name,
            "parent": None,
            "max_model_len": self.profile.max_model_len,
            "permission": [
                {
                    "id": f"modelperm-{self.model}",
                    "object": "model_permission",
                    "created": self.created,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }
        return web.json_response({"object": "list", "data": [card]})

    # -- operations --------------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        if self.faults.hang and self.faults.hang_health:
            await asyncio.Event().wait()
        return web.Response(status=503 if self.crashed else 200)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VERSION})

    async def load(self, request: web.Request) -> web.Response:
        return web.json_response({"server_load": len(self._live)})

    async def metrics_view(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.exposition(), headers={"Content-Type": "text/plain; version=0.0.4"})

    async def get_faults(self, request: web.Request) -> web.Response:
        return web.json_response(self.faults.as_dict())

    async def get_received(self, request: web.Request) -> web.Response:
        return web.json_response({"received": list(self.received_log)})

    async def set_faults(self, request: web.Request) -> web.Response:
        try:
            changes = await request.json()
            if not isinstance(changes, dict):
                raise ValueError("expected a JSON object of fault settings")
            self.faults.update(changes)
        except (ValueError, json.JSONDecodeError) as exc:
            return self._error(BadRequest(str(exc)))
        if changes.get("crash_after_s") is not None:
            asyncio.get_running_loop().call_later(float(self.faults.crash_after_s), self.crash)
        return web.json_response(self.faults.as_dict())

    async def crash_view(self, request: web.Request) -> web.Response:
        # Answer first so the caller knows the call arrived, then die.
        asyncio.get_running_loop().call_later(0.05, self.crash)
        return web.json_response({"crashing": True})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        self.engine.kv.reset()
        return web.Response(status=200)


async def serve_forever(server: ReplicaServer, host: str, port: int, *, announce=print) -> None:
    """Run until cancelled (the process entry point): cold-start delay, bind, announce the URL."""
    if server.faults.startup_delay_s:
        await asyncio.sleep(server.faults.startup_delay_s)
    url = await server.start(host, port)
    announce(f"READY {url}")
    try:
        await asyncio.Event().wait()
    finally:
        await server.stop()


class ThreadedReplica:
    """An in-process replica on its own event loop thread (for synchronous tests and clients).

    A simulated crash here closes the listening socket and every connection instead of exiting the process.
    """

    def __init__(self, profile: EngineProfile, **kwargs):
        kwargs.setdefault("on_crash", self._crash)
        self.server = ReplicaServer(profile, **kwargs)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="sim-replica", daemon=True)
        self.url = ""

    def start(self, host: str = "127.0.0.1", port: int = 0) -> ThreadedReplica:
        self._thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self.server.start(host, port), self.loop).result(10)
        return self

    def call(self, fn, *args):
        """Run ``fn(*args)`` on the replica's loop and return its result (to read engine state safely)."""

        async def run():
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def _crash(self) -> None:
        self.loop.create_task(self.server.stop())

    def stop(self) -> None:
        if self._thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
            finally:
                self.loop.call_soon_threadsafe(self.loop.stop)
                self._thread.join(10)
        self.loop.close()

    def __enter__(self) -> ThreadedReplica:
        return self.start() if not self.url else self

    def __exit__(self, *exc) -> None:
        self.stop()
