"""The placement policies: where a replica of tensor-parallel size ``size`` gets its GPUs (docs/placement.md,
"Policies"). Each ``place`` answers all the group's GPUs or None; ``naive`` alone hands out one GPU at a time (the
replay grows its holdings), which is how a per-GPU scheduler lets several replicas each hold part of a group."""

from __future__ import annotations

from dataclasses import dataclass

from placement.cluster import Cluster, Gpu


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
    """The shape answer, free GPUs aside: inside one node's island, or as equal shares on nodes of one rack-scale
    domain (whole nodes where the size allows)."""
    if size < 1:
        return Fit(False, 0, "a group has at least one GPU")
    islands = [len(gpus) for d, gpus in cluster.domain_gpus.items() if not cluster.is_multi_node(d)]
    per_node = [n.gpus for n in cluster.nodes if n.domain is not None]
    if any(size <= island for island in islands) or any(size <= g for g in per_node):
        return Fit(True, 1, f"{size} GPUs inside one node's NVLink island")
    for domain, gpus in cluster.domain_gpus.items():
        if not cluster.is_multi_node(domain) or size > len(gpus):
            continue
        nodes = sorted({g.node for g in gpus})
        per = next(p for p in range(max(cluster.node[n].gpus for n in nodes), 0, -1) if size % p == 0)
        if size // per <= sum(cluster.node[n].gpus >= per for n in nodes):
            return Fit(True, size // per, f"{size // per} nodes × {per} GPUs in domain {domain}")
    return Fit(False, 0, f"no interconnect domain holds a group of {size} GPUs")


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
    """(score, gpus) per rack-scale domain: the group as equal shares of ``per`` GPUs on ``size // per`` nodes (one
    pod each), the largest share that fits (fewest pods), each on the node with the fewest free GPUs that holds it
    (best fit). Inside a rack-scale domain every GPU reaches every other over NVLink, so a share need not be a whole
    node; on whole nodes is the common case and the best fit among equals."""
    for domain, gpus in cluster.domain_gpus.items():
        if not cluster.is_multi_node(domain):
            continue
        free: dict[str, int] = {}
        for gpu in gpus:
            free[gpu.node] = free.get(gpu.node, 0) + (gpu not in cluster.owner)
        for per in range(max(free.values()), 0, -1):
            if size % per or size // per < 2:
                continue
            fits = sorted((n for n in free if free[n] >= per), key=lambda n: (free[n], n))
            if len(fits) < size // per:
                continue
            chosen = fits[: size // per]
            taken = tuple(
                g for n in chosen for g in [Gpu(n, i) for i in range(cluster.node[n].gpus)] if g not in cluster.owner
            )
            picked = tuple(g for n in chosen for g in [x for x in taken if x.node == n][:per])
            yield (-per, sum(free[n] - per for n in chosen), len(fits), domain), picked
            break


def infercap_best_fit(cluster: Cluster, size: int) -> tuple[Gpu, ...] | None:
    """Gang, inside one domain, best-fit bin packing that keeps whole domains free for large groups; a group that no
    node's island holds takes equal shares on nodes of one rack-scale domain (a leader and its workers)."""
    best = min(_single_node_candidates(cluster, size), default=None, key=lambda c: c[0])
    if best is None:
        best = min(_multi_node_candidates(cluster, size), default=None, key=lambda c: c[0])
    return best[1] if best else None


GANG_POLICIES = {"gang": gang_first_fit, "infercap": infercap_best_fit, "bound": pooled}
POLICIES = ("naive", *GANG_POLICIES)


def groups_that_fit(cluster: Cluster, size: int) -> int:
    """How many more groups of ``size`` infercap would place now, one after another: capacity in whole groups (a
    node with 3 free GPUs has no room for a TP-4 replica). The cluster is left as it was."""
    placed = 0
    while (gpus := infercap_best_fit(cluster, size)) is not None:
        cluster.take(("groups_that_fit", placed), gpus)
        placed += 1
    for i in range(placed):
        cluster.release(("groups_that_fit", i))
    return placed


def visible_devices(gpus: tuple[Gpu, ...]) -> dict[str, str]:
    """Per node, the ``CUDA_VISIBLE_DEVICES`` value of a group's share on it."""
    by_node: dict[str, list[int]] = {}
    for gpu in sorted(gpus):
        by_node.setdefault(gpu.node, []).append(gpu.index)
    return {node: ",".join(map(str, indices)) for node, indices in by_node.items()}
