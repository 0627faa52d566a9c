"""``repack``: a ceiling for placement that keeps the topology and gang rules and drops the history. At every moment
the scheduler looks it may re-place every running replica from scratch (migration free and instant), so it never
suffers the fragmentation earlier placements leave; it admits waiting replicas in the order the bound does, on the
same stream and at the same moments, and knows nothing of the future (docs/placement.md, "The bench")."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from placement.cluster import Cluster, Gpu, Node
from simulator.placement.replay import Replay, Request, apply_event


def fit_one(cluster: Cluster, size: int) -> tuple[Gpu, ...] | None:
    """A place for one group on the cluster as it is, inside one domain: a node's island (best fit: the fewest free
    GPUs that hold it), else equal shares on nodes of one rack-scale domain (the largest share that fits, on the nodes
    with the fewest free GPUs). The shapes infercap may use, without its rules for keeping room."""
    best = None
    free_by_node: dict[str, list[Gpu]] = {}
    for gpu in cluster.gpus:
        if gpu not in cluster.owner:
            free_by_node.setdefault(gpu.node, []).append(gpu)
    for node, free in free_by_node.items():
        by_domain: dict[str, list[Gpu]] = {}
        for gpu in free:
            by_domain.setdefault(cluster.domain[gpu], []).append(gpu)
        for gpus in by_domain.values():
            if len(gpus) >= size and (best is None or len(gpus) < best[0]):
                best = (len(gpus), node, tuple(gpus[:size]))
    if best is not None:
        return best[2]
    return _equal_shares(cluster, size, free_by_node)


def _equal_shares(cluster: Cluster, size: int, free_by_node: dict[str, list[Gpu]]) -> tuple[Gpu, ...] | None:
    for domain, gpus in cluster.domain_gpus.items():
        if not cluster.is_multi_node(domain):
            continue
        nodes = sorted({g.node for g in gpus}, key=lambda n: (len(free_by_node.get(n, ())), n))
        for per in range(max(cluster.node[n].gpus for n in nodes), 0, -1):
            if size % per or size // per < 2:
                continue
            fits = [n for n in nodes if len(free_by_node.get(n, ())) >= per]
            if len(fits) >= size // per:
                return tuple(g for n in fits[: size // per] for g in free_by_node[n][:per])
    return None


def pack(nodes: Iterable[Node], groups: Iterable[tuple[object, int]]) -> dict[object, tuple[Gpu, ...]] | None:
    """Every group placed from scratch on an empty cluster, largest first (``fit_one`` each), or None if one does
    not fit. Exact where the sizes and nodes' GPUs are powers of two (the bench's cluster): largest first, each
    domain's and node's free GPUs stay a multiple of the group at hand, so a group fits whenever some domain that
    may hold it has that many GPUs free (tests/capacity/test_placement_repack.py checks it against the count)."""
    cluster = Cluster(nodes)
    for owner, size in sorted(groups, key=lambda g: -g[1]):
        gpus = fit_one(cluster, size)
        if gpus is None:
            return None
        cluster.take(owner, gpus)
    return {owner: tuple(gpus) for owner, gpus in cluster.held.items()}


@dataclass
class RepackReplay(Replay):
    """A Replay with what the migration cost: ``repacks`` (times a waiting replica started only because running
    ones moved) and ``moved`` (running replicas whose GPUs changed then: the few moved off one island where that
    did, else every one a from-scratch packing moved, so more than the fewest moves that would do)."""

    repacks: int = 0
    moved: int = 0

    def figures(self) -> dict:
        return super().figures() | {"repacks": self.repacks, "moved": self.moved}


def repack_replay(nodes: list[Node], requests: list[Request]) -> RepackReplay:
    """The stream replayed as ``replay`` replays it (the same events, the same moments the scheduler looks, waiting
    replicas in arrival order with backfill), each pass placing a waiting replica where it fits as things are, else
    moving a few groups off one island for it, else re-placing every running replica with it from scratch
    (``pack``), else leaving it waiting. Whether it starts depends only on whether the running set and it pack."""
    cluster = Cluster(nodes)
    result = RepackReplay("repack")
    by_id = {r.id: r for r in requests}
    events = sorted([(r.release_s, 0, r.id) for r in requests] + [(r.arrive_s, 1, r.id) for r in requests])
    pending: list[int] = []  # arrival order
    for i, (time_s, kind, rid) in enumerate(events):
        apply_event(cluster, pending, by_id[rid], kind, result)
        if i + 1 < len(events) and events[i + 1][0] == time_s:
            continue
        for sid in _repack_pass(nodes, cluster, pending, by_id, result):
            started = by_id[sid]
            result.started[sid] = time_s
            result.waited(started, time_s - started.arrive_s)
            result.allocated_gpu_s += started.size * (started.release_s - time_s)
            result.multi_node_groups += len({g.node for g in cluster.held[sid]}) > 1
            pending.remove(sid)
    if requests:
        result.capacity_gpu_s = cluster.size * (max(r.release_s for r in requests) - min(r.arrive_s for r in requests))
    return result


def _repack_pass(nodes, cluster: Cluster, pending: list[int], by_id, result: RepackReplay) -> list[int]:
    started: list[int] = []
    refused: set[int] = set()  # sizes a from-scratch packing refused this pass: the running set only grows
    for rid in pending:
        size = by_id[rid].size
        if size in refused or cluster.free_count() < size:
            continue
        gpus = fit_one(cluster, size)
        if gpus is not None:
            cluster.take(rid, gpus)
            result.groups_across_domains += len(cluster.domains_of(gpus)) > 1
        elif not _move_few(cluster, rid, size, result) and not _repack(nodes, cluster, rid, size, result):
            refused.add(size)
            continue
        started.append(rid)
    return started


def _repack(nodes, cluster: Cluster, rid: int, size: int, result: RepackReplay) -> bool:
    """Every running replica and ``rid`` re-placed from scratch, or False (and nothing moved) if they do not fit."""
    placement = pack(nodes, [(owner, len(gpus)) for owner, gpus in cluster.held.items()] + [(rid, size)])
    if placement is None:
        return False
    before = {owner: sorted(gpus) for owner, gpus in cluster.held.items()}
    for owner in list(cluster.held):
        cluster.release(owner)
    for owner, gpus in placement.items():
        cluster.take(owner, gpus)
        result.groups_across_domains += len(cluster.domains_of(gpus)) > 1
    result.repacks += 1
    result.moved += sum(sorted(placement[owner]) != gpus for owner, gpus in before.items())
    return True


def _move_few(cluster: Cluster, rid: int, size: int, result: RepackReplay) -> bool:
    """Room for ``rid`` on one node's island made by moving the fewest groups held wholly on it (smallest first)
    to places elsewhere as things are, or False (and nothing moved). Cheaper in moves than ``_repack``; the same
    answer whenever it finds room, so the admissions do not depend on it."""
    tries = []
    for island in _islands(cluster):
        if len(island) < size:
            continue
        owners = {cluster.owner[g] for g in island if g in cluster.owner}
        movable = sorted(
            (o for o in owners if set(cluster.held[o]) <= set(island)), key=lambda o: len(cluster.held[o])
        )
        free, evict = sum(g not in cluster.owner for g in island), []
        for owner in movable:
            if free >= size:
                break
            evict.append(owner)
            free += len(cluster.held[owner])
        if free >= size:
            tries.append((len(evict), island[0], island, evict))
    for _, _, island, evict in sorted(tries, key=lambda t: (t[0], t[1])):
        if _evict_and_place(cluster, rid, size, island, evict):
            result.repacks += 1
            result.moved += len(evict)
            return True
    return False


def _evict_and_place(cluster: Cluster, rid: int, size: int, island: list[Gpu], evict: list) -> bool:
    held = {owner: cluster.release(owner) for owner in evict}
    target = [g for g in island if g not in cluster.owner][:size]
    cluster.take(rid, target)
    placed = []
    for owner in sorted(evict, key=lambda o: -len(held[o])):
        gpus = fit_one(cluster, len(held[owner]))
        if gpus is None:
            break
        cluster.take(owner, gpus)
        placed.append(owner)
    if len(placed) == len(evict):
        return True
    for owner in [rid, *placed]:
        cluster.release(owner)
    for owner, gpus in held.items():
        cluster.take(owner, gpus)
    return False


def _islands(cluster: Cluster) -> list[list[Gpu]]:
    """Each node's GPUs of one domain: what one pod of a group may hold."""
    islands: dict[tuple[str, str], list[Gpu]] = {}
    for gpu in cluster.gpus:
        islands.setdefault((gpu.node, cluster.domain[gpu]), []).append(gpu)
    return list(islands.values())
