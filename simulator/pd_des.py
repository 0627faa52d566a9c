"""Prefill/decode disaggregation in virtual time (pure): a prefill pool, the KV transfer over a contended link, and
a decode pool that starts from the transferred KV, beside the aggregated fleet it is compared with.

Usage::

    from simulator.pd_des import PDFleet, PDSimulation, pd_requests
    fleet = PDFleet(mode="disaggregated", replicas=4, prefill_replicas=2, profile=profile,
                    kv_bytes_per_token=131072, link_gbps=200)
    result = PDSimulation(fleet).run(pd_requests(times, prompt_tokens=(4096, 16384), output_tokens=(128, 512)))
    result.slo_attainment(ttft_s=3, tpot_s=0.05), result.percentile("tpot_s", 90)

Every replica is ``simulator.engine.Engine``, the same engine model (and calibrated ``EngineProfile``) as
``des.Simulation``: chunked prefill under the token budget, so in an aggregated replica a long prompt's chunks
ride in the decode steps of every running stream and stretch them (the interference disaggregation removes).

* **Aggregated** (``mode="aggregated"``): ``replicas`` mixed replicas; each request goes to one, by
  ``router`` ``least_loaded`` (pending prefill seconds plus running streams) or ``round_robin``.
* **Disaggregated**: ``prefill_replicas`` replicas run each request's prompt with ``max_tokens`` 1 (the proxy's
  prefill request); when its prefill step ends, the prompt's KV (``kv_bytes_per_token`` × prompt tokens) leaves
  over that prefill replica's link: ``link_gbps`` gigabits per second shared equally by the transfers under way
  (processor sharing: contention stretches each one), plus ``link_latency_s``. On arrival a decode replica is
  picked (fewest running streams, then KV use; two clairvoyant pairings know every stream's remaining output tokens:
  ``router="oracle"`` picks the least remaining work, ``"oracle_overlap"`` the fewest stream-steps shared with the
  new stream over its life, Σ min(remaining, its output), which is also what it adds to the others' steps) and the
  KV lands in its cache as prefix blocks; the request then joins the engine,
  which recomputes only the last partial block (vLLM recomputes at least one token) and streams every output token.
  The client's first token is the decode replica's first token, so TTFT holds prefill queue, prefill, transfer and
  the decode admission. When the decode replica has no free blocks for the arriving KV, it prefills the prompt
  itself (vLLM's recompute on a failed KV load), counted in ``extra["kv_recomputed"]``.
  Selective disaggregation: a prompt under ``min_uncached_tokens`` goes straight to a decode replica.

Results are ``results.SimResult`` (per request ``extra``: ``path`` prefill|direct, ``prefill_done_s``,
``transfer_s``); same inputs → identical results (the simulation draws no random numbers).
"""

from __future__ import annotations

import heapq
import itertools
import random
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from capacity.hardware.profiles import EngineProfile
from simulator.engine import PREFILLING, WAITING, Engine, Sequence
from simulator.results import ReplicaRecord, RequestResult, SimResult

_ARRIVAL, _STEP_END, _TRANSFER, _DELIVER = range(4)
_MANY_STEPS = 1 << 30
_HASH_GRAIN = 16  # tokens per prompt hash (simulator.tokens.BLOCK_SIZE_TOKENS)
_ROUTERS = ("least_loaded", "round_robin", "oracle", "oracle_overlap")


@dataclass(frozen=True)
class PDRequest:
    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int


def pd_requests(
    times: Iterable[float],
    *,
    prompt_tokens: tuple[int, int],
    output_tokens: tuple[int, int],
    seed: int = 0,
    prefix: str = "pd",
) -> Iterator[PDRequest]:
    """Independent prompts with uniformly drawn lengths (no shared prefix: every prompt is computed once)."""
    rng = random.Random(f"pd-{prefix}-{seed}")
    for i, t in enumerate(times):
        yield PDRequest(f"{prefix}-{i}", t, rng.randint(*prompt_tokens), rng.randint(*output_tokens))


def pd_mix_requests(
    times: Iterable[float], *, shapes: list[tuple[float, tuple[int, int], tuple[int, int]]], seed: int = 0,
    prefix: str = "mix",
) -> Iterator[PDRequest]:  # fmt: skip
    """Each request takes one of ``shapes`` (weight, prompt range, output range) at random, by weight."""
    rng = random.Random(f"pd-{prefix}-{seed}")
    weights = [w for w, _, _ in shapes]
    for i, t in enumerate(times):
        _, prompt, output = rng.choices(shapes, weights)[0]
        yield PDRequest(f"{prefix}-{i}", t, rng.randint(*prompt), rng.randint(*output))


