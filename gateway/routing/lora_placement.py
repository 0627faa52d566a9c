"""Where infercap sends a request for a LoRA adapter (pure; docs/lora.md#routing).

Loading an adapter costs its first request 0.5–2 s of TTFT and can push another tenant's adapter out, so placement
is a cache decision taken under the bounded-load rule of ``bounded_affinity``:

1. Replicas holding the adapter (``ReplicaView.adapters``, or with requests for it in flight: loading or queued for a
   slot there) within the holders' bound (``adapter_load_bound``, looser
   than the plain bound because a hit saves a whole load) are the only candidates: a hit beats any load spread.
2. None within it (the adapter is new, or its holders are full: a hot adapter then gets one more replica), the
   request goes to a replica within the plain bound that can take it with the least damage: a free slot costs
   nothing; otherwise the cost is the popularity of the adapter that would leave (the idle one of lowest
   popularity, ``AdapterBook.victim_among``, the rule the slots apply too: ``InfercapRouter.adapter_victim``),
   so a popular adapter is not evicted to make room for a rare one; a replica whose every slot is in use (the request would wait for a slot)
   costs most. Ties go to the adapter's rendezvous-hash home, so every proxy process places it alike.

``AdapterBook`` is the router's memory: per replica and adapter, last routed time and requests in flight; per
adapter, an exponentially decaying request rate over the whole fleet (its popularity), which also decides which
idle adapter leaves a full replica (LFU with aging, ``lora.least_popular_to_evict``; ``by_popularity=False``: LRU).
"""

import math
from collections.abc import Collection, Mapping, Sequence

from gateway.routing.adapter_eviction import least_popular_to_evict, least_recent_to_evict
from gateway.routing.base import ReplicaView

BUSY_SLOTS_COST = 2.0  # relative cost of a replica whose every adapter slot is in use (above any eviction: ≤ 1)


class AdapterBook:
    def __init__(
        self,
        popularity_tau_s: float = 60.0,
        *,
        by_popularity: bool = True,
        history_rates: Mapping[str, float] | None = None,
        history_weight: float = 10.0,
    ):
        if popularity_tau_s <= 0:
            raise ValueError("popularity_tau_s must be > 0")
        if history_weight < 0:
            raise ValueError("history_weight must be ≥ 0")
        self.tau_s, self.by_popularity = popularity_tau_s, by_popularity
        self.history_weight = history_weight
        self.history: dict[str, float] = {}
        self.set_history(history_rates or {})
        self._rate: dict[str, tuple[float, float]] = {}  # adapter → (rate, at)
        self.last_routed: dict[str, dict[str, float]] = {}  # replica → adapter → last routed time
        self.in_flight: dict[str, dict[str, int]] = {}  # replica → adapter → requests sent, not finished

    def set_history(self, rates: Mapping[str, float]) -> None:
        """Each adapter's request rate over a long past (requests/s; live: the usage records' last day, refreshed
        with the config snapshot), replacing the previous one."""
        self.history = {name: float(rate) for name, rate in rates.items() if rate > 0}

    def live_rate(self, adapter: str, now: float) -> float:
        """The decayed rate of the requests this router has seen (τ = ``popularity_tau_s``)."""
        rate, at = self._rate.get(adapter, (0.0, now))
        return rate * math.exp(-max(0.0, now - at) / self.tau_s)

    def popularity(self, adapter: str, now: float) -> float:
        """Live rate plus ``history_weight`` × the history's rate: a minute of requests estimates a rare adapter's
        rate poorly (one request looks like one a minute); a day of them does not, and the live term still follows
        a change of popularity the history has not seen yet."""
        return self.live_rate(adapter, now) + self.history_weight * self.history.get(adapter, 0.0)

    def on_routed(self, adapter: str, replica_id: str, now: float) -> None:
        self._rate[adapter] = (self.live_rate(adapter, now) + 1.0 / self.tau_s, now)
        self.last_routed.setdefault(replica_id, {})[adapter] = now
        flights = self.in_flight.setdefault(replica_id, {})
        flights[adapter] = flights.get(adapter, 0) + 1

    def on_finished(self, adapter: str, replica_id: str, now: float) -> None:
        flights = self.in_flight.get(replica_id, {})
        left = flights.get(adapter, 0) - 1
        if left > 0:
            flights[adapter] = left
        else:
            flights.pop(adapter, None)
        self.last_routed.setdefault(replica_id, {})[adapter] = now

    def victim_among(self, last_used: Mapping[str, float], in_use: Collection[str], now: float) -> str:
        """Which idle adapter of a full replica leaves: the least popular, ties by LRU (or LRU alone without
        ``by_popularity``). ``LookupError`` when every one is in use."""
        if not self.by_popularity:
            return least_recent_to_evict(last_used, in_use)
        return least_popular_to_evict(last_used, in_use, lambda name: self.popularity(name, now))

    def victim(self, replica: ReplicaView, now: float) -> str | None:
        """The adapter a load on ``replica`` would evict (None: a slot is free). ``LookupError``: all in use."""
        seen = self.last_routed.get(replica.replica_id, {})
        last_used = {a: seen.get(a, -math.inf) for a in replica.adapters}  # loaded behind our back: oldest
        if len(last_used) < replica.max_loras:
            return None
        return self.victim_among(last_used, self.in_flight.get(replica.replica_id, {}), now)

    def load_cost(self, replica: ReplicaView, adapter: str, now: float) -> float:
        """Relative cost of loading ``adapter`` on ``replica``: 0 for a free slot, the evicted adapter's popularity
        over the requested one's (capped at 1), ``BUSY_SLOTS_COST`` when every slot is in use."""
        try:
            victim = self.victim(replica, now)
        except LookupError:
            return BUSY_SLOTS_COST
        if victim is None:
            return 0.0
        wanted = max(self.popularity(adapter, now), 1e-9)
        return min(1.0, self.popularity(victim, now) / wanted)

    def busy_share(self, replica: ReplicaView) -> float:
        """Share of the replica's slots holding adapters with requests in flight (1: a new adapter waits there)."""
        busy = sum(1 for n in self.in_flight.get(replica.replica_id, {}).values() if n > 0)
        return min(1.0, busy / max(replica.max_loras, 1))

    def forget(self, replica_id: str) -> None:
        self.last_routed.pop(replica_id, None)
        self.in_flight.pop(replica_id, None)

    def pending_on(self, replica_id: str, adapter: str) -> bool:
        """Requests for ``adapter`` are in flight on the replica (it is loaded there, loading, or queued to load)."""
        return self.in_flight.get(replica_id, {}).get(adapter, 0) > 0


def holders(replicas: Sequence[ReplicaView], adapter: str, book: AdapterBook) -> list[ReplicaView]:
    """Replicas holding ``adapter`` (their engine lists it) or about to (requests for it are on their way there)."""
    return [r for r in replicas if adapter in r.adapters or book.pending_on(r.replica_id, adapter)]
