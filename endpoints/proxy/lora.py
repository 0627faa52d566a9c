"""LoRA adapters on the replicas, as this proxy process knows them (docs/lora-serving.md): which adapters each replica
holds and when each was last used, which requests use them, and the loads and unloads the proxy makes through the
engine's runtime API (``POST /v1/load_lora_adapter``, ``/v1/unload_lora_adapter``; vLLM with
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``).

The router reads ``held()`` and the slots as ``ReplicaView.adapters`` and ``max_loras``; after its pick, a replica
that does not hold the adapter loads it before the request is sent (the wait is in the request's TTFT). One load
per replica and adapter runs at a time, in its own task: every request for it waits on the same future, and a
client that leaves does not abort a load half done. Loads on one replica go one after another, so two adapters
never both count on the last free slot. At the slot limit an idle adapter is unloaded first: the one the endpoint's
router names (``ReplicaAdapters.victim``, bound by the runtime to its router and clock; infercap's is the least
popular, from the router's own request counts, no query), else the least recently used
(``endpoints.routing.lora.choose_victim``, which the simulator's slots ask too). A load that fails or times out is an OpenAI-shaped 502 or 503 for
the requests waiting on it, and the replica is left as it was: nothing stays "loading".

What other proxy processes loaded, and adapters the engine was started with, come from the engine itself: its
``/v1/models`` children every ``lora_sync_s`` (``sync_from_models``) and the adapters that
``vllm:lora_requests_info`` shows running or waiting (``note_active``, from the metrics scrape).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from endpoints.proxy import metrics as m
from endpoints.proxy.errors import ProxyError
from endpoints.routing.lora import VictimChooser, choose_victim, least_recent_to_evict, victim_chooser

log = logging.getLogger(__name__)

LOAD_PATH = "/v1/load_lora_adapter"
UNLOAD_PATH = "/v1/unload_lora_adapter"
MODELS_PATH = "/v1/models"
JSON_HEADERS = {"content-type": "application/json"}
LORA_REPORT_KEY = "infercap:lora:{endpoint_id}"  # one field per proxy process: ``lora_report``
CHURN_MINUTES_KEPT = 10


@dataclass(eq=False)
class ReplicaAdapters:
    """One replica's adapters as this process knows them."""

    last_used: dict[str, float] = field(default_factory=dict)  # loaded adapter → last use (monotonic clock)
    in_use: Counter = field(default_factory=Counter)  # adapter → requests holding a slot on the replica with it
    loading: dict[str, asyncio.Future] = field(default_factory=dict)
    engine_max_loras: int = 0  # vllm:lora_requests_info's max_lora; 0: not reported
    victim: VictimChooser | None = None  # the router's eviction rule for this replica (None: LRU)
    clock: Callable[[], float] = time.monotonic  # the victim's clock (the router's: its popularity decays on it)
    loads: int = 0  # loads and unloads this process made
    unloads: int = 0
    load_minutes: dict[int, int] = field(default_factory=dict)  # wall-clock minute → loads then (the console's churn)
    _lock: asyncio.Lock | None = None

    def note_load(self, now_s: float) -> None:
        """Count one load in its wall-clock minute, keeping the last ``CHURN_MINUTES_KEPT`` minutes."""
        minute = int(now_s // 60)
        self.load_minutes[minute] = self.load_minutes.get(minute, 0) + 1
        for old in [kept for kept in self.load_minutes if kept <= minute - CHURN_MINUTES_KEPT]:
            del self.load_minutes[old]

    def held(self) -> frozenset:
        """What the router counts as held: loaded, or loading now (requests behind the load may follow it)."""
        return frozenset(self.last_used) | frozenset(self.loading)

    def busy(self) -> set[str]:
        return {name for name, n in self.in_use.items() if n > 0}

    def took(self, adapter: str, now: float) -> None:
        self.in_use[adapter] += 1
        if adapter in self.last_used:
            self.last_used[adapter] = now

    def released(self, adapter: str, now: float) -> None:
        self.in_use[adapter] -= 1
        if self.in_use[adapter] <= 0:
            del self.in_use[adapter]
        if adapter in self.last_used:
            self.last_used[adapter] = now

    def can_serve(self, adapter: str, max_loras: int) -> bool:
        """Whether this replica can take a request for ``adapter`` now: it holds it, has a free slot, or holds an
        idle adapter that can be unloaded."""
        if max_loras <= 0:
            return False
        held = self.held()
        return adapter in held or len(held) < max_loras or bool(set(self.last_used) - self.busy())

    def note_active(self, adapters: frozenset, now: float) -> None:
        """Adapters the engine reports running or waiting are loaded there, whoever loaded them."""
        for name in adapters:
            self.last_used[name] = now

    def sync_from_models(self, engine_adapters: set[str]) -> None:
        """The engine's own list (its /v1/models children): adapters loaded elsewhere count from now as the least
        recently used; ones it no longer holds are forgotten unless a request here uses or loads them."""
        for name in engine_adapters - set(self.last_used):
            self.last_used[name] = 0.0
        for name in set(self.last_used) - engine_adapters - self.busy() - set(self.loading):
            del self.last_used[name]

    @property
    def lock(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock


def lora_report(adapters: dict, now_s: float) -> dict:
    """What this process knows of an endpoint's replicas' adapters, for the console (published beside the demand
    report, ``LORA_REPORT_KEY``): per replica id the adapters held (loaded or loading) and the loads per wall-clock
    minute of the last ``CHURN_MINUTES_KEPT`` minutes."""
    return {
        "t": round(now_s, 3),
        "replicas": {
            str(rid): {"held": sorted(ra.held()), "loads": {str(k): n for k, n in sorted(ra.load_minutes.items())}}
            for rid, ra in adapters.items()
        },
    }


def routers_eviction(router_of: Callable[[], object], replica_id: str) -> VictimChooser:
    """The eviction rule of the endpoint's router when the load happens (``router_of()``), or LRU for a router
    without one: what ``ReplicaAdapters.victim`` asks at the slot limit."""

    def choose(last_used, in_use, now: float) -> str:
        rule = victim_chooser(router_of(), replica_id)
        return least_recent_to_evict(last_used, in_use) if rule is None else rule(last_used, in_use, now)

    return choose


def note_engine_lora(adapters: ReplicaAdapters, view, latest, now: float) -> None:
    """What a replica's scraped ``vllm:lora_requests_info`` says (``metrics_scraper.ReplicaMetrics``): its slots, and
    the adapters running or waiting there (loaded, whoever loaded them; what the Gateway API inference extension's
    LoRA filter reads as ``ReplicaView.active_adapters``)."""
    adapters.engine_max_loras = latest.lora_max
    adapters.note_active(latest.lora_active, now)
    view.active_adapters = latest.lora_active


def engine_adapters(models_body: bytes, base_name: str) -> set[str]:
    """The adapters a vLLM ``/v1/models`` answer lists: the cards with a ``parent`` (vLLM names the base model
    there), other than the base model itself."""
    try:
        cards = json.loads(models_body)["data"]
    except (ValueError, KeyError, TypeError):
        return set()
    return {
        card["id"]
        for card in cards
        if isinstance(card, dict)
        and card.get("parent")
        and isinstance(card.get("id"), str)
        and card["id"] != base_name
    }


class AdapterUnavailable(ProxyError):
    pass


def _unavailable(adapter: str, why: str, *, status: int = 503, code: str = "adapter_unavailable", retry=None):
    return AdapterUnavailable(
        status,
        f"The adapter `{adapter}` could not be served: {why}.",
        type="server_error",
        code=code,
        param="model",
        retry_after=retry,
        usage_status="upstream_error",
    )


async def ensure_loaded(
    session: aiohttp.ClientSession,
    *,
    url: str,
    replica: ReplicaAdapters,
    adapter,
    max_loras: int,
    timeout_s: float,
    clock=time.monotonic,
) -> bool:
    """Return once the replica at ``url`` holds ``adapter`` (an ``AdapterInfo``), loading it first if needed;
    True when this call waited for a load. Raises ``AdapterUnavailable`` (OpenAI-shaped) when it cannot."""
    name = adapter.name
    if name in replica.last_used:
        return False
    future = replica.loading.get(name)
    if future is None:
        future = asyncio.get_running_loop().create_future()
        replica.loading[name] = future
        task = asyncio.get_running_loop().create_task(
            _load(session, url=url, replica=replica, adapter=adapter, max_loras=max_loras, timeout_s=timeout_s,
                  clock=clock, future=future)
        )  # fmt: skip
        future.add_done_callback(lambda f: f.exception() if not f.cancelled() else None)  # retrieved: no warning
        task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)
    await asyncio.shield(future)
    return True


async def _load(session, *, url, replica: ReplicaAdapters, adapter, max_loras, timeout_s, clock, future) -> None:
    name = adapter.name
    started = time.perf_counter()
    try:
        async with replica.lock:
            if name not in replica.last_used:
                await asyncio.wait_for(
                    _evict_and_load(session, url=url, replica=replica, adapter=adapter, max_loras=max_loras),
                    timeout_s,
                )
                replica.last_used[name] = clock()
        m.child(m.LORA_LOAD_SECONDS, adapter.endpoint_name).observe(time.perf_counter() - started)
        future.set_result(None)
    except AdapterUnavailable as exc:
        future.set_exception(exc)
    except TimeoutError:
        log.warning("loading adapter %s at %s timed out after %.0f s", name, url, timeout_s)
        future.set_exception(_unavailable(name, f"loading it on a replica took over {timeout_s:g} s", status=502,
                                          code="adapter_load_failed"))  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - every waiter gets an answer, never a replica stuck loading
        log.exception("loading adapter %s at %s failed", name, url)
        future.set_exception(_unavailable(name, f"loading it failed ({type(exc).__name__})", status=502,
                                          code="adapter_load_failed"))  # fmt: skip
    finally:
        replica.loading.pop(name, None)


async def _evict_and_load(session, *, url: str, replica: ReplicaAdapters, adapter, max_loras: int) -> None:
    name = adapter.name
    if not _artifact_present(adapter.path, root=adapter.root):
        raise _unavailable(name, "its weights are missing from the adapter store (tell the operators)")
    try:
        victim = choose_victim(replica.last_used, replica.busy(), max_loras, replica.clock(), replica.victim)
    except LookupError:
        raise _unavailable(
            name, "every adapter slot on the replica is in use; retry shortly", code="adapter_slots_busy", retry=1
        ) from None
    if victim is not None:
        status, body = await _post(session, url + UNLOAD_PATH, {"lora_name": victim})
        if status not in (200, 404):  # 404: the engine no longer held it
            log.warning("unloading adapter %s at %s answered %s: %s", victim, url, status, body[:300])
            raise _unavailable(
                name, "the replica could not free an adapter slot", status=502, code="adapter_load_failed"
            )
        replica.last_used.pop(victim, None)
        replica.unloads += 1
        m.child(m.LORA_UNLOADS, adapter.endpoint_name).inc()
    status, body = await _post(session, url + LOAD_PATH, {"lora_name": name, "lora_path": adapter.path})
    if status == 400 and b"already been loaded" in body:
        return  # another proxy process loaded it first
    if status != 200:
        # The engine's message names the operators' storage path: logged, not shown to the tenant.
        log.warning("loading adapter %s at %s answered %s: %s", name, url, status, body[:500])
        raise _unavailable(name, f"the replica refused to load it (HTTP {status})", status=502,
                           code="adapter_load_failed")  # fmt: skip
    replica.loads += 1
    replica.note_load(time.time())
    m.child(m.LORA_LOADS, adapter.endpoint_name).inc()


def _artifact_present(path: str, *, root: str) -> bool:
    """Whether the artifact is still there, where this process sees the adapter store (the replicas mount it at the
    same path); a proxy host without the store leaves the check to the engine."""
    if not root or not os.path.isdir(root):
        return True
    return os.path.isfile(os.path.join(path, "adapter_config.json"))


async def _post(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[int, bytes]:
    resp = await session.post(
        url, data=json.dumps(body).encode(), headers=JSON_HEADERS, timeout=aiohttp.ClientTimeout(sock_connect=5)
    )
    async with resp:
        return resp.status, await resp.read()


async def read_engine_adapters(session: aiohttp.ClientSession, url: str, base_name: str) -> set[str] | None:
    """The adapters the engine at ``url`` lists, or None when it cannot say now."""
    try:
        resp = await session.get(url + MODELS_PATH, timeout=aiohttp.ClientTimeout(total=2.0))
        async with resp:
            if resp.status != 200:
                return None
            return engine_adapters(await resp.read(), base_name)
    except (TimeoutError, aiohttp.ClientError, OSError):
        return None
