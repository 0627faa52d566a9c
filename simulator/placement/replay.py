"""A stream of replica requests replayed on a cluster under one policy, in event time: each request arrives (an
endpoint scales up), waits until its policy places it, and leaves at its release time (the endpoint scales down),
placed or not. Figures: GPU allocation, pending time, groups across domains, and deadlocks, the moments when replicas
hold parts of groups, no GPU is free and none of them can start (docs/placement.md, "The replay")."""

from __future__ import annotations

from dataclasses import dataclass, field

from capacity.percentiles import percentile
from placement.cluster import Cluster, Node
from placement.policies import GANG_POLICIES, POLICIES, naive_next_gpu


@dataclass(frozen=True)
class Request:
    id: int
    endpoint: str
    size: int  # GPUs of one replica (its tensor-parallel size, times pipeline stages across nodes)
    arrive_s: float
    release_s: float


@dataclass
class Replay:
    policy: str
    started: dict[int, float] = field(default_factory=dict)  # request id -> start time
    groups_across_domains: int = 0
    multi_node_groups: int = 0
    deadlocks: int = 0
    deadlocked_s: float = 0.0
    held_idle_gpu_s: float = 0.0  # GPUs held by replicas that have not started (naive)
    allocated_gpu_s: float = 0.0
    demanded_gpu_s: float = 0.0
    pending_s: list[float] = field(default_factory=list)
    pending_by_size: dict[int, list[float]] = field(default_factory=dict)
    capacity_gpu_s: float = 0.0

    def figures(self) -> dict:
        return {
            "deadlocks": self.deadlocks,
            "deadlocked_s": round(self.deadlocked_s, 1),
            "gpu_allocation": round(self.allocated_gpu_s / self.demanded_gpu_s, 4) if self.demanded_gpu_s else None,
            "cluster_utilisation": round(self.allocated_gpu_s / self.capacity_gpu_s, 4)
            if self.capacity_gpu_s
            else None,
            "held_idle_gpu_h": round(self.held_idle_gpu_s / 3600, 1),
            "groups_across_domains": self.groups_across_domains if self.policy != "bound" else None,
            "multi_node_groups": self.multi_node_groups,
            "started": len(self.started),
            "pending_p50_s": percentile(self.pending_s, 50),
            "pending_p99_s": percentile(self.pending_s, 99),
            "pending_max_s_by_size": {size: max(w) for size, w in sorted(self.pending_by_size.items())},
        }

    def waited(self, request: Request, seconds: float) -> None:
        self.pending_s.append(seconds)
        self.pending_by_size.setdefault(request.size, []).append(seconds)


def fluid_allocation(requests: list[Request], gpus: int) -> float:
    """A ceiling no policy passes: at each moment at most min(cluster, demand) GPUs serve, over the demand."""
    edges = sorted({r.arrive_s for r in requests} | {r.release_s for r in requests})
    change: dict[float, int] = {}
    for r in requests:
        change[r.arrive_s] = change.get(r.arrive_s, 0) + r.size
        change[r.release_s] = change.get(r.release_s, 0) - r.size
    served = demanded = 0.0
    level = 0
    for t0, t1 in zip(edges, edges[1:], strict=False):
        level += change.get(t0, 0)
        served += min(level, gpus) * (t1 - t0)
        demanded += level * (t1 - t0)
    return served / demanded if demanded else 1.0


def replay(nodes: list[Node], requests: list[Request], policy: str) -> Replay:
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; expected one of {', '.join(POLICIES)}")
    cluster = Cluster(nodes)
    result = Replay(policy)
    by_id = {r.id: r for r in requests}
    events = sorted([(r.release_s, 0, r.id) for r in requests] + [(r.arrive_s, 1, r.id) for r in requests])
    pending: list[int] = []  # arrival order
    deadlocked = False
    last = events[0][0] if events else 0.0
    for i, (time_s, kind, rid) in enumerate(events):
        if i == 0 or time_s != events[i - 1][0]:
            span = time_s - last
            result.deadlocked_s += span if deadlocked else 0.0
            result.held_idle_gpu_s += span * sum(len(cluster.held.get(p, ())) for p in pending)
            last = time_s
        request = by_id[rid]
        apply_event(cluster, pending, request, kind, result)
        if i + 1 < len(events) and events[i + 1][0] == time_s:
            continue  # everything that happens at one moment happens before the scheduler looks
        if policy == "naive":
            started = _naive_pass(cluster, pending, by_id)
        else:
            started = gang_pass(cluster, pending, by_id, GANG_POLICIES[policy])
        for sid in started:
            record_start(cluster, result, by_id[sid], time_s)
            pending.remove(sid)
        now_deadlocked = policy == "naive" and _is_deadlock(cluster, pending, by_id)
        result.deadlocks += now_deadlocked and not deadlocked
        deadlocked = now_deadlocked
    if requests:
        result.capacity_gpu_s = cluster.size * (max(r.release_s for r in requests) - min(r.arrive_s for r in requests))
    return result


def apply_event(cluster: Cluster, pending: list[int], request: Request, kind: int, result: Replay) -> None:
    """Kind 0, a release: the replica leaves, or its request is withdrawn before it started (it waited until then);
    kind 1, an arrival: it joins the queue, its GPU-seconds demanded."""
    if kind == 0:
        cluster.release(request.id)
        if request.id in pending:
            pending.remove(request.id)
            result.waited(request, request.release_s - request.arrive_s)
    else:
        pending.append(request.id)
        result.demanded_gpu_s += request.size * (request.release_s - request.arrive_s)


def record_start(cluster: Cluster, result: Replay, request: Request, time_s: float) -> None:
    gpus = cluster.held[request.id]
    result.started[request.id] = time_s
    result.waited(request, time_s - request.arrive_s)
    result.allocated_gpu_s += request.size * (request.release_s - time_s)
    result.groups_across_domains += len(cluster.domains_of(gpus)) > 1
    result.multi_node_groups += len({g.node for g in gpus}) > 1


def gang_pass(cluster: Cluster, pending: list[int], by_id, place) -> list[int]:
    """Every waiting replica in arrival order, each placed whole if its policy finds room (a later, smaller one may
    start before an earlier one that does not fit)."""
    started = []
    for rid in pending:
        gpus = place(cluster, by_id[rid].size)
        if gpus is not None:
            cluster.take(rid, gpus)
            started.append(rid)
    return started


def _naive_pass(cluster: Cluster, pending: list[int], by_id) -> list[int]:
    """Per-GPU scheduling: the waiting replicas' ranks take free GPUs in turn, one each per round (ranks of replicas
    asked for together interleave), and a replica starts once it holds all of its group."""
    while True:
        hungry = [rid for rid in pending if len(cluster.held.get(rid, ())) < by_id[rid].size]
        if not hungry:
            break
        took = False
        for rid in hungry:
            gpu = naive_next_gpu(cluster)
            if gpu is None:
                break
            cluster.take(rid, [gpu])
            took = True
        if not took or cluster.free_count() == 0:
            break
    return [rid for rid in pending if len(cluster.held.get(rid, ())) == by_id[rid].size]


def _is_deadlock(cluster: Cluster, pending: list[int], by_id) -> bool:
    """No GPU free, two or more waiting replicas hold part of their groups, and what they hold together would start
    one of them: the GPUs are there, split so that none can run until some other replica leaves."""
    holders = [rid for rid in pending if cluster.held.get(rid)]
    if cluster.free_count() or len(holders) < 2:
        return False
    held = sum(len(cluster.held[rid]) for rid in holders)
    return held >= min(by_id[rid].size for rid in holders)
