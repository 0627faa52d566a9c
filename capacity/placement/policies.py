"""The placement policies: where a replica of tensor-parallel size ``size`` gets its GPUs (docs/placement.md,
"Policies"). Each ``place`` answers all the group's GPUs or None; ``naive`` alone hands out one GPU at a time (the
replay grows its holdings), which is how a per-GPU scheduler lets several replicas each hold part of a group."""

from __future__ import annotations

from dataclasses import dataclass

from capacity.placement.cluster import Cluster, Gpu


def naive_next_gpu(cluster: Cluster) -> Gpu | None:
    """A per-GPU scheduler: the first free GPU, wherever it is."""
    return next((g for g in cluster.gpus if g not in cluster.owner), None)


def gang_first_fit(cluster: Cluster, size: int) -> tuple[Gpu, ...] | None:
    """All or nothing, topology unknown: the first ``size`` free GPUs in the cluster's order, across nodes and
    domains if that is where they are."""
    free = cluster.free_gpus()
    return tuple(free[:size]) if len(free) >= size else None


def pooled(cluster: Cluster, size: int) -> tuple[Gpu, ...] | None:
    """The relaxation the bound schedules on: any ``size`` free GPUs make a group (no topology, no fragmentation)."""
    return gang_first_fit(cluster, size)


@dataclass(frozen=True)
class Fit:
    """Whether a group of ``size`` GPUs can ever be placed on the cluster's shape inside one domain, and how."""

    fits: bool
    nodes: int  # nodes one replica spans (a leader and workers when more than one)
    reason: str


def group_fit(cluster: Cluster, size: int) -> Fit:
    """The shape answer, free GPUs aside: inside one node's island, or across whole nodes of one rack domain."""
    if size < 1:
        return Fit(False, 0, "a group has at least one GPU")
    islands = [len(gpus) for d, gpus in cluster.domain_gpus.items() if not cluster.is_multi_node(d)]
    per_node = [n.gpus for n in cluster.nodes if n.domain is not None]
    if any(size <= island for island in islands) or any(size <= g for g in per_node):
        return Fit(True, 1, f"{size} GPUs inside one node's NVLink island")
    for domain, gpus in cluster.domain_gpus.items():
        if not cluster.is_multi_node(domain):
            continue
        node_gpus = {cluster.node[g.node].gpus for g in gpus}
        for per in node_gpus:
            whole = sum(1 for n in {g.node for g in gpus} if cluster.node[n].gpus == per)
            if size % per == 0 and size // per <= whole:
                return Fit(True, size // per, f"{size // per} whole nodes of {per} GPUs in domain {domain}")
    return Fit(False, 0, f"no interconnect domain holds a group of {size} GPUs in whole nodes")


def _single_node_candidates(cluster: Cluster, size: int):
    """(score, gpus) for each node island with ``size`` free GPUs. Best fit (fewest GPUs left free on the node) after
    two rules that keep large groups placeable: never open an empty node of a rack-scale domain while another will
    do, and never break a wholly free domain while a used one fits."""
    for node in cluster.nodes:
        free = [Gpu(node.name, i) for i in range(node.gpus) if Gpu(node.name, i) not in cluster.owner]
        by_domain: dict[str, list[Gpu]] = {}
        for gpu in free:
            by_domain.setdefault(cluster.domain[gpu], []).append(gpu)
        for domain, gpus in by_domain.items():
            if len(gpus) < size:
                continue
            rack_scale = cluster.is_multi_node(domain)
            node_empty = len(free) == node.gpus
            domain_empty = all(g not in cluster.owner for g in cluster.domain_gpus[domain])
            score = (rack_scale and node_empty, domain_empty, len(gpus) - size, node.name)
            yield score, tuple(gpus[:size])


def _multi_node_candidates(cluster: Cluster, size: int):
    """(score, gpus) per rack-scale domain with enough wholly free nodes: best fit on the count of free nodes."""
    for domain, gpus in cluster.domain_gpus.items():
        if not cluster.is_multi_node(domain):
            continue
        names = sorted({g.node for g in gpus})
        empty = [n for n in names if all(Gpu(n, i) not in cluster.owner for i in range(cluster.node[n].gpus))]
        for per in sorted({cluster.node[n].gpus for n in empty}, reverse=True):
            whole = [n for n in empty if cluster.node[n].gpus == per]
            if size % per or size // per > len(whole):
                continue
            chosen = whole[: size // per]
            yield (len(whole), domain), tuple(Gpu(n, i) for n in chosen for i in range(per))


def infercap_best_fit(cluster: Cluster, size: int) -> tuple[Gpu, ...] | None:
    """Gang, inside one domain, best-fit bin packing that keeps whole domains free for large groups; a group larger
    than any node's island takes whole nodes of one rack-scale domain (a leader and its workers)."""
    best = min(_single_node_candidates(cluster, size), default=None, key=lambda c: c[0])
    if best is None:
        best = min(_multi_node_candidates(cluster, size), default=None, key=lambda c: c[0])
    return best[1] if best else None


GANG_POLICIES = {"gang": gang_first_fit, "infercap": infercap_best_fit, "bound": pooled}
POLICIES = ("naive", *GANG_POLICIES)
