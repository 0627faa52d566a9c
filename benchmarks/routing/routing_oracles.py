"""Upper-bound routers for ``bench routing``: references with full knowledge of the workload, not product policies.

* ``AssignmentOracle`` knows each request's prefix group (or chat session) and the groups' popularity. Before
  the run it deals the groups out to replicas by longest-processing-time first, in proportion to each replica's
  speed (MU capacity): a group more popular than one replica's share is replicated over as many replicas as its
  share needs. Each group then stays where it was put (no prefix is duplicated beyond that, nothing moves under
  load noise); among a group's replicas the least loaded takes the request. Sessions are placed on their first
  turn on the least loaded replica and never move.
* ``OutstandingWorkOracle`` (for independent prompts) knows every request's true output length and sends each
  to the replica with the least outstanding true work (prompt and output tokens in MU) per unit of speed.

Neither is a proof of optimality (a dynamic policy can beat a static partition under a burst), so the suite
reports each policy's ratio to it, which can exceed 1. ``pooled_profile`` gives the router-independent ceilings beside
them: the whole fleet as one engine (n× as fast: no placement of requests on separate replicas beats it), and a
perfectly balanced fleet sharing one memory and one queue (tighter, an estimate).
"""

from __future__ import annotations

import math

from capacity.hardware.profiles import EngineProfile
from gateway.routing.baselines import RouterBase


def _load(view) -> float:
    return view.in_flight_mu / max(view.mu_capacity, 1e-9)


class AssignmentOracle(RouterBase):
    name = "upper_bound"

    def __init__(self, *, weights: list[float] | None = None, **kwargs):
        super().__init__(**kwargs)
        self.weights = weights
        self._homes: dict = {}
        self._planned = False

    def _plan(self, candidates) -> None:
        """LPT: the most popular groups first, each to the replica(s) with the least planned load per speed."""
        self._planned = True
        if self.weights is None:
            return
        ids = sorted(c.replica_id for c in candidates)
        speed = {c.replica_id: max(c.mu_capacity, 1e-9) for c in candidates}
        share = sum(speed.values())
        planned = dict.fromkeys(ids, 0.0)
        for group in sorted(range(len(self.weights)), key=lambda g: -self.weights[g]):
            weight = self.weights[group]
            copies = max(1, math.ceil(weight * share / max(speed.values()) - 1e-9))
            chosen = sorted(ids, key=lambda r: (planned[r] / speed[r], r))[:copies]
            for r in chosen:
                planned[r] += weight / copies
            self._homes[group] = chosen

    def pick(self, request, replicas, now):
        candidates = self.candidates(replicas, request)
        if not candidates:
            return None
        if not self._planned:
            self._plan(candidates)
        group = request.extra.get("workload", {}).get("group")
        by_id = {c.replica_id: c for c in candidates}
        homes = [by_id[r] for r in self._homes.get(group, ()) if r in by_id]
        if not homes:
            if group is None:
                return min(candidates, key=_load).replica_id
            # Unplanned groups (uniform popularity, sessions): placed on first sight, least planned load first.
            chosen = min(candidates, key=lambda c: (_load(c), c.replica_id))
            self._homes[group] = [chosen.replica_id]
            return chosen.replica_id
        return min(homes, key=_load).replica_id


class OutstandingWorkOracle(RouterBase):
    name = "upper_bound"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._work: dict[str, float] = {}
        self._sent: dict[str, tuple[str, float]] = {}

    @staticmethod
    def true_mu(request) -> float:
        out = request.extra.get("workload", {}).get("true_output_tokens", request.extra.get("max_tokens", 0))
        return request.extra.get("prompt_tokens", 0) / 1000 + out / 100

    def pick(self, request, replicas, now):
        candidates = self.candidates(replicas, request)
        if not candidates:
            return None
        return min(
            candidates, key=lambda c: (self._work.get(c.replica_id, 0.0) / max(c.mu_capacity, 1e-9), c.replica_id)
        ).replica_id

    def on_routed(self, request, replica_id, now):
        mu = self.true_mu(request)
        self._work[replica_id] = self._work.get(replica_id, 0.0) + mu
        self._sent[request.request_id] = (replica_id, mu)

    def on_finished(self, request, replica_id, now):
        sent = self._sent.pop(request.request_id, None)
        if sent is not None:
            self._work[sent[0]] -= sent[1]


def pooled_profile(profile: EngineProfile, n: int, *, balanced: bool = False) -> EngineProfile:
    """``n`` replicas of ``profile`` as one engine with n× their KV blocks, batch limits and prefill rate: every
    cached prefix held once for the whole fleet, every request served from one queue.

    By default the engine is also n× as fast: every step's costs, fixed ones included, over n. It then does in one
    step what the n replicas' steps do together in less time than the slowest of them, so no router places
    requests on the separate replicas better (the resource-pooling relaxation: one server n× as fast bounds n
    servers). That bound is loose: each request is also served n× faster than any replica can, which shortens
    every request's hold on the KV cache and, in a closed loop, brings the next chat turn sooner.

    ``balanced`` keeps a replica's pace: a decode step of n·B sequences over n·C context takes what one replica's
    step for B and C takes (fixed cost kept, per-sequence and per-token costs over n), and a prefill step computes n
    replicas' chunks in one replica's time (its overhead over n as well, since one engine takes a prefill step for
    nearly every arrival where each replica takes one for an n-th of them; kept whole, that overhead stalls every
    sequence for every arrival, and the engine loses to routers on mixed lengths and multi-turn chat). That is a
    perfectly balanced fleet sharing one memory and one queue: tighter, and an estimate rather than a proof, as a
    fleet's unbalanced replicas can serve some sequences faster than the balanced pace (docs/algorithms.md)."""
    if n < 1:
        raise ValueError("a pooled fleet needs at least one replica")
    fixed = 1 if balanced else n
    return profile.with_options(
        name=f"{profile.name}-{'balanced' if balanced else 'pooled'}-{n}",
        max_num_seqs=profile.max_num_seqs * n,
        max_num_batched_tokens=profile.max_num_batched_tokens * n,
        num_gpu_blocks=profile.num_gpu_blocks * n,
        decode_t0_s=profile.decode_t0_s / fixed,
        decode_per_seq_s=profile.decode_per_seq_s / n,
        decode_per_ctx_token_s=profile.decode_per_ctx_token_s / n,
        prefill_overhead_s=profile.prefill_overhead_s / n,
        prefill_tokens_per_s=profile.prefill_tokens_per_s * n,
        prefill_per_ctx_token_s=profile.prefill_per_ctx_token_s / n,
    )
