"""infercap's policy: MU load, prefix affinity, bounded load and session stickiness as a preference (pure).

1. Filter (shared): healthy, not draining, fresh metrics, below the concurrency limit.
2. Bounded load (consistent hashing with bounded loads, Mirrokni et al.): a replica may take the request
   only if its load afterwards stays within ``bound × mean load afterwards``. Load is in-flight model
   units over the replica's MU capacity, so a 2k-token prompt weighs what it costs, not "one request".
   ``load_slack`` requests of this request's size are allowed on top, as CH-BL's ceiling allows one
   ball above ``(1+ε)·m/n``: near idle the mean is close to zero and any single request would
   exceed the bound, scattering every prefix over the fleet.
3. Score the allowed replicas and take the best:
   ``3 × prefix match`` (matched / total prompt blocks, from an index sized like the replica's KV cache)
   ``+ 3 × session`` (the replica this session last used; as strong as the load term, so a turn follows its
   conversation unless the bound or the limit says no)
   ``+ 0.5 × home rank`` (rendezvous hash of the prompt's head: where a new prefix goes, and the order in
   which it spills, so a prefix lives on few replicas and every proxy process agrees; computed from a
   process-independent hash, since Python salts ``hash(str)`` per process)
   ``− 2 × index fill`` (share of the replica's cache already holding routed prefixes: new prefixes go
   where there is room, so cached prefixes spread evenly)
   ``− 2 × extra heads`` (only where the prompt's head, its first 16 blocks, is not cached yet: how many more
   distinct heads the replica holds than the emptiest allowed one. Every head a replica adds costs its whole
   prefix plus its questions in KV blocks; near saturation one group too many is what tips a replica into
   preemption and its TPOT over the SLO, while the group's own load is within Poisson noise. So heads are dealt
   out evenly by count, each group lives on one replica until the bound moves part of it, and a hot group is
   replicated where the fewest groups live. Counted in an eviction-aware table: a head whose opening blocks
   left the replica's LRU index no longer counts.)
   ``− 5 × relative load`` (in-flight MU over the busiest allowed replica's: among the replicas that hold a
   prefix, the one with spare room wins over question-level cache hits; at weight 1 a 10% heavier replica kept
   taking its prefix's traffic until it preempted under overload; 5 rather than 3 since 2026-12-04, chosen on
   the suite's seeds 1 and 3 and judged on 17-22, docs/algorithms.md#load-weight-5; a request naming a LoRA
   adapter keeps 3, ``adapter_load_weight``: the adapter terms below were chosen against it, and 5 cost
   ``bench lora`` 4.5 % of its SLO throughput)
   ``− 2 × queue − 2 × kv`` among the replicas holding the prefix only (``queue_weight``/``kv_weight``, llm-d's
   queue and kv-cache scorers turned into penalties against the best holder: engine queue over the holders'
   min–max spread, free KV below the best holder's; nothing for a non-holder): which holder takes the request is
   also decided by what the MU load does not see, a holder whose KV is saturated (queueing, preempting) while its
   in-flight MU is within the bound. Over all replicas, as llm-d applies them, they pulled requests off their
   prefix's holders and cost the cache-pressure workload's hit rate.
   ``+ 2 × pending prefill`` (``prefill_weight``) in the load itself, bound and load term: the uncached prompt
   tokens (in thousands, as MU) that the router sent to a replica and has not yet seen a first token for
   (``prefill.py``), the replica's queue of prompts to prefill, which a new request's TTFT waits behind. Since
   2026-12-04: on the suite's seed 2 it took cache pressure from 15.2 to 16.3 req/s (TTFT p90 0.91× → 0.66×
   llm-d's); on the held-out seeds cache pressure +3.3 % (TTFT p90 0.97× → 0.84×) against about −1 % on Zipf,
   heterogeneous and shared prefix (docs/algorithms.md#pending-prefill). Requests naming a LoRA adapter are weighed
   by it too since 2026-12-05 (``bench lora``: level on the tuning seeds, +4.3 % SLO req/s on the held-out one).
   Stickiness and affinity are preferences: a sticky replica that is over the bound or at its limit is simply
   not allowed, and the session moves; for the session's own replica the bound is ``session_load_bound`` (1.5),
   since it holds the whole conversation. A request of a chat session weighs load by ``session_load_weight`` (10)
   instead: each conversation's context grows on its replica every turn, so a replica's load grows without any
   new placement, and at 3 the session's own pull (session 3 + prefix up to 3) kept sessions on a replica drifting
   towards the bound until its TPOT failed; first turns likewise go where there is room, as the oracle that pins
   each session to the least loaded replica does. The head terms are scaled by how often heads recur (an exponentially
   weighted share of requests whose head was seen before, starting at 1): a stream of unique prompts has no
   groups, and counting each prompt as one steered it by head counts instead of load.

LoRA (``lora_placement``, docs/lora.md#routing): a request naming an adapter goes only to replicas with adapter slots
(the shared filter). Among them, replicas already holding the adapter within ``adapter_load_bound`` (default 1.5, at least
``load_bound``: a hit saves a 0.5–2 s load) are the only ones allowed, and so is a nearly idle replica holding it
beyond that bound (fewer than ``idle_holder_requests`` in flight, none queued); with none, the replicas within the
plain bound are, scored on top of the terms
above by ``− evict_weight × load cost`` (0 for a free slot, the popularity of the adapter that would be evicted
relative to this one's, 2 when every slot is in use) ``+ adapter_home_weight × home rank of the adapter``. So a
popular adapter stays resident, and a hot one whose holders are all over the bound gets one more replica. The
adapter that then leaves is the least popular idle one (``adapter_victim``, LFU with aging, τ =
``popularity_tau_s``; ``popularity_eviction=False``: LRU), the same one the load cost counted. Popularity adds
``history_weight`` × each adapter's request rate over the last day (``adapter_history``, from the usage records
through the proxy's snapshot: ``set_adapter_history``) to the live decayed rate.

With a ``kv_index`` (``KVBlockIndex`` fed by the engines' KV-cache events) the prefix match of a replica whose
events are usable is what its cache really holds (the request's engine block hashes, ``extra["kv_block_hashes"]``);
or its token ids (``extra["kv_token_ids"]``, the live proxy's), matched against the token keys of the events'
blocks; for a replica whose events stopped, lag or lost batches, and for requests without either, the approximate
index answers, so the router degrades to its event-less behaviour instead of trusting a stale picture. Hardware
speed enters through each replica's MU capacity: load is in-flight MU over it, in the bound and in the load term.
"""

