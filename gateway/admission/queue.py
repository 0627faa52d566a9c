"""An endpoint's bounded priority queue: strict priority across classes, deficit round robin by MU
across tenants inside a class, FCFS inside a tenant, per-class max queue age, and eviction of
sheddable work to make room for more important requests."""

from collections import deque
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from gateway.admission.classes import CLASSES, SHEDDABLE, rank

_COUNT = attrgetter("count")


@dataclass(eq=False)
class QueuedItem:
    request_id: str
    tenant: str
    priority: str
    mu: float
    enqueued_at: float
    payload: Any = None  # opaque to the queue (the proxy keeps its future here)
    queued: bool = field(default=False, repr=False)


@dataclass
class OfferResult:
    admitted: bool
    evicted: list[QueuedItem] = field(default_factory=list)
    reason: str = ""  # why it was refused: "queue_full"


class _TenantLane:
    __slots__ = ("items", "deficit")

    def __init__(self) -> None:
        self.items: deque[QueuedItem] = deque()
        self.deficit = 0.0


class _ClassQueue:
    """Deficit round robin over tenants by MU: each turn adds credit to a tenant's deficit, and a request is
    served once its tenant's credit covers its cost."""

    def __init__(self, quantum_mu: float) -> None:
        self.quantum_mu = quantum_mu
        self.lanes: dict[str, _TenantLane] = {}
        self.active: deque[str] = deque()
        self.count = 0
        self.mu = 0.0

    def push(self, item: QueuedItem) -> None:
        lane = self.lanes.get(item.tenant)
        if lane is None:
            lane = self.lanes[item.tenant] = _TenantLane()
        if not lane.items:
            self.active.append(item.tenant)
        lane.items.append(item)
        self.count += 1
        self.mu += item.mu

    def _drop_lane_if_empty(self, tenant: str) -> None:
        lane = self.lanes[tenant]
        if not lane.items:
            # An idle tenant keeps no credit: DRR fairness is among backlogged tenants only.
            del self.lanes[tenant]
            try:
                self.active.remove(tenant)
            except ValueError:
                pass

    def pop(self) -> QueuedItem | None:
        if not self.count:
            return None
        # A turn grants the smallest head cost (at least quantum_mu): a quantum larger than typical requests
        # would let one tenant burst many of them per turn, which is fair only in the long run.
        grant = max(self.quantum_mu, min(self.lanes[t].items[0].mu for t in self.active), 1e-9)
        while True:
            tenant = self.active[0]
            lane = self.lanes[tenant]
            head = lane.items[0]
            # Every visit earns the same credit and serves at most one request, so MU served per tenant
            # tracks credit granted: equal shares among backlogged tenants whatever their request sizes.
            lane.deficit += grant
            if lane.deficit < head.mu:
                self.active.rotate(-1)
                continue
            lane.items.popleft()
            lane.deficit -= head.mu
            self.count -= 1
            self.mu -= head.mu
            if not lane.items:
                self.active.popleft()
                del self.lanes[tenant]
            else:
                self.active.rotate(-1)
            return head

    def remove(self, item: QueuedItem) -> bool:
        lane = self.lanes.get(item.tenant)
        if lane is None:
            return False
        try:
            lane.items.remove(item)
        except ValueError:
            return False
        self.count -= 1
        self.mu -= item.mu
        self._drop_lane_if_empty(item.tenant)
        return True

    def newest(self) -> QueuedItem | None:
        best = None
        for lane in self.lanes.values():
            if lane.items and (best is None or lane.items[-1].enqueued_at > best.enqueued_at):
                best = lane.items[-1]
        return best

    def newest_by_tenant(self) -> dict[str, QueuedItem]:
        return {tenant: lane.items[-1] for tenant, lane in self.lanes.items() if lane.items}

    def expired(self, cutoff: float) -> list[QueuedItem]:
        # FCFS per tenant, so only lane heads can be the oldest; stop at the first young item.
        out: list[QueuedItem] = []
        for lane in self.lanes.values():
            for item in lane.items:
                if item.enqueued_at > cutoff:
                    break
                out.append(item)
        return out


