"""What a discrete-event run produces: one record per request and per replica, plus fleet aggregates (pure).

Latencies are in simulated seconds. A request's ``status`` is ``ok`` (completed), ``rejected`` (429 from the
admission controller, ``retry_after_s`` set), ``aborted`` (its replica was removed or failed under it) or
``unserved`` (still queued or running when the run ended).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from capacity.percentiles import percentile


@dataclass(eq=False)
class RequestResult:
    request_id: str
    tenant: str
    priority: int
    arrival_s: float
    prompt_tokens: int
    max_tokens: int
    mu: float
    session_id: str | None = None
    priority_class: str = "standard"
    status: str = "unserved"
    replica_id: str | None = None
    dispatch_s: float | None = None  # left the admission queue / backlog, sent to a replica
    scheduled_s: float | None = None  # first scheduled by the engine
    first_token_s: float | None = None
    finish_s: float | None = None
    output_tokens: int = 0
    cached_tokens: int = 0
    preemptions: int = 0
    retry_after_s: float | None = None
    reason: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def queue_s(self) -> float | None:
        """Arrival → first scheduled on a replica (admission queue + engine waiting queue)."""
        return None if self.scheduled_s is None else self.scheduled_s - self.arrival_s

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        if self.finish_s is None or self.first_token_s is None or self.output_tokens < 2:
            return None if self.finish_s is None else 0.0
        return (self.finish_s - self.first_token_s) / (self.output_tokens - 1)

    @property
    def e2e_s(self) -> float | None:
        return None if self.finish_s is None else self.finish_s - self.arrival_s

    def meets(self, *, ttft_s: float | None = None, tpot_s: float | None = None) -> bool:
        """Completed and within every given latency SLO (a *good* request, DistServe's goodput)."""
        if self.status != "ok":
            return False
        if ttft_s is not None and self.ttft_s > ttft_s:
            return False
        return tpot_s is None or self.tpot_s <= tpot_s


@dataclass(eq=False)
class ReplicaRecord:
    replica_id: str
    profile: str
    gpus: int
    added_s: float
    ready_s: float | None = None
    removed_s: float | None = None
    failed_s: float | None = None  # crashed (fault injection); GPUs held until removed
    busy_s: float = 0.0  # time the engine spent running steps
    requests: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    preemptions: int = 0
    capacity_type: str = "on_demand"  # or "spot" (spot.py)
    noticed_s: float | None = None  # spot: the interruption notice came
    reclaimed_s: float | None = None  # spot: the cloud took it back (still serving at the deadline)

    def replica_seconds(self, end_s: float) -> float:
        """Seconds this replica held its GPUs (cold start included: the GPU is allocated while it loads)."""
        return (self.removed_s if self.removed_s is not None else end_s) - self.added_s


@dataclass
class SimResult:
    requests: list[RequestResult]
    replicas: list[ReplicaRecord]
    end_s: float
    wall_s: float = 0.0
    timeline: list[dict] = field(default_factory=list)  # one sample per tick: t, ready, starting, in_flight, queued

    def subset(self, keep) -> SimResult:
        """The same run restricted to the requests ``keep(request)`` accepts (e.g. one tenant or class);
        replica figures stay fleet-wide."""
        return SimResult([r for r in self.requests if keep(r)], self.replicas, self.end_s, self.wall_s, self.timeline)

    def by(self, attribute: str) -> dict:
        """``{value: subset}`` per value of a request attribute: ``by("tenant")``, ``by("priority_class")``."""
        values = sorted({getattr(r, attribute) for r in self.requests}, key=str)
        return {v: self.subset(lambda r, v=v: getattr(r, attribute) == v) for v in values}

    def completed(self) -> list[RequestResult]:
        return [r for r in self.requests if r.status == "ok"]

    def latencies(self, name: str) -> list[float]:
        """``ttft_s``, ``tpot_s``, ``e2e_s`` or ``queue_s`` of the completed requests."""
        return [getattr(r, name) for r in self.completed() if getattr(r, name) is not None]

    def percentile(self, name: str, q: float) -> float | None:
        return percentile(self.latencies(name), q)

    def slo_attainment(self, *, ttft_s: float | None = None, tpot_s: float | None = None) -> float:
        """Share of all arrived requests (rejected ones included) that completed within the SLOs."""
        if not self.requests:
            return 1.0
        return sum(r.meets(ttft_s=ttft_s, tpot_s=tpot_s) for r in self.requests) / len(self.requests)

    def goodput_rps(self, *, ttft_s: float | None = None, tpot_s: float | None = None) -> float:
        good = sum(r.meets(ttft_s=ttft_s, tpot_s=tpot_s) for r in self.requests)
        return good / self.end_s if self.end_s > 0 else 0.0

    def rate(self, status: str) -> float:
        return sum(r.status == status for r in self.requests) / len(self.requests) if self.requests else 0.0

    def replica_seconds(self) -> float:
        return sum(rep.replica_seconds(self.end_s) for rep in self.replicas)

    def gpu_hours(self) -> float:
        return sum(rep.replica_seconds(self.end_s) * rep.gpus for rep in self.replicas) / 3600

    def prefix_hit_rate(self) -> float:
        queries = sum(rep.prefix_queries for rep in self.replicas)
        return sum(rep.prefix_hits for rep in self.replicas) / queries if queries else 0.0

    def load_imbalance(self) -> float:
        """max / mean busy time over replicas that served anything (1.0 = perfectly even)."""
        busy = [rep.busy_s for rep in self.replicas if rep.requests]
        return max(busy) / (sum(busy) / len(busy)) if busy and sum(busy) else 1.0

    def digest(self) -> str:
        """A fingerprint of every request's outcome, for determinism checks."""
        h = hashlib.sha256()
        for r in self.requests:
            h.update(
                f"{r.request_id}|{r.status}|{r.replica_id}|{r.first_token_s!r}|{r.finish_s!r}|{r.cached_tokens}\n".encode()
            )
        return h.hexdigest()

    def summary(self) -> dict:
        done = self.completed()
        return {
            "requests": len(self.requests),
            "completed": len(done),
            "rejected_rate": round(self.rate("rejected"), 4),
            "ttft_p50_s": _round(self.percentile("ttft_s", 50)),
            "ttft_p95_s": _round(self.percentile("ttft_s", 95)),
            "tpot_p50_s": _round(self.percentile("tpot_s", 50)),
            "tpot_p95_s": _round(self.percentile("tpot_s", 95)),
            "e2e_p50_s": _round(self.percentile("e2e_s", 50)),
            "prefix_hit_rate": round(self.prefix_hit_rate(), 4),
            "gpu_hours": round(self.gpu_hours(), 4),
            "load_imbalance": round(self.load_imbalance(), 3),
            "simulated_s": round(self.end_s, 3),
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