import zlib
from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence

from gateway.routing.base import ReplicaView, RouteRequest
from gateway.routing.baselines import RouterBase
from gateway.routing.kv_index import KVBlockIndex
from gateway.routing.llmd import kv_match_fraction, kv_score, request_hashes
from gateway.routing.lora_placement import BUSY_SLOTS_COST, AdapterBook, holders
from gateway.routing.prefill import PendingPrefill
from gateway.routing.prefix import MAX_PREFIX_BLOCKS, PREFIX_BLOCK_CHARS, PrefixHeads, PrefixIndex


def replica_load(replica: ReplicaView, extra_mu: float = 0.0) -> float:
    """In-flight MU over the replica's MU capacity (after adding ``extra_mu``)."""
    return (replica.in_flight_mu + extra_mu) / max(replica.mu_capacity, 1e-9)


# RouteRequest.extra: which index scored the replica the request went to ("precise": its KV events; "approximate":
# the routed-prompt index, for a replica without usable events or a request without token ids or engine hashes).
PREFIX_SOURCE_KEY = "prefix_source"
_PRECISE_ON = "_precise_on"  # the replicas the precise index scored for this request
# RouteRequest.extra: this pick's prefix match per allowed replica (0–1). Read after the pick by the proxy's
# prefill/decode split: the chosen decode replica's match says how much of the prompt it would prefill itself.
PREFIX_MATCHES_KEY = "_prefix_matches"
_MATCHES = PREFIX_MATCHES_KEY

_MASK64 = (1 << 64) - 1
HOME_KEY = "_home_key"


def stable_hash(text: str) -> int:
    """A hash that is the same in every process (Python's ``hash`` of a str is salted per process)."""
    return zlib.crc32(text.encode("utf-8", "surrogatepass"))


def home_rank(key: int, replica_id: str) -> float:
    """Rendezvous (highest-random-weight) hashing score in [0, 1) of a prompt's head on a replica.

    A new prefix goes to its highest-ranked replica, and when that one is over the bound, to the next in
    the same order; so each prefix lives on as few replicas as possible and is not smeared by load noise.
    Stable across processes (every proxy process, and every benchmark run, places a prefix alike).
    """
    x = (key * 0x9E3779B97F4A7C15 ^ stable_hash(replica_id) * 0xC2B2AE3D27D4EB4F) & _MASK64
    x ^= x >> 31
    x = (x * 0xBF58476D1CE4E5B9) & _MASK64
    x ^= x >> 29
    return (x & 0xFFFFFFFF) / 4294967296.0


