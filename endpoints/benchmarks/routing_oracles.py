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
reports each policy's ratio to it, which can exceed 1.
"""

from __future__ import annotations

import math

from endpoints.routing.baselines import RouterBase


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
