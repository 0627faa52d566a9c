"""infercap's placement with the defragmenting step, replayed as ``replay`` replays the others, with each move's cost
as it would be live (make-before-break): a moved replica's copy holds its destination GPUs for ``load_s`` while the
old one keeps serving, and only then is the source freed; the waiting group's GPUs that are free already are held
for it meanwhile. A group opened this way starts when the copies are done (docs/placement.md, "Defragmenting")."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from placement.cluster import Cluster, Node
from placement.defrag import DefragConfig, MoveBudget, Plan, Waiting, propose
from placement.policies import infercap_best_fit
from simulator.placement.replay import Replay, Request, apply_event, gang_pass, record_start


@dataclass
class DefragReplay(Replay):
    """A Replay with what the moves cost: ``moves`` (replicas moved), ``plans`` (groups opened by moving others),
    ``copy_gpu_s`` (GPU-seconds copies held while loading, serving nothing), ``reserved_gpu_s`` (GPU-seconds free
    GPUs were held idle for a group waiting on its copies), ``lost_serving_gpu_s`` (break-before-make: GPU-seconds
    moved replicas did not serve while their copies loaded, taken off the allocation); ``move_log``: (copy started, source freed, replica) for
    each move carried out, source freed None where the replica left during its copy."""

    moves: int = 0
    plans: int = 0
    copy_gpu_s: float = 0.0
    reserved_gpu_s: float = 0.0
    lost_serving_gpu_s: float = 0.0
    hours: float = 0.0
    move_log: list[tuple[float, float | None, object]] = field(default_factory=list)

    def figures(self) -> dict:
        return super().figures() | {
            "moves": self.moves,
            "plans": self.plans,
            "moves_per_hour": round(self.moves / self.hours, 2) if self.hours else None,
            "copy_gpu_h": round(self.copy_gpu_s / 3600, 2),
            "reserved_gpu_h": round(self.reserved_gpu_s / 3600, 2),
            "lost_serving_gpu_h": round(self.lost_serving_gpu_s / 3600, 2),
        }


@dataclass
class _InFlight:
    plan: Plan
    live: set = field(default_factory=set)  # moved replicas still running (one released mid-copy drops out)
    started_s: float = 0.0
    done_s: float = 0.0
    target_live: bool = True  # the target still waits for this plan's GPUs


def copy_owner(owner: object) -> tuple:
    return ("copy", owner)


def reserve_owner(target: object) -> tuple:
    return ("reserve", target)


def defrag_replay(nodes: list[Node], requests: list[Request], config: DefragConfig | None = None) -> DefragReplay:
    """The stream under infercap's best fit, with the defragmenting step after every pass; moves complete ``load_s``
    after they are proposed. Also a look at each request's ``arrive_s + wait_s``, when it first may be helped."""
    config = config or DefragConfig()
    cluster, result, budget = Cluster(nodes), DefragReplay("infercap"), MoveBudget(config.max_moves_per_hour)
    by_id = {r.id: r for r in requests}
    events = sorted(
        [(r.release_s, 0, r.id) for r in requests]
        + [(r.arrive_s, 1, r.id) for r in requests]
        + [(r.arrive_s + config.wait_s, 2, r.id) for r in requests if r.arrive_s + config.wait_s < r.release_s]
    )
    pending: list[int] = []
    flights: dict[object, _InFlight] = {}  # by target
    done: list[tuple[float, int, object]] = []  # (time the copies are loaded, tie-break, target)
    i, last = 0, events[0][0] if events else 0.0
    while i < len(events) or done:
        now = min(events[i][0] if i < len(events) else float("inf"), done[0][0] if done else float("inf"))
        _account(cluster, result, now - last)
        last = now
        while done and done[0][0] == now:
            _finish(cluster, result, flights.pop(heapq.heappop(done)[2]), pending, by_id, now)
        while i < len(events) and events[i][0] == now:
            _, kind, rid = events[i]
            i += 1
            if kind == 0:
                _release_mid_flight(cluster, result, flights, by_id[rid], now)
            if kind != 2:
                apply_event(cluster, pending, by_id[rid], kind, result)
        for sid in gang_pass(cluster, pending, by_id, infercap_best_fit):
            record_start(cluster, result, by_id[sid], now)
            pending.remove(sid)
            if sid in flights:  # it found room elsewhere before its copies were done
                _drop_target(cluster, flights[sid])
        _defrag(cluster, result, budget, config, flights, done, pending, by_id, now)
    if requests:
        span_s = max(r.release_s for r in requests) - min(r.arrive_s for r in requests)
        result.capacity_gpu_s, result.hours = cluster.size * span_s, span_s / 3600.0
    return result


