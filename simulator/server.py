"""The simulated replica: an aiohttp server speaking vLLM 0.32's OpenAI-compatible HTTP API, backed by ``engine``.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions`` (stream and not, ``n`` choices, stop strings,
logprobs; ``serving``), ``GET /v1/models``, ``/health``, ``/ping``, ``/version``, ``/load``, ``/metrics``; admin:
``GET|POST /admin/faults`` (JSON settings of ``faults.Faults``), ``POST /admin/crash``, ``POST /reset_prefix_cache``,
``GET /admin/received`` (the engine-facing fields of the last requests, as a router or proxy sent them); with
``max_loras`` (``--max-loras``) also ``POST /v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` and adapters
served under their names (``lora_http``, docs/lora.md). Every
response carries ``X-Request-Id`` (the client's, else a fresh one), an unknown route is ``{"detail": "Not Found"}``
and a wrong method ``{"detail": "Method Not Allowed"}``, as vLLM's FastAPI answers.

The engine runs in real time scaled by ``speed``: a modeled 20 ms step takes 2 ms of wall time at speed 10.
Everything the replica reports (usage, ``/metrics`` latencies) is in simulated seconds. A client that
disconnects aborts its request (blocks freed, ``finished_reason="abort"`` counted), streaming or not.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import threading
import time
import uuid
from collections import deque

import aiohttp
from aiohttp import web

from capacity.hardware.profiles import EngineProfile
from simulator.adapter_slots import AdapterSlots
from simulator.embeddings import embeddings as serve_embeddings
from simulator.engine import FINISHED, Engine
from simulator.faults import Faults
from simulator.kv_transfer import (
    LEASE_S,
    KVConnector,
    KVLoadError,
    KVTransferConfig,
    Link,
    remote_decode,
    remote_prefill,
)
from simulator.lora_http import LoraEndpoints, LoraInfoCollector
from simulator.metrics import ReplicaMetrics
from simulator.protocol import VLLM_VERSION, parse_request, tokenize_text
from simulator.responses import system_fingerprint
from simulator.serving import Choice, Exchange, build_exchange, error_response, full_body, json_response, stream
from simulator.tokens import CHARS_PER_TOKEN, count_tokens
from simulator.validation import BadRequest, body_not_an_object, invalid_json

logger = logging.getLogger(__name__)
VERSION = VLLM_VERSION
CRASH_EXIT_CODE = 75
STEP_CATCH_UP_S = 1.0  # wall seconds a late engine may catch up on (CPU starvation on a shared machine)
RECEIVED_KEPT = 256


@web.middleware
async def _fastapi_errors(request: web.Request, handler):
    """Unknown routes and methods answer as FastAPI does: JSON ``{"detail": …}``."""
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return json_response({"detail": "Not Found"}, status=404)
    except web.HTTPMethodNotAllowed:
        return json_response({"detail": "Method Not Allowed"}, status=405)


async def _request_id_header(request: web.Request, response: web.StreamResponse) -> None:
    # vLLM's --enable-request-id-headers: the client's id back, else a fresh one, on every response.
    if "X-Request-Id" not in response.headers:
        response.headers["X-Request-Id"] = request.headers.get("X-Request-Id") or uuid.uuid4().hex


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
        max_loras: int = 0,
        max_lora_rank: int = 16,
        lora_load_s: float = 0.0,
        lora_overhead: float = 0.1,
        kv_transfer: KVTransferConfig | None = None,
        kv_link_gbps: float = 0.0,
        kv_bytes_per_token: float = 0.0,
        runner: str = "generate",
    ):
        if speed <= 0:
            raise ValueError("speed must be positive")
        if runner not in ("generate", "pooling"):  # vLLM's --runner: completions or embeddings (embeddings.py)
            raise ValueError("runner must be generate or pooling")
        self.runner = runner
        self.profile = profile
        self.speed = speed
        self.model = served_model_name or profile.model_name
        self.scheduling_policy = scheduling_policy
        self.engine = Engine(profile, scheduling_policy=scheduling_policy)
        self.metrics = ReplicaMetrics(self.engine, self.model)
        self.slots = AdapterSlots(max_loras) if max_loras > 0 else None
        self.lora = None
        if self.slots is not None:
            self.lora = LoraEndpoints(self, self.slots, max_lora_rank=max_lora_rank, load_s=lora_load_s)
            self.engine.lora_overhead = lora_overhead
            self.metrics.registry.register(LoraInfoCollector(self.engine, max_loras))
        self.faults = faults or Faults()
        # vLLM's --kv-transfer-config (kv_transfer.py, docs/disaggregation.md)
        self.kv_connector = None
        if kv_transfer is not None:
            self.kv_connector = KVConnector(kv_transfer, block_size=profile.block_size, vocab_size=profile.vocab_size)
        # The link the KV crosses (kv_transfer.Link): none, the transfer takes no time.
        self.kv_link = Link(kv_link_gbps, clock=self.now, speed=speed) if kv_link_gbps > 0 else None
        self.kv_bytes_per_token = kv_bytes_per_token
        self._leased: dict[str, int] = {}  # NIXL prefills' blocks held for a pull (request id -> blocks)
        self.on_crash = on_crash or (lambda: os._exit(CRASH_EXIT_CODE))
        self.created = int(time.time())
        self.received = 0
        # What the engine was asked for, per accepted request: lets tests check what a proxy forwards.
        self.received_log: deque[dict] = deque(maxlen=RECEIVED_KEPT)
        self.crashed = False
        # vLLM hashes its whole configuration into the fingerprint; the profile and served name define this one.
        self.fingerprint = system_fingerprint(sorted(profile.as_dict().items()), self.model, scheduling_policy)
        self._live: set[Exchange] = set()
        self._runner: web.AppRunner | None = None
        self._engine_task: asyncio.Task | None = None
        self._t0 = 0.0
        self.url = ""

    # -- lifecycle ---------------------------------------------------------------------------------
    def now(self) -> float:
        return (asyncio.get_running_loop().time() - self._t0) * self.speed

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[_fastapi_errors])
        app.on_response_prepare.append(_request_id_header)
        if self.runner == "pooling":
            app.router.add_post("/v1/embeddings", functools.partial(serve_embeddings, self))
        else:
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
        app.router.add_post("/tokenize", self.tokenize)
        if self.lora is not None:
            self.lora.attach(app)
        if self.kv_connector is not None and not self.kv_connector.shared_storage:
            app.router.add_post("/kv_transfer/pull", self.kv_pull)
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
                choice: Choice | None = seq.tag
                if choice is None or seq.generated == 0:
                    continue
                if seq.generated == 1:
                    if self.kv_connector is not None and self.kv_connector.shared_storage:
                        self.kv_connector.store(choice.prompt, choice.request.parsed.cache_salt)  # KV computed
                    choice.first_token_s = now
                    arrival = choice.request.arrival_s
                    self.metrics.ttft.observe(now - arrival)
                    self.metrics.queue.observe(max(0.0, (seq.scheduled_s or now) - arrival))
                    self.metrics.prefill.observe(max(0.0, now - (seq.scheduled_s or now)))
                else:
                    self.metrics.itl.observe(now - choice.last_token_s)
                choice.last_token_s = now
                choice.request.event.set()
            for seq in finished:
                self._observe_finished(seq.tag, now)

    def _observe_finished(self, choice: Choice, now: float) -> None:
        """A choice's request-level series (vLLM observes each child of an ``n > 1`` request)."""
        seq, m, exchange = choice.seq, self.metrics, choice.request
        first = choice.first_token_s if choice.first_token_s is not None else now
        decode = max(0.0, now - first)
        m.e2e.observe(now - exchange.arrival_s)
        m.decode.observe(decode)
        m.inference.observe(max(0.0, now - (seq.scheduled_s or now)))
        m.prompt_tokens.observe(seq.prompt_tokens)
        m.generation_tokens.observe(seq.generated)
        m.prefill_kv_computed.observe(seq.prompt_tokens - seq.cached_tokens)
        m.num_preemptions.observe(seq.preemptions)
        if exchange.parsed.max_tokens_param is not None:
            m.max_tokens.observe(exchange.parsed.max_tokens_param)
        if seq.generated > 1:
            m.tpot.observe(decode / (seq.generated - 1))
        exchange.done += 1
        if exchange.done == len(exchange.choices):  # once per request, as vLLM's parent request
            m.params_n.observe(exchange.parsed.n)
            m.max_generation_tokens.observe(max(c.seq.generated for c in exchange.choices))

    # -- OpenAI endpoints --------------------------------------------------------------------------
    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    def log_received(self, parsed, body: dict) -> None:
        fields = {"request_id": parsed.request_id, "priority": parsed.priority, "cache_salt": parsed.cache_salt}
        self.received_log.append({**fields, "fields": sorted(body)})

    async def _read_body(self, request: web.Request):
        raw = await request.read()
        if not raw.strip():
            raise body_not_an_object(None)
        try:
            return json.loads(raw)
        except UnicodeDecodeError:
            raise invalid_json("Invalid UTF-8", 0) from None
        except json.JSONDecodeError as exc:
            raise invalid_json(exc.msg, exc.pos) from None

    async def _serve(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        self.received += 1
        if self.faults.crash_after_requests is not None and self.received >= self.faults.crash_after_requests:
            self.crash()
        if self.faults.should_error():
            status = int(self.faults.error_status)
            kind = "ServiceUnavailableError" if status == 503 else "InternalServerError"
            return error_response(BadRequest("simulated engine error (fault injection)", status=status, kind=kind))
        try:
            body = await self._read_body(request)
            parsed = parse_request(
                body,
                chat=chat,
                served_model=self.model,
                max_model_len=self.profile.max_model_len,
                scheduling_policy=self.scheduling_policy,
                header_request_id=request.headers.get("X-Request-Id"),
                vocab_size=self.profile.vocab_size,
                adapters=self.slots.held() if self.slots is not None else (),
            )
        except BadRequest as exc:
            return error_response(exc)
        self.log_received(parsed, body)
        if self.faults.hang:
            await asyncio.Event().wait()  # accepted, never answered (until the client gives up)
        exchange = build_exchange(parsed, self.profile, self.now())
        transfer = body.get("kv_transfer_params") if self.kv_connector is not None else None
        if self.kv_connector is not None and (failed := await self._kv_offers(exchange, transfer)):
            return failed
        adapter = parsed.model if parsed.model != self.model else None
        if adapter is not None:
            self._use_adapter(exchange, adapter)
        added = []
        try:
            for choice in exchange.choices:
                added.append(self.engine.add(choice.seq))
        except ValueError as exc:
            for seq in added:
                self.engine.abort(seq, self.now())
            self._release_adapter(adapter)
            return error_response(BadRequest(str(exc)))
        self._live.add(exchange)
        self._wake.set()
        try:
            if parsed.stream:
                return await stream(
                    request,
                    exchange,
                    fingerprint=self.fingerprint,
                    fail_after_tokens=self.faults.fail_after_tokens,
                    reset_after_tokens=self.faults.reset_after_tokens,
                )
            fail_at = self.faults.fail_after_tokens
            while not exchange.finished:
                await exchange.event.wait()
                exchange.event.clear()
                if fail_at is not None and any(c.seq.generated >= fail_at for c in exchange.choices):
                    return error_response(BadRequest("simulated engine failure (fault injection)", status=500))
            return json_response(self._whole_answer(exchange, transfer))
        finally:
            self._live.discard(exchange)
            aborted = [c.seq for c in exchange.choices if c.seq.state != FINISHED]
            for seq in aborted:  # the client went away (or the handler failed): free the slots now
                self.engine.abort(seq, self.now())
            if aborted:
                self._wake.set()
            self._release_adapter(adapter)

    def _whole_answer(self, exchange: Exchange, transfer) -> dict:
        """A non-streamed answer; a NIXL prefill for another replica names its blocks (``kv_transfer_params``)."""
        answer = full_body(exchange, int(time.time()), self.fingerprint)
        if self.kv_connector is not None and not self.kv_connector.shared_storage and remote_decode(transfer):
            host, port = self.url.rsplit(":", 1)
            parsed = exchange.parsed
            params = self.kv_connector.prefill_params(
                parsed.request_id, parsed.prompt_tokens, host.split("//", 1)[-1], int(port)
            )
            answer["kv_transfer_params"] = params
            self._hold_lease(parsed.request_id, parsed.prompt_tokens)
        return answer

    def _hold_lease(self, request_id: str, tokens: int) -> None:
        """A NIXL prefill keeps its prompt's blocks until the decode replica pulls them or the lease ends (vLLM's
        delayed free): they count in this replica's KV usage meanwhile."""
        kv = self.engine.kv
        blocks = min(-(-tokens // self.profile.block_size), kv.free_blocks)
        if blocks > 0:
            kv.grow(blocks)
            self._leased[request_id] = blocks
            asyncio.get_running_loop().call_later(LEASE_S / self.speed, self._free_lease, request_id)

    def _free_lease(self, request_id: str) -> None:
        if blocks := self._leased.pop(request_id, 0):
            self.engine.kv.release([], blocks)
            self._wake.set()

    async def _kv_offers(self, exchange: Exchange, transfer) -> web.Response | None:
        """What the connector loads for each choice (``Sequence.external_tokens``); an error response when a NIXL
        pull fails under ``kv_load_failure_policy: fail``."""
        connector = self.kv_connector
        if connector.shared_storage:
            offers: dict[int, int] = {}
            for choice in exchange.choices:
                key = id(choice.prompt)
                if key not in offers:
                    try:
                        offers[key] = connector.offer(choice.prompt, exchange.parsed.cache_salt)
                    except KVLoadError as exc:  # as the engine: the worker raises, the engine core exits
                        logger.error("EngineCore encountered a fatal error: %s", exc)
                        asyncio.get_running_loop().call_later(0.05, self.crash)  # after this answer
                        message = "EngineCore encountered an issue. See stack trace (above) for the root cause."
                        return error_response(BadRequest(message, status=500, kind="InternalServerError"))
                choice.seq.external_tokens = offers[key]
            await self._kv_cross(sum(offers.values()))  # read from the shared directory
            return None
        tokens = 0
        if (pull := remote_prefill(transfer)) is not None:
            tokens = await self._pull(pull)
            if tokens is None:
                connector.pulls_failed += 1
                if connector.config.load_failure_policy == "fail":
                    message = f"KV transfer from {pull['remote_host']}:{pull['remote_port']} failed"
                    return error_response(BadRequest(message, status=500, kind="InternalServerError"))
                tokens = 0
        for choice in exchange.choices:
            choice.seq.external_tokens = tokens
        return None

    async def _pull(self, params: dict) -> int | None:
        """Pull a NIXL prefill's blocks from the replica that holds them: their tokens, None when that failed."""
        url = f"http://{params['remote_host']}:{params['remote_port']}/kv_transfer/pull"
        try:
            timeout = aiohttp.ClientTimeout(total=5.0)
            async with aiohttp.ClientSession(timeout=timeout) as session:
                async with session.post(url, json={"request_id": params["remote_request_id"]}) as response:
                    if response.status != 200:
                        return None
                    return int((await response.json())["tokens"])
        except (TimeoutError, aiohttp.ClientError, ValueError, KeyError, TypeError):
            return None

    async def kv_pull(self, request: web.Request) -> web.Response:
        """The NIXL side channel: a decode replica takes a finished prefill's blocks (404 once gone or expired)."""
        try:
            body = await request.json()
            tokens = self.kv_connector.release(str(body["request_id"]))
        except (ValueError, KeyError, TypeError):
            return json_response({"detail": 'expected {"request_id": ...}'}, status=400)
        if tokens is None:
            return json_response({"detail": "no KV held for that request"}, status=404)
        await self._kv_cross(tokens)  # over this replica's link
        self._free_lease(str(body["request_id"]))  # sent: the blocks are free
        return json_response({"tokens": tokens})

    async def _kv_cross(self, tokens: int) -> None:
        if self.kv_link is not None and tokens > 0:
            await self.kv_link.transfer(tokens * self.kv_bytes_per_token)

    def _use_adapter(self, exchange: Exchange, adapter: str) -> None:
        """The request runs with ``adapter``: its sequences carry the rank (step overhead); it is in use (no LRU
        unload) until the request ends."""
        rank = self.lora.ranks.get(adapter, 0)
        for choice in exchange.choices:
            choice.seq.adapter, choice.seq.lora_rank = adapter, rank
        self.slots.acquire(adapter, self.now(), 0.0)

    def _release_adapter(self, adapter: str | None) -> None:
        if adapter is not None and self.slots is not None:
            self.slots.release(adapter, self.now())

    async def tokenize(self, request: web.Request) -> web.Response:
        """vLLM's ``POST /tokenize``: a chat (``messages``, rendered by the chat template) or a completion prompt
        (a string), counted by the simulator's tokenizer as its completions count them."""
        try:
            body = await self._read_body(request)
            if not isinstance(body, dict):
                raise body_not_an_object(body)
            text = tokenize_text(body)
        except BadRequest as exc:
            return error_response(exc)
        count = count_tokens(text)
        ids = [ord(ch) % self.profile.vocab_size for ch in text[::CHARS_PER_TOKEN]][:count]
        return json_response(
            {"count": count, "max_model_len": self.profile.max_model_len, "tokens": ids, "token_strs": None}
        )

    async def models(self, request: web.Request) -> web.Response:
        created = int(time.time())
        card = {
            "id": self.model,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": self.profile.model_path or self.model,
            "parent": None,
            "max_model_len": self.profile.max_model_len,
            "permission": [
                {
                    "id": f"modelperm-{uuid.uuid4().int & (2**64 - 1):016x}",
                    "object": "model_permission",
                    "created": created,
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
        perm = card["permission"][0]
        fresh = lambda: {**perm, "id": f"modelperm-{uuid.uuid4().int & (2**64 - 1):016x}"}  # noqa: E731
        adapters = self.lora.cards(self.model, created, fresh) if self.lora else []
        return json_response({"object": "list", "data": [card, *adapters]})

    # -- operations --------------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        if self.faults.hang and self.faults.hang_health:
            await asyncio.Event().wait()
        return web.Response(status=503 if self.crashed else 200)

    async def version(self, request: web.Request) -> web.Response:
        return json_response({"version": VERSION})

    async def load(self, request: web.Request) -> web.Response:
        return json_response({"server_load": len(self._live)})

    async def metrics_view(self, request: web.Request) -> web.Response:
        headers = {"Content-Type": "text/plain; version=1.0.0; charset=utf-8"}
        return web.Response(body=self.metrics.exposition(), headers=headers)

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
            return error_response(BadRequest(str(exc)))
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
