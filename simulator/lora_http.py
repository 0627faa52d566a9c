"""The simulated replica's LoRA endpoints and gauge, as vLLM 0.32 answers them (docs/lora.md#the-simulator).

As read in vLLM 0.32's ``entrypoints/serve/lora/api_router.py`` and ``entrypoints/openai/models/serving.py``
(routes present only with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``, here: when the replica has adapter slots):

* ``POST /v1/load_lora_adapter`` {"lora_name", "lora_path", "load_inplace"?}: 200 with the plain text
  ``Success: LoRA adapter 'NAME' added successfully.``; empty name or path: 400 ``InvalidUserInput`` "Both
  'lora_name' and 'lora_path' must be provided."; the base model's name: 400 "... conflicts with a served base
  model."; already loaded (without ``load_inplace``): 400 "... has already been loaded. ..."; no such directory:
  404 ``NotFoundError`` "Loading lora NAME failed: No adapter found for PATH"; rank (``adapter_config.json``'s
  ``r``) above ``--max-lora-rank``: 500 ``InternalServerError`` "LoRA rank R is greater than max_lora_rank M."
  (vLLM returns any other load failure as a 500). A missing or non-string field is pydantic's 400.
* ``POST /v1/unload_lora_adapter`` {"lora_name"}: 200 ``Success: LoRA adapter 'NAME' removed successfully.``;
  empty: 400 "'lora_name' needs to be provided to unload a LoRA adapter."; unknown: 404 "The lora adapter 'NAME'
  cannot be found.".
* ``vllm:lora_requests_info{max_lora, waiting_lora_adapters, running_lora_adapters}`` = the time of the last
  scheduler step that reported that label set (no ``engine``/``model_name`` labels); lists are comma-joined adapter
  names. Like vLLM's labelled gauge, earlier label sets stay exposed with their last timestamp, so a reader must take
  the newest series (bounded here to the last ``KEPT_LABEL_SETS``).

``GET /admin/lora`` (the simulator's own, like ``/admin/received``; not vLLM's): the last ``KEPT_EVENTS`` loads,
unloads (evictions included) and requests served, each with the adapter's name and its artifact path, so a test can
tell whose weights served a request.

The simulator's one simplification: an adapter holds a slot from its load to its unload, and a load at
``--max-loras`` unloads the least recently used idle adapter first (it leaves ``/v1/models``); vLLM keeps it
registered and reloads it from disk (its CPU cache is ``--max-cpu-loras``, by default ``--max-loras``) on its next
request. Every slot in use: 500, nothing evicted. A load takes the configured load time before it answers.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import OrderedDict, deque

from aiohttp import web
from prometheus_client.core import GaugeMetricFamily

from simulator.adapter_slots import DEFAULT_RANK, AdapterSlots
from simulator.engine import Engine
from simulator.serving import error_response
from simulator.validation import BadRequest, Body, body_not_an_object, invalid_json, strict_str

KEPT_LABEL_SETS = 32
KEPT_EVENTS = 2000


def adapter_rank(path: str) -> int:
    """The rank ``r`` of a PEFT adapter directory's ``adapter_config.json`` (``DEFAULT_RANK`` without one)."""
    try:
        with open(os.path.join(path, "adapter_config.json")) as config:
            return int(json.load(config).get("r", DEFAULT_RANK))
    except (OSError, ValueError, TypeError, AttributeError):
        return DEFAULT_RANK


def _invalid(message: str, status: int = 400, kind: str = "InvalidUserInput") -> web.Response:
    return error_response(BadRequest(message, status=status, kind=kind))


async def _fields(request: web.Request, names: tuple[str, ...]) -> dict:
    raw = await request.read()
    if not raw.strip():
        raise body_not_an_object(None)
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise invalid_json(getattr(exc, "msg", "Invalid UTF-8"), getattr(exc, "pos", 0)) from None
    if not isinstance(body, dict):
        raise body_not_an_object(body)
    fields = Body(body)
    for name in names:
        if name not in body:
            fields.format.add("missing", f"body.{name}", "Field required", body)
    values = {name: fields._get(name, strict_str, None) for name in names}
    values["load_inplace"] = fields.bool("load_inplace", False)
    fields.check()
    return values