def _account(cluster: Cluster, result: DefragReplay, span_s: float) -> None:
    for owner, gpus in cluster.held.items():
        if isinstance(owner, tuple):
            if owner[0] == "copy":
                result.copy_gpu_s += span_s * len(gpus)
            else:
                result.reserved_gpu_s += span_s * len(gpus)


def _release_mid_flight(cluster: Cluster, result: DefragReplay, flights: dict, request: Request, now: float) -> None:
    """A request leaving during a move: a waiting target drops its held GPUs; a moved replica drops its copy, and
    its source GPUs go to the target's hold while the target still waits (they were promised to it). Broken before
    made, it would not have served past its release anyway: the loss counted for the rest of the load is given back."""
    rid = request.id
    if rid in flights:
        _drop_target(cluster, flights[rid])
    for flight in flights.values():
        if rid in flight.live:
            flight.live.discard(rid)
            cluster.release(copy_owner(rid))
            source = cluster.release(rid)
            if flight.target_live:
                cluster.take(reserve_owner(flight.plan.target), source)
            if not source:  # broken before made
                unserved_s = request.size * (flight.done_s - now)
                result.lost_serving_gpu_s -= unserved_s
                result.allocated_gpu_s += unserved_s


def _drop_target(cluster: Cluster, flight: _InFlight) -> None:
    """The target started elsewhere or was withdrawn: its hold goes; the copies finish their moves."""
    flight.target_live = False
    cluster.release(reserve_owner(flight.plan.target))


def _finish(cluster: Cluster, result: DefragReplay, flight: _InFlight, pending, by_id, now: float) -> None:
    """Copies loaded: each source is freed and its replica serves from the copy; the waiting group starts."""
    for move in flight.plan.moves:
        moved = move.owner in flight.live
        if moved:
            cluster.release(move.owner)
            cluster.take(move.owner, cluster.release(copy_owner(move.owner)))
        result.move_log.append((flight.started_s, now if moved else None, move.owner))
    target = flight.plan.target
    cluster.release(reserve_owner(target))
    if flight.target_live:
        cluster.take(target, flight.plan.gpus)
        record_start(cluster, result, by_id[target], now)
        pending.remove(target)


def _defrag(cluster, result: DefragReplay, budget: MoveBudget, config, flights, done, pending, by_id, now) -> None:
    left = budget.left(now)
    if left <= 0:
        return
    waiting = [Waiting(r, by_id[r].size, by_id[r].arrive_s) for r in pending if r not in flights]
    if not any(now - w.since_s >= config.wait_s for w in waiting):
        return
    moving = {o for f in flights.values() for o in f.live}
    pinned = {
        o
        for o in cluster.held
        if isinstance(o, tuple) or o in moving or now - result.started.get(o, float("-inf")) < config.load_s
    }
    for plan in propose(cluster, waiting, now_s=now, config=config, moves_left=left, pinned=pinned):
        flight = flights[plan.target] = _InFlight(plan, {m.owner for m in plan.moves}, now, now + config.load_s)
        cluster.take(reserve_owner(plan.target), plan.reserved)
        for move in plan.moves:
            cluster.take(copy_owner(move.owner), move.destination)
            if not config.make_before_break:
                cluster.release(move.owner)
                lost_s = len(move.source) * config.load_s
                result.lost_serving_gpu_s += lost_s
                result.allocated_gpu_s -= lost_s
        if not config.make_before_break:  # the group's GPUs are all free now: it starts at once
            _drop_target(cluster, flight)
            cluster.take(plan.target, plan.gpus)
            record_start(cluster, result, by_id[plan.target], now)
            pending.remove(plan.target)
        heapq.heappush(done, (flight.done_s, result.plans, plan.target))
        budget.spend(len(plan.moves), now)
        result.plans += 1
        result.moves += len(plan.moves)
