"""Per-process live state of one endpoint: its replicas' slots (in-flight requests and MU, which this
process tracks itself), its admission queue and its router. Everything here runs on the event loop and
never touches the database."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from dataclasses import dataclass

from capacity.autoscaling.activator import request_scale_from_zero
from gateway.admission import AdmissionController, QueuedItem, Refusal
from gateway.admission.classes import CLASSES
from gateway.admission.shares import spread_queue
from gateway.proxy import metrics as m
from gateway.proxy.caps import new_cap, set_caps
from gateway.proxy.kv_feeds import KVFeeds
from gateway.proxy.model_names import ModelRename, model_rename
from gateway.proxy.prefill_pool import CLASS_KEY, PrefillPool, sync_prefill_pool
from gateway.proxy.replica_adapters import ReplicaAdapters, note_engine_lora, routers_eviction
from gateway.proxy.snapshot import EndpointInfo
from gateway.routing import make_router
from gateway.routing.base import ReplicaView, RouteRequest
from gateway.routing.bounded_affinity import PREFIX_SOURCE_KEY
from gateway.routing.cost_aware import plan_figures

log = logging.getLogger(__name__)

# RouteRequest.extra: the endpoint's slot share when the request took its slot under it (it was degraded).
SLOT_SHARE_KEY = "slot_share"
_CRITICAL = CLASSES.index("critical")
_STANDARD = CLASSES.index("standard")
_NO_FLIGHT = (0,) * len(CLASSES)
COST_AWARE = "cost_aware"  # routes a mixed fleet by the endpoint's routing plan (gateway/routing/cost_aware.py)
PRECISE_POLICIES = frozenset({"infercap"})  # the live policies that read the precise index from KV events
ENGINE_NAMED_KEY = "adapter_engine_named"  # RouteRequest.extra: route.adapter is the engine name already


class Shed(Exception):
    """Admission refused the request: ``reason`` is queue_full, queue_age, evicted, overloaded or no_replica."""

    def __init__(self, reason: str, retry_after: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


@dataclass(eq=False)
class Slot:
    """One replica as this process sees it."""

    replica_id: int
    name: str
    url: str
    view: ReplicaView
    removed: bool = False  # gone from the snapshot: finish what runs, take nothing new
    version_id: int | None = None  # the endpoint version the replica runs (traffic is split by version)
    limit: int = 0  # the replica's concurrency limit; view.concurrency_limit is this process's cap of it
    configured_priority: bool = True  # launched with the priority scheduler (snapshot.ReplicaInfo.takes_priority)
    refused_priority: bool = False  # answered a 400 naming ``priority``: it runs fcfs whatever its options say
    rename: ModelRename | None = None  # its engine serves another model name than the endpoint's

    @property
    def takes_priority(self) -> bool:
        return self.configured_priority and not self.refused_priority


COST_RATIO_ALPHA = 0.05  # EWMA weight of one finished request (about the last 20 count)
MAX_COST_RATIO = 4.0  # a request without max_tokens may run past the typical output it was charged for


class EndpointRuntime:
    def __init__(self, info: EndpointInfo, *, config, scraper=None, clock=time.monotonic, rng=None) -> None:
        self.info = info
        self.config = config
        self.clock = clock
        self.rng = rng or random.Random().random  # picks the version of each request during a rollout
        self.scraper = scraper
        # The decisions the simulators share (gateway.admission.controller); this class keeps the slots and futures.
        self.admission = AdmissionController(max_queue=config.max_queue, max_age_s=config.max_age_s, now=clock())
        self.queue = self.admission.queue
        # The live precise prefix index (infercap's policy): one KV-event subscriber per replica that publishes.
        self.kv_feeds = KVFeeds(name=info.name, clock=clock)
        self.router = self._make_router(info.routing_policy, info)
        self.slots: dict[str, Slot] = {}
        self.in_flight = 0
        self.in_flight_mu = 0.0
        # Requests that reached admission (served, queued or shed), and their MU at the expected cost: cumulative,
        # for the autoscaler's spike-onset floor (docs/algorithms.md#spike-onset; the sampler takes differences)
        self.arrivals_total = 0
        self.arrivals_mu_total = 0.0
        # What finished requests actually cost over what admission reserved for them (EWMA). Admission charges
        # max_tokens as the output (an upper bound a reservation must not under-count); the autoscaler wants the
        # expected cost, or a client sending max_tokens=4096 for 300-token answers would buy 10x the replicas.
        self.cost_ratio = 1.0
        self._expiry_handle: asyncio.TimerHandle | None = None
        # This process's share of each replica's limit when several proxy processes run (replica id → cap;
        # ``gateway.admission.shares``); None = the whole limit.
        self.caps: dict[str, int] | None = None
        self._class_flight: dict[str, list[int]] = {}  # replica id → running requests per priority class
        self.flight_moved, self.limits_moved = set(), True  # since the heartbeat last looked (``reports.py``)
        self.adapters: dict[str, ReplicaAdapters] = {}  # replica id → its LoRA adapters (``lora.py``)
        # The endpoint's adapters by public name, from the snapshot: requests are routed, loaded and counted under
        # their engine names (``AdapterInfo.engine_name``; docs/lora-serving.md).
        self.adapter_infos: dict = {}
        self._gauges_dirty: set[str] = set()
        self.prefill_pool: PrefillPool | None = None  # a disaggregated endpoint's (docs/request-path.md)
        self.update(info)

    # -- config ---------------------------------------------------------------------------------------
    def set_adapter_history(self, rates: dict[str, float]) -> None:
        """The adapters' request rates over the last day, for a router that weighs popularity (docs/lora.md)."""
        setter = getattr(self.router, "set_adapter_history", None)
        if setter is not None and self.info.max_loras:
            setter(rates)

    def set_adapters(self, adapters: dict) -> None:
        """The endpoint's adapters now (public name → ``AdapterInfo``), from a new snapshot."""
        self.adapter_infos = adapters

    def engine_adapter_names(self) -> dict[str, str]:
        """Engine name → public name of the adapters served here now (anything else a replica holds is stale)."""
        return {a.engine_name: name for name, a in self.adapter_infos.items()}

    def queued_adapters(self) -> set[str]:
        """The adapters (engine names) that requests waiting in this endpoint's queue name."""
        return {item.payload[1].adapter for item in self.queue.items() if item.payload[1].adapter is not None}

    def _engine_route(self, route: RouteRequest) -> None:
        """Name the request's adapter by its engine name, once (a retry or a pump passes the same route again)."""
        if route.adapter is not None and not route.extra.get(ENGINE_NAMED_KEY):
            found = self.adapter_infos.get(route.adapter)
            route.adapter = found.engine_name if found is not None else route.adapter
            route.extra[ENGINE_NAMED_KEY] = True

    def update(self, info: EndpointInfo) -> None:
        """Apply a new snapshot: add replicas, retire removed ones, follow concurrency-limit changes."""
        if (info.routing_policy, info.routing_plan) != (self.info.routing_policy, self.info.routing_plan):
            self.router = self._make_router(info.routing_policy, info)
        self.info = info
        replicas = info.admission_replicas  # a disaggregated endpoint's decode pool (its prefill pool is apart)
        self.prefill_pool = sync_prefill_pool(self, info)
        self.kv_feeds.sync(replicas if info.routing_policy in PRECISE_POLICIES else ())
        mu_capacity = max(info.coeffs.mu_per_min / 60.0, 1e-6)
        seen = set()
        for r in replicas:
            rid = str(r.id)
            seen.add(rid)
            limit = max(1, min(r.concurrency_limit, info.concurrency_limit))
            slot = self.slots.get(rid)
            cap = new_cap(self, rid, limit, back=slot is None or slot.removed)
            rename = model_rename(served_model_name=r.served_model_name, endpoint_name=info.name)
            if slot is None:
                view = ReplicaView(
                    replica_id=rid,
                    concurrency_limit=cap,
                    mu_capacity=mu_capacity * r.speed,
                    profile=r.hardware_profile,
                )
                self.slots[rid] = Slot(
                    replica_id=r.id,
                    name=r.name,
                    url=r.url,
                    view=view,
                    version_id=r.version_id,
                    limit=limit,
                    configured_priority=r.takes_priority,
                    rename=rename,
                )
            else:
                slot.url, slot.removed, slot.version_id, slot.limit = r.url, False, r.version_id, limit
                slot.configured_priority, slot.rename = r.takes_priority, rename
                slot.view.concurrency_limit, slot.view.mu_capacity = cap, mu_capacity * r.speed
                slot.view.draining, slot.view.profile = False, r.hardware_profile
        for rid, slot in list(self.slots.items()):
            if rid not in seen:
                slot.removed = True
                slot.view.draining = True
                if slot.view.in_flight == 0:
                    self._drop(rid)
        self.limits_moved = True
        self.pump()

    def _make_router(self, policy: str, info: EndpointInfo):
        stale = {"stale_after_s": self.config.metrics_stale_s}
        if policy in PRECISE_POLICIES:
            return make_router(policy, kv_index=self.kv_feeds.index, **stale)
        if policy == COST_AWARE:
            try:
                return make_router(policy, **plan_figures(json.loads(info.routing_plan or "null")), **stale)
            except ValueError as exc:  # PlanInvalid, bad JSON: validated on save, but a plan saved before may not be
                log.warning("endpoint %s: its routing plan is unusable (%s); routing by least request", info.name, exc)
                return make_router("least_request", **stale)
        return make_router(policy, **stale)

    def close(self) -> None:
        """Stop the KV-event subscribers (their threads are joined: shutdown only)."""
        self.kv_feeds.close()

    def apply_caps(self, caps: dict[str, int] | None, *, merge: bool = False) -> None:
        set_caps(self, caps, merge=merge)  # ``gateway.proxy.caps``; a raised cap admits queued requests
        self.pump()

    def _drop(self, rid: str) -> None:  # a replica gone from the snapshot, its last stream ended (``caps.new_cap``)
        for kept in (self.slots, self._class_flight, self.adapters, self.caps or {}):
            kept.pop(rid, None)

    def adapters_of(self, slot: Slot) -> ReplicaAdapters:
        """The LoRA adapters of a replica, as this process knows them (created on first use)."""
        rid = slot.view.replica_id
        found = self.adapters.get(rid)
        if found is None:
            victim = routers_eviction(lambda: self.router, rid)  # the router of the moment: the policy can change
            found = self.adapters[rid] = ReplicaAdapters(victim=victim, clock=self.clock, queued=self.queued_adapters)
        return found

    def in_flight_by_replica(self) -> dict[str, int]:  # an idle endpoint answers without a look at its slots
        return {rid: s.view.in_flight for rid, s in self.slots.items() if s.view.in_flight} if self.in_flight else {}

    def report_of(self, rid: str) -> tuple[int, tuple[int, ...] | None]:
        """One replica's streams and, nothing queued, its demand row (None: none), as the maps here give them."""
        slot, f = self.slots.get(rid), self._class_flight.get(rid)
        row = tuple(f) if f and any(f) and slot is not None and not slot.removed else None
        return (0 if slot is None else slot.view.in_flight), row

    def replica_limits(self) -> dict[str, int]:
        """Each serving replica's concurrency limit (what the proxy processes share)."""
        return {rid: s.limit for rid, s in self.slots.items() if not s.removed}

    def demand_by_replica(self) -> dict[str, tuple[int, ...]]:
        """Per serving replica and priority class: the requests running there plus this endpoint's queued ones,
        the queue spread over the replicas in proportion to their limits (what the heartbeat reports); only the
        replicas with some (the heartbeat covers the fleet: an idle endpoint costs it nothing here)."""
        if not len(self.queue):
            slots = self.slots
            return {
                rid: tuple(f)
                for rid, f in self._class_flight.items()
                if any(f) and rid in slots and not slots[rid].removed
            }
        depth = self.queue.depth_by_class()
        limits = self.replica_limits()
        queued = spread_queue(tuple(int(depth.get(c, 0)) for c in CLASSES), limits)
        rows = {
            rid: tuple(r + q for r, q in zip(self._class_flight.get(rid, _NO_FLIGHT), queued[rid], strict=True))
            for rid in limits
        }
        return {rid: row for rid, row in rows.items() if any(row)}

    def flush_gauges(self) -> None:
        """Write the in-flight gauges of the replicas that changed (batched off the request path: with
        ``PROMETHEUS_MULTIPROC_DIR`` every write is an mmap update)."""
        dirty, self._gauges_dirty = self._gauges_dirty, set()
        pending = getattr(self.router, "pending_prefill", None)
        for rid in dirty:
            slot = self.slots.get(rid)
            if slot is not None:
                m.child(m.IN_FLIGHT, self.info.name, slot.name).set(slot.view.in_flight)
                m.child(m.IN_FLIGHT_MU, self.info.name, slot.name).set(slot.view.in_flight_mu)
                if pending is not None:
                    m.child(m.PENDING_PREFILL, self.info.name, slot.name).set(pending.tokens(rid))

    def scrape_targets(self) -> dict[str, str]:
        targets = {rid: s.url for rid, s in self.slots.items() if not s.removed}
        return targets if self.prefill_pool is None else {**targets, **self.prefill_pool.scrape_targets()}

    @property
    def has_replicas(self) -> bool:
        return any(not s.removed for s in self.slots.values())

    # -- slots ------------------------------------------------------------------------------------------
    def _views(self, now: float, exclude: set[str] | None = None) -> list[ReplicaView]:
        views = []
        scraper = self.scraper
        if scraper is not None and exclude:
            scraper.note(exclude)  # left out of this pick, not out of the endpoint: keep their figures fresh
        for rid, slot in self.slots.items():
            if slot.removed or (exclude and rid in exclude):
                continue
            view = slot.view
            if scraper is not None:
                latest = scraper.latest(rid)
                if latest is not None:
                    view.metrics_age_s = now - latest.scraped_at
                    view.num_running = latest.num_running
                    view.num_waiting = latest.num_waiting
                    view.kv_usage = latest.kv_usage
                    if latest.block_size:
                        view.block_size = latest.block_size
                    if latest.num_gpu_blocks:
                        view.num_gpu_blocks = latest.num_gpu_blocks
                    if latest.lora_active or latest.lora_max:
                        note_engine_lora(self.adapters_of(slot), view, latest, now)
                else:
                    view.metrics_age_s = float("inf")
            if self.info.max_loras or rid in self.adapters:
                adapters = self.adapters_of(slot)
                view.adapters = adapters.held()
                view.max_loras = adapters.engine_max_loras or self.info.max_loras
            views.append(view)
        return views

    def _has_free_slot(self, priority: str | None = None) -> bool:
        """Some routed replica has a free slot (one a request of ``priority`` may take, by the slot share)."""
        routed = self._routed_versions()
        held = (self._held_back(CLASSES.index(priority), self.clock()) if priority else None) or ()
        return any(
            not s.removed
            and s.view.in_flight < s.view.concurrency_limit
            and (routed is None or s.version_id in routed)
            and rid not in held
            for rid, s in self.slots.items()
        )

    def _held_back(self, klass: int, now: float) -> set[str] | None:
        """The endpoint's slot share for a request of this class index (``AdmissionController.held_back``): None
        when not in force, else the replicas whose share for the degraded classes is taken."""
        share = self.info.degrade_slot_share
        if share is None or klass == _CRITICAL:
            return None
        replicas = {
            rid: (dict(zip(CLASSES, self._class_flight.get(rid, _NO_FLIGHT), strict=True)), s.view.concurrency_limit)
            for rid, s in self.slots.items()
            if not s.removed
        }
        nominal = self._load()["nominal_mu_per_s"]
        return self.admission.held_back(CLASSES[klass], replicas, share=share, now=now, nominal_mu_per_s=nominal)

    def _routed_versions(self) -> frozenset | None:
        """Versions taking traffic during a rollout; None outside one (every replica is routed)."""
        weights = self.info.version_weights
        return frozenset(v for v, w in weights if w > 0) if weights else None

    def _one_version(self, views: list[ReplicaView]) -> list[ReplicaView]:
        """During a rollout: the replicas of one version, drawn by the versions' traffic weights; when the drawn
        version has no free slot (or no replica left), another weighted one. Outside a rollout: all of them."""
        weights = self.info.version_weights
        if not weights:
            return views
        groups: dict[int | None, list[ReplicaView]] = {}
        for view in views:
            groups.setdefault(self.slots[view.replica_id].version_id, []).append(view)
        live = [(version, weight) for version, weight in weights if weight > 0 and version in groups]
        if not live:
            return []
        x = self.rng() * sum(weight for _, weight in live)
        drawn = live[-1][0]
        for version, weight in live:
            if x < weight:
                drawn = version
                break
            x -= weight
        for version in [drawn] + [v for v, _ in live if v != drawn]:
            if any(v.in_flight < v.concurrency_limit for v in groups[version]):
                return groups[version]
        return groups[drawn]

    def try_take(self, route: RouteRequest, mu: float, exclude: set[str] | None = None) -> Slot | None:
        """Route now if some replica has a free slot; the slot is taken when this returns one."""
        self._engine_route(route)
        now = self.clock()
        held = self._held_back(route.extra.get(CLASS_KEY, _STANDARD), now)
        if held:
            exclude = held | exclude if exclude else held
        views = self._one_version(self._views(now, exclude))
        if route.adapter is not None:
            # Only replicas that serve adapters and can take this one now (it holds it, or has or can free a slot
            # within its tenant's quota); none: the request waits in the queue for a slot (docs/lora-serving.md).
            quota = self.config.tenant_adapter_slots
            views = [
                v
                for v in views
                if self.adapters_of(self.slots[v.replica_id]).can_serve(route.adapter, v.max_loras, quota(v.max_loras))
            ]
            # Where the tenant's quota binds, loading there unloads one of its own adapters: a replica where it does
            # not goes first, so a tenant's adapters spread instead of taking turns on one replica.
            roomy = [
                v
                for v in views
                if self.adapters_of(self.slots[v.replica_id]).fits_within_quota(route.adapter, quota(v.max_loras))
            ]
            views = roomy or views
        if not views:
            return None
        with self.kv_feeds.lock:  # the subscribers' threads write the precise index under it
            slot = self._route(route, views, mu, now)
        if slot is None:
            return None
        if held is None:
            route.extra.pop(SLOT_SHARE_KEY, None)
        else:
            route.extra[SLOT_SHARE_KEY] = self.info.degrade_slot_share
        return slot

    def _route(self, route: RouteRequest, views: list[ReplicaView], mu: float, now: float) -> Slot | None:
        rid = self.router.pick(route, views, now)
        slot = self.slots.get(rid) if rid is not None else None
        if slot is None or slot.view.in_flight >= slot.view.concurrency_limit:
            # The router may refuse stale or saturated replicas; our own slot count is the hard limit, and
            # a free slot anywhere is never left idle while requests wait.
            free = [v for v in views if v.in_flight < v.concurrency_limit]
            if not free:
                return None
            slot = self.slots[min(free, key=lambda v: (v.in_flight / v.concurrency_limit, v.in_flight_mu)).replica_id]
        self._take(slot, route, mu, now)
        return slot

    def _take(self, slot: Slot, route: RouteRequest, mu: float, now: float) -> None:
        flight = self._class_flight.setdefault(slot.view.replica_id, [0] * len(CLASSES))
        flight[route.extra.get(CLASS_KEY, _STANDARD)] += 1
        self.flight_moved.add(slot.view.replica_id)
        slot.view.in_flight += 1
        slot.view.in_flight_mu += mu
        self.in_flight += 1
        self.in_flight_mu += mu
        self.router.on_routed(route, slot.view.replica_id, now)
        if route.adapter is not None:
            self.adapters_of(slot).took(route.adapter, now)
        self._gauges_dirty.add(slot.view.replica_id)
        source = route.extra.get(PREFIX_SOURCE_KEY)
        if source is not None:
            m.child(m.PREFIX_INDEX, self.info.name, source).inc()

    def first_token(self, slot: Slot | None, route: RouteRequest) -> None:
        """The replica's first bytes for ``route`` arrived: its prompt no longer waits there (the router's pending
        prefill, routing/prefill.py)."""
        hook = getattr(self.router, "on_first_token", None)
        if slot is None or hook is None:
            return
        self._gauges_dirty.add(slot.view.replica_id)
        try:
            hook(route, slot.view.replica_id, self.clock())
        except Exception:  # noqa: BLE001 - a router bug must not break the stream
            log.exception("router on_first_token failed")

    def release(self, slot: Slot, route: RouteRequest, mu_reserved: float, mu_done: float) -> None:
        now = self.clock()
        flight = self._class_flight.get(slot.view.replica_id)
        if flight is not None:
            klass = route.extra.get(CLASS_KEY, _STANDARD)
            flight[klass] = max(0, flight[klass] - 1)
        self.flight_moved.add(slot.view.replica_id)
        slot.view.in_flight -= 1
        slot.view.in_flight_mu = max(0.0, slot.view.in_flight_mu - mu_reserved)
        self.in_flight -= 1
        self.in_flight_mu = max(0.0, self.in_flight_mu - mu_reserved)
        self.admission.finished(mu_done=mu_done, now=now)
        if route.adapter is not None:
            self.adapters_of(slot).released(route.adapter, now)
        if mu_reserved > 0 and mu_done > 0:  # a completed request (failures and refusals carry no cost)
            ratio = min(mu_done / mu_reserved, MAX_COST_RATIO)
            self.cost_ratio += COST_RATIO_ALPHA * (ratio - self.cost_ratio)
        try:
            self.router.on_finished(route, slot.view.replica_id, now)
        except Exception:  # noqa: BLE001 - a router bug must not leak slots
            log.exception("router on_finished failed")
        self._gauges_dirty.add(slot.view.replica_id)
        if slot.removed and slot.view.in_flight == 0:
            self._drop(slot.view.replica_id)
            m.child(m.IN_FLIGHT, self.info.name, slot.name).set(0)
            m.child(m.IN_FLIGHT_MU, self.info.name, slot.name).set(0)
            if hasattr(self.router, "pending_prefill"):
                m.child(m.PENDING_PREFILL, self.info.name, slot.name).set(0)
        self.pump()

    # -- queue --------------------------------------------------------------------------------------------
    def _load(self) -> dict[str, float]:
        """What a Retry-After needs besides the queue: MU in flight, and the replicas' nominal capacity (used until
        something has finished here; each replica's, so a faster one counts for more)."""
        nominal = sum(s.view.mu_capacity for s in self.slots.values() if not s.removed)
        return {"in_flight_mu": self.in_flight_mu, "nominal_mu_per_s": nominal}

    def retry_after(self, priority: str) -> int:
        return self.admission.retry_after(priority, now=self.clock(), **self._load())

    def level(self) -> int:
        """The endpoint's degradation level (``gateway.admission.brownout``), 0 normal … 3 shedding."""
        return self.admission.level(now=self.clock(), nominal_mu_per_s=self._load()["nominal_mu_per_s"])

    def arrived(self, *, tenant: str, mu: float, reserved_mu_per_s: float) -> None:
        """A request reached this endpoint (before its limits, a cap or admission): fair pain's measure of excess."""
        self.admission.arrived(tenant=tenant, mu=mu, reserved_mu_per_s=reserved_mu_per_s, now=self.clock())

    def should_degrade(self, *, tenant: str, priority: str) -> bool:
        """Whether to serve this request shorter: its class degrades at the level now, and it is its tenant's turn."""
        nominal = self._load()["nominal_mu_per_s"]
        return self.admission.degrade(tenant=tenant, priority=priority, now=self.clock(), nominal_mu_per_s=nominal)

    async def acquire(self, route: RouteRequest, *, tenant: str, priority: str, mu: float) -> tuple[Slot, float]:
        """A slot for this request, now or after queueing; returns (slot, seconds queued). Raises Shed."""
        route.extra[CLASS_KEY] = CLASSES.index(priority)  # counted per class while it runs (shared slots)
        self.arrivals_total += 1
        self.arrivals_mu_total += mu * self.cost_ratio
        self._engine_route(route)
        if self.admission.may_skip_queue():
            slot = self.try_take(route, mu)
            if slot is not None:
                return slot, 0.0
        now = self.clock()
        fut = asyncio.get_running_loop().create_future()
        item = QueuedItem(
            request_id=route.request_id, tenant=tenant, priority=priority, mu=mu, enqueued_at=now, payload=(fut, route)
        )
        outcome = self.admission.enqueue(
            item, now=now, has_replicas=self.has_replicas, scale_to_zero=self.info.scale_to_zero, **self._load()
        )
        for refusal in outcome.evicted:
            self._fail(refusal)
        if outcome.refused is not None:
            if outcome.refused.reason != "no_replica":
                m.child(m.SHED, self.info.name, priority, outcome.refused.reason).inc()
            raise Shed(outcome.refused.reason, outcome.refused.retry_after_s)
        # A free slot while others wait (held back by the slot share) may be this request's: critical goes ahead.
        self.pump()
        if not self.has_replicas:
            _request_scale_from_zero(self.info.id)
        try:
            slot = await fut
        except asyncio.CancelledError:
            # The client went away while queued: leave the queue, or give back a slot granted meanwhile.
            if self.admission.remove(item):
                self._gauge_depth()
            elif fut.done() and not fut.cancelled() and fut.exception() is None:
                self.release(fut.result(), route, mu, 0.0)
            raise
        return slot, self.clock() - now

    def pump(self) -> None:
        """Expire over-age requests, then hand free slots to queued ones in admission order."""
        if not len(self.queue):
            return
        now = self.clock()
        for refusal in self.admission.shed_expired(now=now, **self._load()):
            self._fail(refusal)
        changed = True
        waiting_for_adapter = []  # no adapter slot for them now: the requests behind them go first
        while len(self.queue) and self._has_free_slot(self.admission.next_class()):
            item = self.admission.next_to_serve(now)
            fut, route = item.payload
            if fut.done():  # cancelled while queued
                continue
            slot = self.try_take(route, item.mu)
            if slot is None and route.adapter is not None:
                waiting_for_adapter.append(item)
                continue
            if slot is None:  # cannot happen while a slot is free, but never lose the request
                self.queue.offer(item, item.enqueued_at)
                break
            fut.set_result(slot)
        for item in waiting_for_adapter:
            self.queue.offer(item, item.enqueued_at)
        if changed:
            self._gauge_depth()
            self._arm_expiry()

    def _fail(self, refusal: Refusal) -> None:
        item = refusal.item
        fut, _ = item.payload
        m.child(m.SHED, self.info.name, item.priority, refusal.reason).inc()
        if not fut.done():
            fut.set_exception(Shed(refusal.reason, refusal.retry_after_s))

    def _arm_expiry(self) -> None:
        if self._expiry_handle is not None:
            self._expiry_handle.cancel()
            self._expiry_handle = None
        at = self.admission.next_expiry()
        if at is not None:
            loop = asyncio.get_running_loop()
            self._expiry_handle = loop.call_later(max(0.0, at - self.clock()) + 0.001, self.pump)

    def _gauge_depth(self) -> None:
        for cls, n in self.queue.depth_by_class().items():
            m.child(m.QUEUE_DEPTH, self.info.name, cls).set(n)

    def demand(self) -> dict:
        """This process's demand for the autoscaler: MU at the expected cost (reserved MU x the observed ratio of
        actual to reserved cost); the reserved figures are kept alongside."""
        return {
            "in_flight": self.in_flight,
            "queued": len(self.queue),
            "in_flight_mu": round(self.in_flight_mu * self.cost_ratio, 4),
            "queued_mu": round(self.queue.queued_mu * self.cost_ratio, 4),
            "in_flight_mu_reserved": round(self.in_flight_mu, 4),
            "queued_mu_reserved": round(self.queue.queued_mu, 4),
            "cost_ratio": round(self.cost_ratio, 4),
            "queued_by_class": self.queue.depth_by_class(),
            "arrived": self.arrivals_total,
            "arrived_mu": round(self.arrivals_mu_total, 4),
        }


def _request_scale_from_zero(endpoint_id: int) -> None:
    try:
        request_scale_from_zero(endpoint_id)
    except Exception:  # noqa: BLE001 - the activator is best effort; the queue age bounds the wait
        log.exception("scale-from-zero request failed")