def home_key(request: RouteRequest, head_chars: int) -> int:
    """Stable hash of the prompt's head (the part that names its prefix group), computed once per request."""
    key = request.extra.get(HOME_KEY)
    if key is None:
        salt = request.extra.get("cache_salt", "")
        key = request.extra[HOME_KEY] = stable_hash(f"{salt}\x00{request.prompt_text[:head_chars]}")
    return key


class SessionTable:
    """session id → (replica id, last seen), bounded and expiring, so stickiness cannot grow without limit."""

    def __init__(self, max_sessions: int = 100_000, ttl_s: float = 900.0):
        self.max_sessions, self.ttl_s = max_sessions, ttl_s
        self._table: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def get(self, session_id: str | None, now: float) -> str | None:
        if not session_id:
            return None
        entry = self._table.get(session_id)
        if entry is None or now - entry[1] > self.ttl_s:
            return None
        return entry[0]

    def set(self, session_id: str | None, replica_id: str, now: float) -> None:
        if not session_id:
            return
        self._table[session_id] = (replica_id, now)
        self._table.move_to_end(session_id)
        while len(self._table) > self.max_sessions:
            self._table.popitem(last=False)

    def __len__(self) -> int:
        return len(self._table)


class InfercapRouter(RouterBase):
    name = "infercap"

    def __init__(
        self,
        *,
        load_bound: float = 1.15,
        load_slack: float = 2.0,
        prefix_weight: float = 3.0,
        session_weight: float = 3.0,
        load_weight: float = 5.0,
        home_weight: float = 0.5,
        home_blocks: int = 16,
        fill_weight: float = 2.0,
        spread_weight: float = 2.0,
        primary_weight: float = 1.0,
        queue_weight: float = 2.0,
        kv_weight: float = 2.0,
        block_chars: int = PREFIX_BLOCK_CHARS,
        max_blocks: int = MAX_PREFIX_BLOCKS,
        session_ttl_s: float = 900.0,
        max_sessions: int = 100_000,
        kv_index: KVBlockIndex | None = None,
        session_load_bound: float = 1.5,
        session_load_weight: float = 10.0,
        adapter_load_weight: float = 3.0,
        adapter_load_bound: float | None = None,
        evict_weight: float = 3.0,
        adapter_home_weight: float = 3.0,
        slot_weight: float = 3.0,
        popularity_tau_s: float = 60.0,
        popularity_eviction: bool = True,
        adapter_history: Mapping[str, float] | None = None,
        history_weight: float = 10.0,
        idle_holder_requests: int = 8,
        prefill_weight: float = 2.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if prefill_weight < 0:
            raise ValueError("prefill_weight must be ≥ 0")
        self.prefill_weight = prefill_weight
        self.pending_prefill = PendingPrefill()
        if adapter_load_bound is None:
            adapter_load_bound = max(load_bound, 1.5)
        if adapter_load_bound < load_bound:
            raise ValueError("adapter_load_bound must be ≥ load_bound (a replica holding the adapter saves a load)")
        self.adapter_load_bound, self.evict_weight, self.adapter_home_weight = (
            adapter_load_bound,
            evict_weight,
            adapter_home_weight,
        )
        self.slot_weight = slot_weight
        self.idle_holder_requests = idle_holder_requests
        self.adapter_book = AdapterBook(
            popularity_tau_s,
            by_popularity=popularity_eviction,
            history_rates=adapter_history,
            history_weight=history_weight,
        )
        self.kv_index = kv_index
        self.session_load_bound = session_load_bound
        self.session_load_weight = session_load_weight
        self.adapter_load_weight = adapter_load_weight
        if load_bound < 1.0:
            raise ValueError("load_bound must be ≥ 1.0 (1.0 means perfectly even load)")
        if load_slack < 0:
            raise ValueError("load_slack must be ≥ 0")
        self.load_bound, self.load_slack = load_bound, load_slack
        self.prefix_weight, self.session_weight, self.load_weight = prefix_weight, session_weight, load_weight
        self.home_weight, self.home_blocks = home_weight, max(1, home_blocks)
        self.fill_weight, self.queue_weight, self.kv_weight = fill_weight, queue_weight, kv_weight
        self.spread_weight, self.primary_weight = spread_weight, primary_weight
        self.prefix_index = PrefixIndex(block_chars, max_blocks)
        self.heads = PrefixHeads()
        self._seen_heads: OrderedDict[int, None] = OrderedDict()  # bounded LRU of heads routed at least once
        self.max_seen_heads = 65_536
        self.recurrence = 1.0  # EWMA of "this request's head was seen before"
        self.recurrence_alpha = 0.01
        self.sessions = SessionTable(max_sessions, session_ttl_s)
        self._cache_config: dict[str, tuple[int, int]] = {}

    def within_bound(
        self,
        candidates: Sequence[ReplicaView],
        mu: float,
        bound: float | None = None,
        pending: Mapping[str, float] | None = None,
    ) -> list[ReplicaView]:
        """Replicas whose load after taking ``mu`` stays within bound × the mean load after it (``pending``: MU
        each replica carries on top of its in-flight MU, its prompts waiting for prefill)."""
        bound = self.load_bound if bound is None else bound
        pending = pending or {}
        total_capacity = sum(max(r.mu_capacity, 1e-9) for r in candidates)
        mean_after = (sum(r.in_flight_mu for r in candidates) + sum(pending.values()) + mu) / total_capacity
        loads = {r.replica_id: replica_load(r, mu + pending.get(r.replica_id, 0.0)) for r in candidates}
        allowed = [
            r
            for r in candidates
            if loads[r.replica_id] <= bound * mean_after + self.load_slack * mu / max(r.mu_capacity, 1e-9) + 1e-12
        ]
        if allowed:
            return allowed
        # Reachable only with very uneven capacities: then the least loaded replicas are the right answer.
        lowest = min(loads.values())
        return [r for r in candidates if loads[r.replica_id] <= lowest + 1e-12]

    def _pending_mu(self, candidates: Sequence[ReplicaView]) -> dict[str, float]:
        """Each replica's prompts waiting for prefill, in MU × ``prefill_weight`` (for every request: until
        2026-12-05 a request naming an adapter was not weighed by it, docs/algorithms.md#pending-prefill)."""
        if not self.prefill_weight:
            return {}
        pending = self.pending_prefill
        return {r.replica_id: self.prefill_weight * pending.tokens(r.replica_id) / 1000 for r in candidates}

    def pick(self, request: RouteRequest, replicas: Sequence[ReplicaView], now: float) -> str | None:
        candidates = self.candidates(replicas, request)
        if not candidates:
            return None
        request.extra.pop(_PRECISE_ON, None)  # a queued request is picked again: only this pick's scores count
        mu = max(request.mu, 0.0)
        pending = self._pending_mu(candidates)
        allowed = self.within_bound(candidates, mu, pending=pending)
        hashes = request_hashes(self.prefix_index, request)
        sticky = self.sessions.get(request.session_id, now)
        if (
            sticky is not None
            and self.session_load_bound > self.load_bound
            and all(r.replica_id != sticky for r in allowed)
        ):
            # A session's replica holds its whole conversation: it may stay there up to the looser session bound.
            allowed += [
                r
                for r in self.within_bound(candidates, mu, self.session_load_bound, pending)
                if r.replica_id == sticky
            ]
        adapter_scores: dict[str, float] = {}
        if request.adapter is not None:
            allowed, adapter_scores = self._adapter_choice(request.adapter, candidates, allowed, mu, now)
        # Spare capacity breaks ties between equal affinities; it is relative, so MU units do not matter.
        loads = {r.replica_id: replica_load(r, mu + pending.get(r.replica_id, 0.0)) for r in allowed}
        top_load = max(loads.values()) or 1.0
        head = home_key(request, self.home_blocks * self.prefix_index.block_chars)
        matches = {r.replica_id: self.prefix_match(r.replica_id, request, hashes, now) for r in allowed}
        if self.prefill_weight:
            request.extra[_MATCHES] = matches  # on_routed: what the chosen replica is expected to prefill
        pressure = self._holder_pressure(allowed, matches)
        extra_heads = self._extra_heads(allowed, head, hashes)
        primary = self._primary(allowed, head, hashes)
        load_weight = (
            self.session_load_weight
            if request.session_id is not None
            else self.adapter_load_weight
            if request.adapter is not None
            else self.load_weight
        )
        scored = []
        for r in allowed:
            self._cache_config[r.replica_id] = (r.num_gpu_blocks, r.block_size)
            match = matches[r.replica_id]
            if match > 0 and r.replica_id in request.extra.get(_PRECISE_ON, ()):
                # Its events show the prompt cached there (put there by another proxy process, or before a restart
                # of this one): it holds the head, whatever the routed-prompt table says.
                extra_heads.pop(r.replica_id, None)
            score = (
                self.prefix_weight * match
                + (self.session_weight if r.replica_id == sticky else 0.0)
                + self.home_weight * home_rank(head, r.replica_id)
                - self.fill_weight * self.prefix_index.fill(r.replica_id)
                + pressure.get(r.replica_id, 0.0)
                - self.spread_weight * self.recurrence * extra_heads.get(r.replica_id, 0)
                + (self.primary_weight * self.recurrence if r.replica_id == primary else 0.0)
                - load_weight * loads[r.replica_id] / top_load
                + adapter_scores.get(r.replica_id, 0.0)
            )
            scored.append((score, r))
        best = self._random_best(scored)
        if best is not None:
            precise = request.extra.get(_PRECISE_ON)
            request.extra[PREFIX_SOURCE_KEY] = "precise" if precise and best in precise else "approximate"
        return best

    def _holder_pressure(self, allowed: Sequence[ReplicaView], matches: Mapping[str, float]) -> dict[str, float]:
        """llm-d's queue and kv-cache scorers, only among the replicas holding the prompt's prefix (≤ 0 each).

        Holders: a match above zero and at least half the best one. With two or more, the holder with the shortest
        engine queue and the most free KV loses nothing and the others lose ``queue_weight`` × their queue's share
        of the holders' spread and ``kv_weight`` × how much less free KV they have; a replica that does not hold the
        prefix gets nothing, so these terms choose which holder takes the request and never pull it off its holders
        (over all replicas, as llm-d scores, they cost cache-pressure hit rate). They see what the MU load does not:
        a holder whose KV is saturated queues and preempts while its in-flight MU is still within the bound.
        """
        if not self.queue_weight and not self.kv_weight:
            return {}
        best = max(matches.values(), default=0.0)
        group = [r for r in allowed if 0 < matches[r.replica_id] and matches[r.replica_id] >= 0.5 * best]
        if len(group) < 2:
            return {}
        low = min(r.num_waiting for r in group)
        spread = max(r.num_waiting for r in group) - low
        top_kv = max(kv_score(r) for r in group)
        return {
            r.replica_id: self.kv_weight * (kv_score(r) - top_kv)
            - (self.queue_weight * (r.num_waiting - low) / spread if spread else 0.0)
            for r in group
        }

    def _adapter_choice(
        self, adapter: str, candidates: Sequence[ReplicaView], allowed: list[ReplicaView], mu: float, now: float
    ) -> tuple[list[ReplicaView], dict[str, float]]:
        """The replicas an adapter request may go to, and their placement scores (module docstring, LoRA)."""
        book = self.adapter_book
        held = holders(self.within_bound(candidates, mu, self.adapter_load_bound), adapter, book)
        if not held:
            # Beyond the bound, a replica that holds the adapter loaded and is nearly idle (nothing queued at its
            # engine, fewer than ``idle_holder_requests`` in flight) still beats a load: a decode step over a
            # handful of sequences costs about the same as over one, while a load costs the request 0.5-2 s and
            # evicts someone's adapter. Bounded in requests, not relative load: at low traffic the mean load is
            # small, so "1.5 × the mean" is two or three requests and sent hot adapters to fresh replicas.
            held = [
                r
                for r in candidates
                if adapter in r.adapters and r.num_waiting == 0 and r.in_flight < self.idle_holder_requests
            ]
        if held:
            return held, {}
        # A request waiting for a slot is worse than a busier replica: load only where a slot is free or idle.
        costs = {r.replica_id: book.load_cost(r, adapter, now) for r in candidates}
        loadable = [r for r in allowed if costs[r.replica_id] < BUSY_SLOTS_COST]
        if not loadable:
            loadable = holders(candidates, adapter, book) or [
                r for r in candidates if costs[r.replica_id] < BUSY_SLOTS_COST
            ]
        allowed = loadable or allowed
        key = stable_hash(adapter)
        return allowed, {
            r.replica_id: self.adapter_home_weight * home_rank(key, r.replica_id)
            - self.evict_weight * costs[r.replica_id]
            - self.slot_weight * book.busy_share(r)
            for r in allowed
        }

    def prefix_match(self, replica_id: str, request: RouteRequest, hashes: Sequence[int], now: float) -> float:
        """Matched share of the prompt on the replica: from KV events where they are usable, else approximate."""
        if self.kv_index is not None and self.kv_index.usable(replica_id, now):
            fraction = kv_match_fraction(self.kv_index, replica_id, request)
            if fraction is not None:
                request.extra.setdefault(_PRECISE_ON, set()).add(replica_id)
                return fraction
        return self.prefix_index.match_fraction(replica_id, hashes)

    def _extra_heads(self, allowed: Sequence[ReplicaView], head: int, hashes: Sequence[int]) -> dict[str, int]:
        """Per allowed replica not holding this prompt's head: its distinct heads above the emptiest one's."""
        if not self.spread_weight or len(hashes) < self.home_blocks:
            return {}  # a short prompt has no head worth placing (and would make every prompt a head)
        index = self.prefix_index
        counts = {r.replica_id: self.heads.count(r.replica_id, index) for r in allowed}
        low = min(counts.values())
        return {rid: n - low for rid, n in counts.items() if n > low and not self.heads.has(rid, head, index)}

    def _primary(self, allowed: Sequence[ReplicaView], head: int, hashes: Sequence[int]) -> str | None:
        """The allowed replica holding the oldest copy of this prompt's head (where its group lives)."""
        if not self.primary_weight or len(hashes) < self.home_blocks:
            return None
        copies = [(self.heads.copy_number(r.replica_id, head, self.prefix_index), r.replica_id) for r in allowed]
        held = [c for c in copies if c[0] is not None]
        return min(held)[1] if held else None

    def on_routed(self, request: RouteRequest, replica_id: str, now: float) -> None:
        num_gpu_blocks, block_size = self._cache_config.get(replica_id, (0, 16))
        hashes = request_hashes(self.prefix_index, request)
        self.prefix_index.record(replica_id, hashes, num_gpu_blocks, block_size)
        if len(hashes) >= self.home_blocks:
            head = home_key(request, self.home_blocks * self.prefix_index.block_chars)
            self._note_recurrence(head)
            self.heads.record(replica_id, head, hashes[self.home_blocks - 1], self.prefix_index)
        self.sessions.set(request.session_id, replica_id, now)
        if request.adapter is not None:
            self.adapter_book.on_routed(request.adapter, replica_id, now)
        if self.kv_index is not None:
            self.kv_index.on_routed(replica_id, now)
        if self.prefill_weight:
            match = request.extra.get(_MATCHES, {}).get(replica_id, 0.0)
            tokens = request.extra.get("prompt_tokens", 0) * (1 - match)
            self.pending_prefill.add(replica_id, request.request_id, tokens)

    def on_first_token(self, request: RouteRequest, replica_id: str, now: float) -> None:
        self.pending_prefill.remove(request.request_id)

    def _note_recurrence(self, head: int) -> None:
        seen = self._seen_heads
        recurred = head in seen
        if recurred:
            seen.move_to_end(head)
        else:
            seen[head] = None
            if len(seen) > self.max_seen_heads:
                seen.popitem(last=False)
        self.recurrence += self.recurrence_alpha * (float(recurred) - self.recurrence)

    def set_adapter_history(self, rates: Mapping[str, float]) -> None:
        """The adapters' request rates over the last day (the proxy's config snapshot; ``AdapterBook.set_history``)."""
        self.adapter_book.set_history(rates)

    def adapter_victim(
        self, replica_id: str, last_used: Mapping[str, float], in_use: Collection[str], now: float
    ) -> str:
        """The idle adapter to unload from a full replica (``lora.EvictionRule``; the simulator's slots and the proxy's
        load manager ask it): the least popular, as ``load_cost`` assumed when it placed the request."""
        return self.adapter_book.victim_among(last_used, in_use, now)

    def on_finished(self, request: RouteRequest, replica_id: str, now: float) -> None:
        self.pending_prefill.remove(request.request_id)
        if request.adapter is not None:
            self.adapter_book.on_finished(request.adapter, replica_id, now)

    def forget_replica(self, replica_id: str) -> None:
        """A replica restarted or left: its prefix cache is gone, so is our memory of it."""
        self.adapter_book.forget(replica_id)
        self.pending_prefill.forget_replica(replica_id)
        self.prefix_index.forget(replica_id)
        self.heads.forget(replica_id)
        self._cache_config.pop(replica_id, None)
