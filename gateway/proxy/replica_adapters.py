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
(``gateway.routing.adapter_eviction.choose_victim``, which the simulator's slots ask too). A load that fails or times out is an OpenAI-shaped 502 or 503 for
the requests waiting on it, and the replica is left as it was: nothing stays "loading".

What other proxy processes loaded, and adapters the engine was started with, come from the engine itself: its
``/v1/models`` children every ``lora_sync_s`` (``sync_from_models``) and the adapters that
``vllm:lora_requests_info`` shows running or waiting (``note_active``, from the metrics scrape).

Adapters are held under their engine names (``lora_artifacts.engine_name``), never their public names. An adapter
with requests in flight or queued for it (``protected``) is never unloaded, and one tenant's private adapters hold
at most ``tenant_slots`` of a replica's slots (``tenant_slot_quota``): past it, the tenant's next adapter can only
take the slot of one of its own idle adapters, so it cannot evict other tenants' (docs/lora-serving.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import aiohttp

from capacity.runtimes.lora_artifacts import engine_name_owner
from gateway.proxy import metrics as m
from gateway.proxy.errors import ProxyError
from gateway.routing.adapter_eviction import VictimChooser, choose_victim, least_recent_to_evict, victim_chooser

log = logging.getLogger(__name__)

LOAD_PATH = "/v1/load_lora_adapter"
UNLOAD_PATH = "/v1/unload_lora_adapter"
MODELS_PATH = "/v1/models"
JSON_HEADERS = {"content-type": "application/json"}
LORA_REPORT_KEY = "infercap:lora:{endpoint_id}"  # one field per proxy process: ``lora_report``
CHURN_MINUTES_KEPT = 10
SCRAPE_SLACK_S = 1.0  # a scrape is stamped when it ends; what it reports may be this much older


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
    # Adapters that requests queued at the endpoint name (their engine names): never unloaded while they wait.
    queued: Callable[[], Collection[str]] = frozenset
    changed_at: float = float("-inf")  # this process's last load or unload here (``clock``)
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

    def protected(self) -> set[str]:
        """Adapters that must stay: requests run with them here, or wait in the endpoint's queue for them."""
        return self.busy() | set(self.queued())

    def tenant_held(self, tenant_id: int) -> set[str]:
        """The adapters held here (loaded or loading) that are this tenant's private ones."""
        return {name for name in self.held() if engine_name_owner(name) == (True, tenant_id)}

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

    def can_serve(self, adapter: str, max_loras: int, tenant_slots: int = 0) -> bool:
        """Whether this replica can take a request for ``adapter`` now: it holds it, or it may load it (a free slot
        or an unprotected idle adapter it may unload, within the owner's ``tenant_slots``)."""
        if max_loras <= 0:
            return False
        held = self.held()
        if adapter in held:
            return True
        candidates = self.evictable(adapter, tenant_slots)
        if candidates is None:
            return len(held) < max_loras or bool(set(self.last_used) - self.protected())
        return bool(set(candidates) - self.protected())

    def fits_within_quota(self, adapter: str, tenant_slots: int) -> bool:
        """Whether a request for ``adapter`` runs here without its tenant's quota making it unload one of the
        tenant's own adapters: it holds the adapter, or the tenant holds fewer than its slots here."""
        return adapter in self.held() or self.evictable(adapter, tenant_slots) is None

    def evictable(self, adapter: str, tenant_slots: int) -> dict[str, float] | None:
        """When ``adapter``'s tenant already holds its ``tenant_slots`` here, the only adapters its load may
        unload: that tenant's own (loaded ones, with their last use); None when no quota binds."""
        _, owner = engine_name_owner(adapter)
        if tenant_slots <= 0 or owner is None or len(self.tenant_held(owner) - {adapter}) < tenant_slots:
            return None
        return {name: t for name, t in self.last_used.items() if engine_name_owner(name) == (True, owner)}

    def note_active(self, adapters: frozenset, now: float, observed_at: float = float("inf")) -> None:
        """Adapters the engine reports running or waiting (as of ``observed_at``) are loaded there, whoever loaded
        them; a report older than this process's last load or unload here adds none (it would bring back one just
        unloaded, and a load counted into a slot the engine has not got makes the engine evict on its own)."""
        for name in adapters:
            if name in self.last_used or observed_at - SCRAPE_SLACK_S > self.changed_at:
                self.last_used[name] = now

    def sync_from_models(self, engine_adapters: set[str], read_since: float = float("inf")) -> None:
        """The engine's own list (its /v1/models children), read from ``read_since`` on: adapters loaded elsewhere
        count from now as the least recently used; ones it no longer holds are forgotten unless a request here uses
        or loads them. A list this process loaded or unloaded something during is ignored: it would bring back an
        adapter just unloaded, or forget one just loaded, and a wrong count makes a load into a full engine."""
        if self.changed_at >= read_since:
            return
        for name in engine_adapters - set(self.last_used):
            self.last_used[name] = 0.0
        for name in set(self.last_used) - engine_adapters - self.busy() - set(self.loading):
            del self.last_used[name]

    @property
    def lock(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock


def lora_report(adapters: dict, now_s: float, public_names: dict[str, str] | None = None) -> dict:
    """What this process knows of an endpoint's replicas' adapters, for the console (published beside the demand
    report, ``LORA_REPORT_KEY``): per replica id the adapters held (loaded or loading; by public name where
    ``public_names`` maps the engine name) and the loads per wall-clock minute of the last ``CHURN_MINUTES_KEPT``
    minutes."""
    names = public_names or {}
    return {
        "t": round(now_s, 3),
        "replicas": {
            str(rid): {
                "held": sorted(names.get(n, n) for n in ra.held()),
                "loads": {str(k): n for k, n in sorted(ra.load_minutes.items())},
            }
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
    adapters.note_active(latest.lora_active, now, latest.scraped_at)
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
    tenant_slots: int = 0,
) -> float | None:
    """Return once the replica at ``url`` holds ``adapter`` (an ``AdapterInfo``, held under its engine name),
    loading it first if needed. Returns None when it was held, else the seconds of the load when this call started
    it (the request that caused a load pays for it: ``load_mu``), 0.0 when it waited on another's. Raises
    ``AdapterUnavailable`` (OpenAI-shaped) when it cannot."""
    name = adapter.engine_name
    if name in replica.last_used:
        return None
    future = replica.loading.get(name)
    if future is not None:
        await asyncio.shield(future)
        return 0.0
    future = asyncio.get_running_loop().create_future()
    replica.loading[name] = future
    task = asyncio.get_running_loop().create_task(
        _load(session, url=url, replica=replica, adapter=adapter, max_loras=max_loras, timeout_s=timeout_s,
              clock=clock, future=future, tenant_slots=tenant_slots)
    )  # fmt: skip
    future.add_done_callback(lambda f: f.exception() if not f.cancelled() else None)  # retrieved: no warning
    task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)
    return await asyncio.shield(future)


def load_mu(load_s: float | None, *, mu_per_s: float, min_mu: float) -> float:
    """What a load costs the request that caused it: the replica's MU capacity over the load's time (vLLM applies
    a load in its engine loop, between steps), at least ``min_mu``; 0 for a request that loaded nothing."""
    if not load_s or load_s <= 0:
        return 0.0
    return max(min_mu, load_s * mu_per_s)


async def _load(session, *, url, replica: ReplicaAdapters, adapter, max_loras, timeout_s, clock, future,
                tenant_slots) -> None:  # fmt: skip
    name = adapter.engine_name
    started = time.perf_counter()
    try:
        async with replica.lock:
            if name not in replica.last_used:
                await asyncio.wait_for(
                    _evict_and_load(session, url=url, replica=replica, adapter=adapter, max_loras=max_loras,
                                    tenant_slots=tenant_slots),
                    timeout_s,
                )  # fmt: skip
                replica.last_used[name] = replica.changed_at = clock()
        took_s = time.perf_counter() - started
        m.child(m.LORA_LOAD_SECONDS, adapter.endpoint_name).observe(took_s)
        future.set_result(max(took_s, 1e-6))
    except AdapterUnavailable as exc:
        future.set_exception(exc)
    except TimeoutError:
        log.warning("loading adapter %s at %s timed out after %.0f s", name, url, timeout_s)
        future.set_exception(_unavailable(adapter.name, f"loading it on a replica took over {timeout_s:g} s",
                                          status=502, code="adapter_load_failed"))  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - every waiter gets an answer, never a replica stuck loading
        log.exception("loading adapter %s at %s failed", name, url)
        future.set_exception(_unavailable(adapter.name, f"loading it failed ({type(exc).__name__})", status=502,
                                          code="adapter_load_failed"))  # fmt: skip
    finally:
        replica.loading.pop(name, None)


def _victim(replica: ReplicaAdapters, adapter, max_loras: int, tenant_slots: int) -> str | None:
    """The adapter to unload first (None: a slot is free). Never one in use or queued for; within the tenant's
    quota, only one of its own. ``AdapterUnavailable`` 503 with Retry-After when none may leave."""
    protected = replica.protected() - {adapter.engine_name}
    own = replica.evictable(adapter.engine_name, tenant_slots)
    try:
        if own is not None:
            if not own:
                raise LookupError("every slot the tenant may hold is loading")
            if replica.victim is not None:
                return replica.victim(own, protected, replica.clock())
            return least_recent_to_evict(own, protected)
        return choose_victim(replica.last_used, protected, max_loras, replica.clock(), replica.victim)
    except LookupError:
        raise _unavailable(
            adapter.name, "every adapter slot it may use on the replica is in use; retry shortly",
            code="adapter_slots_busy", retry=1,
        ) from None  # fmt: skip


async def _evict_and_load(session, *, url: str, replica: ReplicaAdapters, adapter, max_loras: int,
                          tenant_slots: int = 0) -> None:  # fmt: skip
    name = adapter.engine_name
    if not _artifact_present(adapter.path, root=adapter.root):
        raise _unavailable(adapter.name, "its weights are missing from the adapter store (tell the operators)")
    victim = _victim(replica, adapter, max_loras, tenant_slots)
    if victim is not None and not await unload(
        session, url=url, replica=replica, engine_name=victim, endpoint_name=adapter.endpoint_name
    ):
        raise _unavailable(
            adapter.name, "the replica could not free an adapter slot", status=502, code="adapter_load_failed"
        )
    status, body = await _post(session, url + LOAD_PATH, {"lora_name": name, "lora_path": adapter.path})
    if status == 400 and b"already been loaded" in body:
        return  # another proxy process loaded it first
    if status != 200:
        # The engine's message names the operators' storage path: logged, not shown to the tenant.
        log.warning("loading adapter %s at %s answered %s: %s", name, url, status, body[:500])
        raise _unavailable(adapter.name, f"the replica refused to load it (HTTP {status})", status=502,
                           code="adapter_load_failed")  # fmt: skip
    replica.loads += 1
    replica.note_load(time.time())
    m.child(m.LORA_LOADS, adapter.endpoint_name).inc()


async def unload(session, *, url: str, replica: ReplicaAdapters, engine_name: str, endpoint_name: str) -> bool:
    """Unload ``engine_name`` from the replica (an eviction, or an adapter no longer served: deleted, or its
    artifact changed); False when the engine refuses."""
    status, body = await _post(session, url + UNLOAD_PATH, {"lora_name": engine_name})
    if status not in (200, 404):  # 404: the engine no longer held it
        log.warning("unloading adapter %s at %s answered %s: %s", engine_name, url, status, body[:300])
        return False
    replica.last_used.pop(engine_name, None)
    replica.changed_at = replica.clock()
    replica.unloads += 1
    m.child(m.LORA_UNLOADS, endpoint_name).inc()
    return True


async def unload_stale(session, *, url: str, replica: ReplicaAdapters, current: Collection[str],
                       endpoint_name: str) -> list[str]:  # fmt: skip
    """Unload what the replica holds under a name no adapter of the endpoint has now (deleted adapters, older
    artifact versions, adapters loaded under their public names before engine names), once nothing uses it; under
    the replica's lock, so never between a victim's choice and its load. Returns the names unloaded."""
    done = []
    async with replica.lock:
        for name in sorted(set(replica.last_used) - set(current) - replica.protected() - set(replica.loading)):
            if await unload(session, url=url, replica=replica, engine_name=name, endpoint_name=endpoint_name):
                done.append(name)
    return done


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