class LoraEndpoints:
    """``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` over a replica's ``AdapterSlots``."""

    def __init__(self, server, slots: AdapterSlots, *, max_lora_rank: int, load_s: float):
        self.server, self.slots = server, slots
        self.max_lora_rank, self.load_s = max_lora_rank, load_s
        self.ranks: dict[str, int] = {}
        self.events: deque = deque(maxlen=KEPT_EVENTS)
        self._loading_path = ""  # the path of the load under way (a load event is told before the path is kept)
        slots.on_event = self._event

    def _event(self, kind: str, name: str) -> None:
        path = self._loading_path if kind == "load" else self.slots.paths.get(name, "")
        self.events.append({"event": kind, "adapter": name, "path": path})

    def attach(self, app: web.Application) -> None:
        app.router.add_post("/v1/load_lora_adapter", self.load)
        app.router.add_post("/v1/unload_lora_adapter", self.unload)
        app.router.add_get("/admin/lora", self.admin_log)

    async def admin_log(self, request: web.Request) -> web.Response:
        return web.json_response({"events": list(self.events), "held": sorted(self.slots.held())})

    async def load(self, request: web.Request) -> web.Response:
        try:
            body = await _fields(request, ("lora_name", "lora_path"))
        except BadRequest as exc:
            return error_response(exc)
        name, path = body["lora_name"], body["lora_path"]
        if not name or not path:
            return _invalid("Both 'lora_name' and 'lora_path' must be provided.")
        if name == self.server.model:
            return _invalid(f"The lora adapter '{name}' conflicts with a served base model.")
        if self.slots.holds(name) and not body["load_inplace"]:
            return _invalid(
                f"The lora adapter '{name}' has already been loaded. If you want to load the adapter in place, "
                "set 'load_inplace' to True."
            )
        if not os.path.isdir(path):
            return _invalid(f"Loading lora {name} failed: No adapter found for {path}", 404, "NotFoundError")
        rank = adapter_rank(path)
        if rank > self.max_lora_rank:
            message = f"LoRA rank {rank} is greater than max_lora_rank {self.max_lora_rank}."
            return _invalid(message, 500, "InternalServerError")
        if not self.slots.holds(name):
            self._loading_path = path
            try:
                self.slots.load(name, self.server.now(), 0.0)
            except LookupError as exc:
                return _invalid(str(exc), 500, "InternalServerError")
            finally:
                self._loading_path = ""
        self.slots.paths[name], self.ranks[name] = path, rank
        if self.load_s > 0:
            await asyncio.sleep(self.load_s / self.server.speed)
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def unload(self, request: web.Request) -> web.Response:
        try:
            body = await _fields(request, ("lora_name",))
        except BadRequest as exc:
            return error_response(exc)
        name = body["lora_name"]
        if not name:
            return _invalid("'lora_name' needs to be provided to unload a LoRA adapter.")
        if not self.slots.holds(name):
            return _invalid(f"The lora adapter '{name}' cannot be found.", 404, "NotFoundError")
        try:
            self.slots.unload(name)
        except RuntimeError as exc:  # requests use it: vLLM would let them fail; the simulator refuses
            return _invalid(str(exc), 400, "BadRequestError")
        self.ranks.pop(name, None)
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

    def cards(self, base_model: str, created: int, permission) -> list[dict]:
        """``/v1/models`` entries of the loaded adapters: ``root`` the path, ``parent`` the base model."""
        return [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": self.slots.paths.get(name, name),
                "parent": base_model,
                "max_model_len": None,
                "permission": [permission()],
            }
            for name in sorted(self.slots.held())
        ]


class LoraInfoCollector:
    """``vllm:lora_requests_info``: which adapters the engine's running and waiting requests use (vLLM's labelled
    gauge, set to the current time at every step; earlier label sets stay with their last value)."""

    def __init__(self, engine: Engine, max_loras: int):
        self.engine, self.max_loras = engine, max_loras
        self.seen: OrderedDict[tuple[str, str], float] = OrderedDict()

    def current(self) -> tuple[str, str]:
        engine = self.engine
        running = {s.adapter for s in (*engine.running, *engine.prefilling) if s.adapter}
        waiting = {item[2].adapter for item in engine._waiting if item[2].adapter}
        return ",".join(sorted(waiting)), ",".join(sorted(running))

    def collect(self):
        key = self.current()
        self.seen[key] = time.time()
        self.seen.move_to_end(key)
        while len(self.seen) > KEPT_LABEL_SETS:
            self.seen.popitem(last=False)
        family = GaugeMetricFamily(
            "vllm:lora_requests_info",
            "Running stats on lora requests.",
            labels=["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
        )
        for (waiting, running), at in self.seen.items():
            family.add_metric([str(self.max_loras), waiting, running], at)
        yield family