class AdmissionQueue:
    """Pure data structure; the caller supplies ``now`` (seconds, any monotonic clock)."""

    def __init__(self, *, max_size: int, max_age_s: dict[str, float], quantum_mu: float = 0.0) -> None:
        if max_size < 1:
            raise ValueError("max_size must be at least 1")
        missing = [c for c in CLASSES if c not in max_age_s]
        if missing:
            raise ValueError(f"max_age_s lacks classes {missing}")
        self.max_size = max_size
        self.max_age_s = dict(max_age_s)
        self._classes = {c: _ClassQueue(quantum_mu) for c in CLASSES}
        self._queues = tuple(self._classes.values())

    def __len__(self) -> int:  # asked for on every pump and heartbeat, per endpoint: no generator
        return sum(map(_COUNT, self._queues))

    @property
    def queued_mu(self) -> float:
        return sum(q.mu for q in self._classes.values())

    def depth_by_class(self) -> dict[str, int]:
        return {c: q.count for c, q in self._classes.items()}

    def mu_by_class(self) -> dict[str, float]:
        return {c: q.mu for c, q in self._classes.items()}

    def mu_ahead_of(self, priority: str) -> float:
        """MU that would be served before a new request of this class (its own class and above)."""
        r = rank(priority)
        return sum(q.mu for c, q in self._classes.items() if rank(c) <= r)

    def items(self) -> list[QueuedItem]:
        """Every queued request, in no particular order."""
        return [item for q in self._classes.values() for lane in q.lanes.values() for item in lane.items]

    def newest_by_tenant(self, priority: str) -> dict[str, QueuedItem]:
        """Each tenant's newest queued request of this class."""
        return self._classes[priority].newest_by_tenant()

    def offer(self, item: QueuedItem, now: float) -> OfferResult:
        rank(item.priority)  # validates
        evicted: list[QueuedItem] = []
        if len(self) >= self.max_size:
            if item.priority == SHEDDABLE:
                return OfferResult(admitted=False, reason="queue_full")
            # Make room by evicting the newest sheddable request: it has waited least and is the cheapest to lose.
            victim = self._classes[SHEDDABLE].newest()
            if victim is None:
                return OfferResult(admitted=False, reason="queue_full")
            self._classes[SHEDDABLE].remove(victim)
            victim.queued = False
            evicted.append(victim)
        item.queued = True
        self._classes[item.priority].push(item)
        return OfferResult(admitted=True, evicted=evicted)

    def next_class(self) -> str | None:
        """The class of the request ``pop`` would return (None: nothing waits)."""
        return next((c for c in CLASSES if self._classes[c].count), None)

    def pop(self, now: float) -> QueuedItem | None:
        """The next request to dispatch. Call ``expire`` first: an over-age request must never be served."""
        for c in CLASSES:
            item = self._classes[c].pop()
            if item is not None:
                item.queued = False
                return item
        return None

    def remove(self, item: QueuedItem) -> bool:
        """Take a request out (its client went away); False when it was no longer queued."""
        if not item.queued:
            return False
        removed = self._classes[item.priority].remove(item)
        item.queued = False
        return removed

    def expire(self, now: float) -> list[QueuedItem]:
        """Remove and return every request older than its class's max queue age."""
        out: list[QueuedItem] = []
        for c, q in self._classes.items():
            for item in q.expired(now - self.max_age_s[c]):
                q.remove(item)
                item.queued = False
                out.append(item)
        return out

    def next_expiry(self) -> float | None:
        """The earliest time at which some queued request will be over age (for the caller's timer)."""
        best = None
        for c, q in self._classes.items():
            for lane in q.lanes.values():
                if lane.items:
                    t = lane.items[0].enqueued_at + self.max_age_s[c]
                    if best is None or t < best:
                        best = t
        return best