@dataclass(frozen=True)
class PDFleet:
    profile: EngineProfile  # the mixed replicas' (aggregated) or the decode replicas' (disaggregated)
    replicas: int
    mode: str = "aggregated"
    prefill_replicas: int = 0
    prefill_profile: EngineProfile | None = None  # None: the same as ``profile``
    kv_bytes_per_token: float = 0.0
    link_gbps: float = 100.0  # each prefill replica's link to the decode pool, gigabits per second
    link_latency_s: float = 0.0
    min_uncached_tokens: int = 0
    router: str = "least_loaded"

    def __post_init__(self):
        if self.mode not in ("aggregated", "disaggregated"):
            raise ValueError("mode must be 'aggregated' or 'disaggregated'")
        if self.router not in _ROUTERS:
            raise ValueError(f"router must be one of {', '.join(_ROUTERS)}")
        if self.replicas < 1 or (self.mode == "disaggregated" and self.prefill_replicas < 1):
            raise ValueError("every pool needs at least one replica")
        if self.mode == "disaggregated" and (self.link_gbps <= 0 or self.kv_bytes_per_token <= 0):
            raise ValueError("a disaggregated fleet needs link_gbps > 0 and kv_bytes_per_token > 0")

    @property
    def gpus(self) -> int:
        prefill = self.prefill_profile or self.profile
        return self.replicas * self.profile.gpus + self.prefill_replicas * prefill.gpus


class _Link:
    """One prefill replica's outgoing link: the transfers under way share its bandwidth equally."""

    def __init__(self, bytes_per_s: float):
        self.rate = bytes_per_s
        self.active: dict[str, float] = {}  # request id → bytes left
        self.updated_s = 0.0
        self.version = 0

    def advance(self, now: float) -> None:
        if self.active:
            moved = (now - self.updated_s) * self.rate / len(self.active)
            for key in self.active:
                self.active[key] -= moved
        self.updated_s = now

    def next_done_s(self) -> float | None:
        if not self.active:
            return None
        return self.updated_s + max(0.0, min(self.active.values())) * len(self.active) / self.rate


@dataclass(eq=False)
class _Node:
    replica_id: str
    role: str  # mixed | prefill | decode
    engine: Engine
    record: ReplicaRecord
    link: _Link | None = None
    plan: object = None
    version: int = 0
    in_flight: dict[str, tuple[PDRequest, RequestResult, Sequence]] = field(default_factory=dict)

    def pending_prefill_tokens(self) -> int:
        total = 0
        for _, _, seq in self.in_flight.values():
            if seq.state == WAITING:
                total += seq.prompt_tokens
            elif seq.state == PREFILLING:
                total += seq.prefill_left
        return total

    def remaining_output_tokens(self) -> int:
        return sum(seq.remaining for _, _, seq in self.in_flight.values())

    def overlap_tokens(self, output_tokens: int) -> int:
        """The steps the streams here share with a new stream of ``output_tokens`` over its life."""
        return sum(min(seq.remaining, output_tokens) for _, _, seq in self.in_flight.values())


