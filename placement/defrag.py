"""The defragmenting step: when a replica has waited past a threshold for a whole group that no domain holds free,
move a few small running replicas off one node's island into holes elsewhere (each placed whole inside one domain by
infercap's best fit) so that the waiting group fits on that island. Pure, with an injected clock: the caller passes
``now_s``, carries the moves out and tells the budget (docs/placement.md, "Defragmenting")."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import combinations

from placement.cluster import Cluster, Gpu
from placement.policies import infercap_best_fit


@dataclass(frozen=True)
class DefragConfig:
    """The operator's knobs. ``load_s``: how long a moved replica's copy loads on its destination (the planner's
    default cold start). Make-before-break (the default): the source keeps serving and is freed only once the copy
    has loaded; break-before-make: the source is freed at once and the replica serves nothing until its copy has."""

    wait_s: float = 30.0  # a waiting group is helped only once it has waited this long
    load_s: float = 90.0
    max_moves_per_plan: int = 3  # replicas moved to open room for one group
    max_moves_per_hour: int = 12  # over the cluster, a sliding hour
    max_moved_gpus: int = 1  # the largest replica that may be moved (TP-1: the cheapest copy)
    make_before_break: bool = True


@dataclass(frozen=True)
class Waiting:
    owner: object
    size: int
    since_s: float  # when it asked


@dataclass(frozen=True)
class Move:
    owner: object
    source: tuple[Gpu, ...]
    destination: tuple[Gpu, ...]


@dataclass(frozen=True)
class Plan:
    """``gpus``: the waiting group's GPUs once the moves are done (the island's free GPUs now, and what the moved
    replicas leave); ``reserved``: those free now, which the caller holds for it while the copies load."""

    target: object
    gpus: tuple[Gpu, ...]
    reserved: tuple[Gpu, ...]
    moves: tuple[Move, ...]

    @property
    def moved_gpus(self) -> int:
        return sum(len(m.source) for m in self.moves)


class MoveBudget:
    """Moves left in the sliding hour (the injected clock is the caller's ``now_s``)."""

    def __init__(self, per_hour: int):
        self.per_hour = per_hour
        self.times: deque[float] = deque()

    def left(self, now_s: float) -> int:
        while self.times and self.times[0] <= now_s - 3600.0:
            self.times.popleft()
        return self.per_hour - len(self.times)

    def spend(self, moves: int, now_s: float) -> None:
        self.times.extend([now_s] * moves)


def propose(
    cluster: Cluster,
    waiting: Iterable[Waiting],
    *,
    now_s: float,
    config: DefragConfig,
    moves_left: int,
    pinned: set,
) -> list[Plan]:
    """Plans for the waiting groups that have waited at least ``config.wait_s``, oldest first, each moving at most
    ``config.max_moves_per_plan`` replicas and all together at most ``moves_left``. ``pinned``: owners that may not
    move (starting, already moving). A waiting group that fits as things are gets no plan (the scheduler places it).
    The cluster is left as it was; later plans avoid what earlier ones use."""
    plans: list[Plan] = []
    for group in sorted(waiting, key=lambda w: w.since_s):
        if moves_left <= 0:
            break
        if now_s - group.since_s < config.wait_s or infercap_best_fit(cluster, group.size) is not None:
            continue
        limit = min(moves_left, config.max_moves_per_plan)
        plan = plan_for(cluster, group, max_moves=limit, max_moved_gpus=config.max_moved_gpus, pinned=pinned)
        if plan is None:
            continue
        plans.append(plan)
        moves_left -= len(plan.moves)
        _hold(cluster, plan)
        pinned = pinned | {m.owner for m in plan.moves}
    for plan in plans:
        _unhold(cluster, plan)
    return plans


def plan_for(cluster: Cluster, group: Waiting, *, max_moves: int, max_moved_gpus: int, pinned: set) -> Plan | None:
    """The cheapest way to open room for ``group``, on one node's island or on whole nodes of a rack-scale domain:
    the fewest GPUs moved, then the fewest moves, then the tightest room; each moved replica held wholly there, no
    larger than ``max_moved_gpus``, and placed whole elsewhere by infercap's best fit while the room's free GPUs are
    kept for the group."""
    if cluster.free_count() < group.size:
        return None

    def movable(owner, room: set) -> bool:
        held = cluster.held[owner]
        return owner not in pinned and len(held) <= max_moved_gpus and set(held) <= room

    best = None
    for room in [*islands(cluster), *rack_rooms(cluster, group.size, movable)]:
        if len(room) < group.size:
            continue
        free = tuple(g for g in room if g not in cluster.owner)
        need = group.size - len(free)
        if need <= 0:
            continue
        members = set(room)
        owners = {o for g in room if (o := cluster.owner.get(g)) is not None and movable(o, members)}
        for evict in _subsets(cluster, sorted(owners, key=lambda o: (len(cluster.held[o]), str(o))), need, max_moves):
            moves = _copies(cluster, free, evict)
            if moves is None:
                continue
            sources = [g for m in moves for g in m.source]
            score = (len(sources), len(moves), len(room), room[0])
            if best is None or score < best[0]:
                gpus = tuple(sorted(free + tuple(sources)))[: group.size]
                best = (score, Plan(group.owner, gpus, free, moves))
            break
    return best[1] if best else None


def rack_rooms(cluster: Cluster, size: int, movable) -> list[list[Gpu]]:
    """For a group larger than one node of a rack-scale domain, per domain the ``size // node`` whole nodes that hold
    the fewest GPUs, among those whose every replica may move: the group's equal shares once they are emptied."""
    rooms = []
    for domain, gpus in cluster.domain_gpus.items():
        if not cluster.is_multi_node(domain):
            continue
        by_node: dict[str, list[Gpu]] = {}
        for gpu in gpus:
            by_node.setdefault(gpu.node, []).append(gpu)
        per = max(len(node_gpus) for node_gpus in by_node.values())
        if size <= per or size % per:
            continue
        clear = [
            node_gpus
            for node_gpus in by_node.values()
            if len(node_gpus) == per
            and all(movable(cluster.owner[g], set(node_gpus)) for g in node_gpus if g in cluster.owner)
        ]
        clear.sort(key=lambda node_gpus: (sum(g in cluster.owner for g in node_gpus), node_gpus[0]))
        if len(clear) >= size // per:
            rooms.append([g for node_gpus in clear[: size // per] for g in node_gpus])
    return rooms


def _subsets(cluster: Cluster, movable: list, need: int, max_moves: int):
    """Sets of at most ``max_moves`` owners holding at least ``need`` GPUs, fewest GPUs first, then fewest owners."""
    options = []
    for count in range(1, min(max_moves, len(movable)) + 1):
        for evict in combinations(movable, count):
            gpus = sum(len(cluster.held[o]) for o in evict)
            if gpus >= need:
                options.append((gpus, count, evict))
    return [evict for _, _, evict in sorted(options, key=lambda o: (o[0], o[1]))]


def _copies(cluster: Cluster, keep: tuple[Gpu, ...], evict: tuple) -> tuple[Move, ...] | None:
    """Where each evicted replica's copy goes (largest first, infercap's best fit, never on ``keep``), or None."""
    cluster.take(("defrag-keep",), keep)
    moves = []
    try:
        for owner in sorted(evict, key=lambda o: -len(cluster.held[o])):
            destination = infercap_best_fit(cluster, len(cluster.held[owner]))
            if destination is None:
                return None
            cluster.take(("defrag-copy", owner), destination)
            moves.append(Move(owner, tuple(cluster.held[owner]), destination))
        return tuple(moves)
    finally:
        cluster.release(("defrag-keep",))
        for owner in evict:
            cluster.release(("defrag-copy", owner))


def _hold(cluster: Cluster, plan: Plan) -> None:
    cluster.take(("defrag-plan", plan.target), plan.reserved)
    for move in plan.moves:
        cluster.take(("defrag-plan", move.owner), move.destination)


def _unhold(cluster: Cluster, plan: Plan) -> None:
    cluster.release(("defrag-plan", plan.target))
    for move in plan.moves:
        cluster.release(("defrag-plan", move.owner))


def islands(cluster: Cluster) -> list[list[Gpu]]:
    """Each node's GPUs of one domain: what one pod of a group may hold."""
    by_node: dict[tuple[str, str], list[Gpu]] = {}
    for gpu in cluster.gpus:
        by_node.setdefault((gpu.node, cluster.domain[gpu]), []).append(gpu)
    return list(by_node.values())
