"""A disaggregated endpoint's prefill pool as one proxy process sees it (docs/request-path.md, "Prefill/decode
disaggregation"): its prefill replicas, this process's own load accounting on them (in-flight prefills and their MU
at the prefill pool's coefficients, a cooldown after a failed prefill), the metrics scraper's latest view of each,
and the router that picks one (``gateway.routing.registry.make_prefill_router``). Held by the endpoint's runtime
(``EndpointRuntime.prefill_pool``), kept in step with each snapshot by ``sync_prefill_pool``; used by
``disaggregation.prefill_phase``. Runs on the event loop, never touches the database."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from gateway.admission.classes import CLASSES
from gateway.proxy.caps import new_cap, set_caps
from gateway.proxy.model_names import ModelRename, model_rename
from gateway.proxy.snapshot import EndpointInfo
from gateway.routing.base import ReplicaView, RouteRequest
from gateway.routing.registry import make_prefill_router

log = logging.getLogger(__name__)

DISAGGREGATED = "disaggregated"
PREFILL = "prefill"
PREFILL_COOLDOWN_S = 5.0
CLASS_KEY = "priority_class"  # RouteRequest.extra: the request's class index, set at admission (``runtime``)
STANDARD_CLASS = CLASSES.index("standard")


@dataclass(eq=False)
class PrefillSlot:
    """One prefill replica as this process sees it."""

    replica_id: int
    name: str
    url: str
    view: ReplicaView
    configured_priority: bool = True  # launched with the priority scheduler (``ReplicaInfo.takes_priority``)
    refused_priority: bool = False  # answered a 400 naming ``priority``: it runs fcfs whatever its options say
    rename: ModelRename | None = None
    removed: bool = False
    cool_until: float = 0.0  # after a failed prefill: no prefill goes there before this (``PrefillPool.cool_down``)
    limit: int = 0  # the replica's concurrency limit; view.concurrency_limit is this process's cap of it
    class_flight: list[int] = field(default_factory=lambda: [0] * len(CLASSES))  # running prefills per class

    @property
    def takes_priority(self) -> bool:
        return self.configured_priority and not self.refused_priority


class PrefillPool:
    """The prefill replicas of one disaggregated endpoint, with this process's own load accounting (in-flight
    prefills and their MU at the prefill pool's coefficients) and its own router (``make_prefill_router``)."""

    def __init__(self, info: EndpointInfo, *, stale_after_s: float, scraper=None, clock=time.monotonic) -> None:
        self.router = make_prefill_router(stale_after_s=stale_after_s)
        self.scraper = scraper
        self.clock = clock
        self.slots: dict[str, PrefillSlot] = {}
        # This process's share of each prefill replica's limit when several proxy processes run (replica id → cap;
        # ``gateway.admission.shares``, through ``ProxyState``'s heartbeat as for the decode pool); None: the whole.
        self.caps: dict[str, int] | None = None
        self.flight_moved, self.limits_moved = set(), True  # since the heartbeat last looked (``reports.py``)
        self.info = info
        self.update(info)

    def update(self, info: EndpointInfo) -> None:
        """Follow a new snapshot: add prefill replicas, retire those gone (once their prefills end)."""
        self.info = info
        coeffs = info.prefill_coeffs or info.coeffs
        mu_capacity = max(coeffs.mu_per_min / 60.0, 1e-6)
        seen = set()
        for r in info.replicas if info.serving_mode == DISAGGREGATED else ():  # aggregated: every replica admits
            if r.role != PREFILL:
                continue
            rid = str(r.id)
            seen.add(rid)
            limit = max(1, min(r.concurrency_limit, info.concurrency_limit))
            rename = model_rename(served_model_name=r.served_model_name, endpoint_name=info.name)
            slot = self.slots.get(rid)
            back = slot is None or slot.removed
            if slot is None:
                view = ReplicaView(replica_id=rid, concurrency_limit=limit, profile=r.hardware_profile)
                slot = self.slots[rid] = PrefillSlot(replica_id=r.id, name=r.name, url=r.url, view=view)
            slot.url, slot.removed, slot.configured_priority, slot.rename = r.url, False, r.takes_priority, rename
            slot.limit = limit
            slot.view.concurrency_limit = new_cap(self, rid, limit, back)
            slot.view.mu_capacity = mu_capacity * r.speed
            slot.view.draining = False
        for rid, slot in list(self.slots.items()):
            if rid not in seen:
                slot.removed = slot.view.draining = True
                if slot.view.in_flight == 0:
                    self._forget(rid)
        self.limits_moved = True

    def _forget(self, rid: str) -> None:
        self.slots.pop(rid, None)
        if self.caps is not None:
            self.caps.pop(rid, None)
        forget = getattr(self.router, "forget_replica", None)
        if forget is not None:
            forget(rid)

    def take(self, route: RouteRequest, exclude: set[str] | None = None) -> PrefillSlot | None:
        """A prefill replica with a free slot for ``route`` (its ``mu`` the prefill's), not in ``exclude`` and not
        cooling down, taken; None if none."""
        now = self.clock()
        if self.scraper is not None:
            self.scraper.note(self.slots)  # every replica of the pool is considered, a full or cooling one too
        views = [
            s.view
            for rid, s in self.slots.items()
            if not s.removed
            and s.view.in_flight < s.view.concurrency_limit
            and s.cool_until <= now
            and not (exclude and rid in exclude)
        ]
        if not views:
            return None
        if self.scraper is not None:
            self._scraped(views, now)
        rid = self.router.pick(route, views, now)
        slot = self.slots.get(rid) if rid is not None else None
        if slot is None or slot.view.in_flight >= slot.view.concurrency_limit:
            slot = self.slots[min(views, key=lambda v: (v.in_flight / v.concurrency_limit, v.in_flight_mu)).replica_id]
        slot.view.in_flight += 1
        slot.view.in_flight_mu += route.mu
        slot.class_flight[route.extra.get(CLASS_KEY, STANDARD_CLASS)] += 1
        self.flight_moved.add(slot.view.replica_id)
        self.router.on_routed(route, slot.view.replica_id, now)
        return slot

    def _scraped(self, views: list[ReplicaView], now: float) -> None:
        """The scraper's latest engine figures on each view; a replica never scraped reads as stale (the routers'
        filter passes over it while another is fresh, and fails open when none is)."""
        for view in views:
            latest = self.scraper.latest(view.replica_id)
            if latest is None:
                view.metrics_age_s = float("inf")
                continue
            view.metrics_age_s = now - latest.scraped_at
            view.num_running, view.num_waiting, view.kv_usage = latest.num_running, latest.num_waiting, latest.kv_usage
            if latest.block_size:
                view.block_size = latest.block_size
            if latest.num_gpu_blocks:
                view.num_gpu_blocks = latest.num_gpu_blocks

    def scrape_targets(self) -> dict[str, str]:
        return {rid: s.url for rid, s in self.slots.items() if not s.removed}

    # -- sharing the prefill replicas' limits between proxy processes (``ProxyState._beat``) ----------------------
    def in_flight_by_replica(self) -> dict[str, int]:
        return {rid: s.view.in_flight for rid, s in self.slots.items() if s.view.in_flight}

    def replica_limits(self) -> dict[str, int]:
        return {rid: s.limit for rid, s in self.slots.items() if not s.removed}

    def demand_by_replica(self) -> dict[str, tuple[int, ...]]:
        """Running prefills per class on each serving replica that has some (a prefill waits in no queue: without a
        free slot the decode replica prefills)."""
        return {rid: tuple(s.class_flight) for rid, s in self.slots.items() if not s.removed and any(s.class_flight)}

    def report_of(self, rid: str) -> tuple[int, tuple[int, ...] | None]:
        """One replica's prefills and its demand row (None: none), as the two maps above give them."""
        slot = self.slots.get(rid)
        if slot is None:
            return 0, None
        return slot.view.in_flight, tuple(slot.class_flight) if not slot.removed and any(slot.class_flight) else None

    def apply_caps(self, caps: dict[str, int] | None, *, merge: bool = False) -> None:
        set_caps(self, caps, merge=merge)  # a prefill waits in no queue: nothing to admit

    def cool_down(self, slot: PrefillSlot) -> None:
        """The replica failed a prefill (unreachable, 5xx): no prefill goes there for ``PREFILL_COOLDOWN_S``, after
        which one request tries it again (the health prober takes a dead one out of the snapshot meanwhile)."""
        slot.cool_until = self.clock() + PREFILL_COOLDOWN_S

    def release(self, slot: PrefillSlot, route: RouteRequest) -> None:
        klass = route.extra.get(CLASS_KEY, STANDARD_CLASS)
        slot.class_flight[klass] = max(0, slot.class_flight[klass] - 1)
        self.flight_moved.add(slot.view.replica_id)
        slot.view.in_flight -= 1
        slot.view.in_flight_mu = max(0.0, slot.view.in_flight_mu - route.mu)
        try:
            self.router.on_finished(route, slot.view.replica_id, self.clock())
        except Exception:  # noqa: BLE001 - a router bug must not leak prefill slots
            log.exception("prefill router on_finished failed")
        if slot.removed and slot.view.in_flight == 0:
            self._forget(slot.view.replica_id)


def sync_prefill_pool(runtime, info: EndpointInfo) -> PrefillPool | None:
    """The runtime's prefill pool after a new snapshot (``EndpointRuntime.update``): made when the endpoint turns
    disaggregated, kept while it has prefills in flight, dropped after."""
    pool = runtime.prefill_pool
    if info.serving_mode == DISAGGREGATED:
        if pool is None:
            return PrefillPool(info, stale_after_s=runtime.config.metrics_stale_s, scraper=runtime.scraper)
        pool.update(info)
        return pool
    if pool is not None and any(s.view.in_flight for s in pool.slots.values()):
        pool.update(info)  # no prefill replica in it any more: each is retired as its prefill ends
        return pool
    return None


def prefill_pool(runtime) -> PrefillPool:
    """The runtime's prefill pool (a disaggregated endpoint's runtime always holds one)."""
    pool = runtime.prefill_pool
    if pool is None:  # the endpoint was disaggregated when the request was admitted: the snapshot changed since
        pool = runtime.prefill_pool = PrefillPool(runtime.info, stale_after_s=runtime.config.metrics_stale_s)
    return pool