class PDSimulation:
    def __init__(self, fleet: PDFleet):
        self.fleet = fleet
        self.now = 0.0
        self._events: list = []
        self._seq = itertools.count()
        self._hash_base = itertools.count(1)
        self._results: list[RequestResult] = []
        self._rr = itertools.count()
        self._transfers: dict[str, tuple[PDRequest, RequestResult, list[int]]] = {}
        decode_role = "mixed" if fleet.mode == "aggregated" else "decode"
        self.decode = [self._node(f"{decode_role}-{i}", decode_role, fleet.profile) for i in range(fleet.replicas)]
        prefill_profile = fleet.prefill_profile or fleet.profile
        self.prefill = [self._node(f"prefill-{i}", "prefill", prefill_profile) for i in range(fleet.prefill_replicas)]
        for node in self.prefill:
            node.link = _Link(fleet.link_gbps * 1e9 / 8)

    @staticmethod
    def _node(replica_id: str, role: str, profile: EngineProfile) -> _Node:
        record = ReplicaRecord(
            replica_id=replica_id, profile=profile.name, gpus=profile.gpus, added_s=0.0, ready_s=0.0
        )
        return _Node(replica_id, role, Engine(profile), record)

    # -- event loop --------------------------------------------------------------------------------
    def _push(self, at: float, kind: int, payload) -> None:
        heapq.heappush(self._events, (at, next(self._seq), kind, payload))

    def run(self, requests: Iterable[PDRequest]) -> SimResult:
        started = time.perf_counter()
        arrivals = iter(requests)
        self._next_arrival(arrivals)
        while self._events:
            at, _, kind, payload = heapq.heappop(self._events)
            self.now = at
            if kind == _ARRIVAL:
                self._arrive(payload)
                self._next_arrival(arrivals)
            elif kind == _STEP_END:
                node, version = payload
                if version == node.version:
                    self._step_end(node)
            elif kind == _TRANSFER:
                link_node, version = payload
                if version == link_node.link.version:
                    self._transfer_progress(link_node)
            elif kind == _DELIVER:
                self._deliver(*payload)
        nodes = self.prefill + self.decode
        for node in nodes:
            stats = node.engine.stats
            node.record.prompt_tokens, node.record.generation_tokens = stats.prompt_tokens, stats.generation_tokens
            node.record.prefix_queries, node.record.prefix_hits = stats.prefix_queries, stats.prefix_hits
            node.record.preemptions = stats.preemptions
        return SimResult(
            requests=self._results,
            replicas=[n.record for n in nodes],
            end_s=self.now,
            wall_s=time.perf_counter() - started,
        )

    def _next_arrival(self, arrivals) -> None:
        request = next(arrivals, None)
        if request is not None:
            self._push(request.arrival_s, _ARRIVAL, request)

    # -- requests ----------------------------------------------------------------------------------
    def _arrive(self, request: PDRequest) -> None:
        result = RequestResult(
            request_id=request.request_id,
            tenant="default",
            priority=0,
            arrival_s=request.arrival_s,
            prompt_tokens=request.prompt_tokens,
            max_tokens=request.output_tokens,
            mu=0.0,
        )
        self._results.append(result)
        hashes = self._hashes(request.prompt_tokens)
        fleet = self.fleet
        if fleet.mode == "disaggregated" and request.prompt_tokens >= fleet.min_uncached_tokens:
            result.extra["path"] = "prefill"
            node = self._pick_prefill()
            self._send(node, request, result, Sequence(request.request_id, request.prompt_tokens, 1, hashes))
            return
        if fleet.mode == "disaggregated":
            result.extra["path"] = "direct"
        node = self._pick_decode(request)
        seq = Sequence(request.request_id, request.prompt_tokens, request.output_tokens, hashes)
        self._send(node, request, result, seq)

    def _hashes(self, prompt_tokens: int) -> list[int]:
        """Prompt hashes no other request shares (each request's prompt is its own)."""
        base = next(self._hash_base) << 20
        return list(range(base, base + prompt_tokens // _HASH_GRAIN))

    def _send(self, node: _Node, request: PDRequest, result: RequestResult, seq: Sequence) -> bool:
        seq.arrival_s = self.now
        try:
            node.engine.add(seq)
        except ValueError as exc:  # longer than the model's context: vLLM's 400
            result.status, result.reason, result.finish_s = "error", str(exc), self.now
            return False
        if result.dispatch_s is None:
            result.dispatch_s = self.now
        if node.role == "prefill":
            result.extra["prefill_replica"] = node.replica_id
        else:
            result.replica_id = node.replica_id
        node.in_flight[request.request_id] = (request, result, seq)
        node.record.requests += 1
        self._kick(node)
        return True

    # -- routing -----------------------------------------------------------------------------------
    def _pick_prefill(self) -> _Node:
        if self.fleet.router == "round_robin":
            return self.prefill[next(self._rr) % len(self.prefill)]
        return min(self.prefill, key=lambda n: (n.pending_prefill_tokens(), len(n.in_flight)))

    def _pick_decode(self, request: PDRequest) -> _Node:
        nodes, router = self.decode, self.fleet.router
        if router == "round_robin":
            return nodes[next(self._rr) % len(nodes)]
        if router == "oracle":
            return min(nodes, key=lambda n: (n.remaining_output_tokens(), n.engine.kv_usage))
        if router == "oracle_overlap":
            out = request.output_tokens
            return min(nodes, key=lambda n: (n.overlap_tokens(out), n.engine.kv_usage))
        if self.fleet.mode == "aggregated":
            rate, t0 = self.fleet.profile.prefill_tokens_per_s, self.fleet.profile.decode_t0_s
            return min(nodes, key=lambda n: n.pending_prefill_tokens() / rate + t0 * len(n.in_flight))
        return min(nodes, key=lambda n: (len(n.in_flight), n.engine.kv_usage))

    # -- engines -----------------------------------------------------------------------------------
    def _kick(self, node: _Node) -> None:
        """A request joined ``node``: start its engine, or end its batch of steps with the step under way."""
        plan = node.plan
        if plan is None:
            self._start_plan(node)
        elif plan.steps > 1:
            done = plan.steps_started_before(self.now - plan.start_s)
            if done < plan.steps:
                plan.steps = done
                node.version += 1
                self._push(plan.start_s + plan.duration(done), _STEP_END, (node, node.version))

    def _start_plan(self, node: _Node) -> None:
        plan = node.engine.plan(self.now, _MANY_STEPS)
        node.plan = plan
        if plan is not None:
            node.version += 1
            self._push(plan.start_s + plan.duration(), _STEP_END, (node, node.version))

    def _step_end(self, node: _Node) -> None:
        plan, node.plan = node.plan, None
        finished = node.engine.commit(plan, plan.steps, self.now)
        node.record.busy_s += plan.duration(plan.steps)
        for seq in finished:
            request, result, _ = node.in_flight.pop(seq.request_id)
            if node.role == "prefill":
                self._prefilled(node, request, result, seq)
            else:
                self._complete(request, result, seq)
        self._start_plan(node)

    def _complete(self, request: PDRequest, result: RequestResult, seq: Sequence) -> None:
        result.status = "ok"
        if result.scheduled_s is None:
            result.scheduled_s = seq.scheduled_s
        result.first_token_s, result.finish_s = seq.first_token_s, self.now
        result.output_tokens, result.cached_tokens, result.preemptions = (
            seq.generated,
            seq.cached_tokens,
            seq.preemptions,
        )
        if result.extra.get("path") == "prefill":
            block = self.fleet.profile.block_size
            # The KV was evicted before the engine took the request (no room), and it prefilled the prompt itself.
            result.extra["kv_recomputed"] = seq.cached_tokens < (request.prompt_tokens - 1) // block * block

    # -- the KV transfer ---------------------------------------------------------------------------
    def _prefilled(self, node: _Node, request: PDRequest, result: RequestResult, seq: Sequence) -> None:
        result.scheduled_s, result.extra["prefill_done_s"] = seq.scheduled_s, self.now
        link = node.link
        link.advance(self.now)
        link.active[request.request_id] = request.prompt_tokens * self.fleet.kv_bytes_per_token
        self._transfers[request.request_id] = (request, result, seq.block_hashes)
        self._reschedule(node)

    def _reschedule(self, node: _Node) -> None:
        link = node.link
        link.version += 1
        at = link.next_done_s()
        if at is not None:
            self._push(at, _TRANSFER, (node, link.version))

    def _transfer_progress(self, node: _Node) -> None:
        link = node.link
        link.advance(self.now)
        # Done: what is left is rounding (less than a microsecond of the link at its full rate).
        done = [key for key, left in link.active.items() if left <= 1e-6 * link.rate]
        if not done:  # float noise put the end a hair later: finish the smallest
            done = [min(link.active, key=link.active.__getitem__)]
        for key in done:
            del link.active[key]
            self._push(self.now + self.fleet.link_latency_s, _DELIVER, (node, key))
        self._reschedule(node)

    def _deliver(self, prefill_node: _Node, request_id: str) -> None:
        request, result, hashes = self._transfers.pop(request_id)
        result.extra["transfer_s"] = self.now - result.extra["prefill_done_s"]
        node = self._pick_decode(request)
        kv, stride = node.engine.kv, node.engine.profile.block_size // _HASH_GRAIN
        blocks = hashes[stride - 1 :: stride]  # the engine's own blocks (Engine.add)
        if len(blocks) <= kv.free_blocks:
            kv.acquire(blocks, 0)  # the KV lands as this prompt's prefix blocks …
            kv.release(blocks, 0)  # … cached, for the request to hit when the engine admits it
        seq = Sequence(request.request_id, request.prompt_tokens, request.output_tokens, hashes)
        self._send(node, request, result, seq)
