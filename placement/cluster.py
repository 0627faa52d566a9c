"""A cluster's shape and who holds which GPU: nodes, the interconnect domain each GPU belongs to (an NVLink island
inside a node, or a rack-scale domain spanning nodes, such as NVL72), and the free and held GPUs at one moment
(docs/placement.md, "The cluster")."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Gpu:
    node: str
    index: int


@dataclass(frozen=True)
class Node:
    """``domain`` names a rack-scale domain the node belongs to (the value of its domain label, e.g.
    ``nvidia.com/gpu.clique``); unset, the node's own GPUs are its domains, one per NVLink ``island`` of that many GPUs
    (unset: the whole node is one island, as on an HGX board)."""

    name: str
    gpus: int
    domain: str | None = None
    island: int | None = None

    def __post_init__(self):
        if self.gpus < 1:
            raise ValueError(f"node {self.name}: gpus must be at least 1")
        if self.island is not None and (self.island < 1 or self.gpus % self.island):
            raise ValueError(f"node {self.name}: island {self.island} must divide its {self.gpus} GPUs")

    def domain_of(self, index: int) -> str:
        if self.domain is not None:
            return self.domain
        if self.island is None or self.island >= self.gpus:
            return self.name
        return f"{self.name}/island-{index // self.island}"


def replica_gpu_count(tensor_parallel_size, gpus_per_replica: int | None, *, engine_ranks: bool = True) -> int:
    """One replica's GPUs: the engine's ranks (a launch option's ``tensor_parallel_size``) where they count and are
    set, else the hardware profile's ``gpus_per_replica`` (1 without a profile). Ranks do not count on Kubernetes,
    where a pod requests its profile's GPUs (ranks alone may be a CPU node's), nor for a fallback launch, which runs
    on the fallback profile's own group size. A value that is not a count reads as 1 (the launch refuses it)."""
    value = tensor_parallel_size if engine_ranks and tensor_parallel_size is not None else gpus_per_replica
    try:
        return max(1, int(value if value is not None else 1))
    except (TypeError, ValueError):
        return 1


def hgx_nodes(count: int, *, gpus: int = 8, prefix: str = "hgx") -> list[Node]:
    """Nodes whose GPUs form one NVLink domain each (an 8-GPU HGX board)."""
    return [Node(f"{prefix}-{i:02d}", gpus) for i in range(count)]


def rack(name: str, *, nodes: int = 18, gpus: int = 4) -> list[Node]:
    """A rack-scale NVLink domain: ``nodes`` compute trays of ``gpus`` each, all in domain ``name`` (NVL72: 18 × 4)."""
    return [Node(f"{name}-{i:02d}", gpus, domain=name) for i in range(nodes)]


class Cluster:
    """The shape (immutable) and the holdings (who has which GPU), with the queries the policies ask."""

    def __init__(self, nodes: Iterable[Node]):
        self.nodes = tuple(nodes)
        if len({n.name for n in self.nodes}) != len(self.nodes):
            raise ValueError("node names must be unique")
        self.node = {n.name: n for n in self.nodes}
        self.gpus = tuple(Gpu(n.name, i) for n in self.nodes for i in range(n.gpus))
        self.domain = {g: self.node[g.node].domain_of(g.index) for g in self.gpus}
        self.domain_gpus: dict[str, list[Gpu]] = {}
        for gpu in self.gpus:
            self.domain_gpus.setdefault(self.domain[gpu], []).append(gpu)
        self.owner: dict[Gpu, object] = {}
        self.held: dict[object, list[Gpu]] = {}
        # Free MIG slices per profile beside the whole GPUs, where a host lists them (placement/mig.py).
        self.mig_free: dict[str, int] = {}

    @property
    def size(self) -> int:
        return len(self.gpus)

    def is_multi_node(self, domain: str) -> bool:
        return len({g.node for g in self.domain_gpus[domain]}) > 1

    def largest_domain(self) -> int:
        return max(len(gpus) for gpus in self.domain_gpus.values())

    def free_gpus(self) -> list[Gpu]:
        return [g for g in self.gpus if g not in self.owner]

    def free_count(self) -> int:
        return self.size - len(self.owner)

    def take(self, owner: object, gpus: Iterable[Gpu]) -> None:
        for gpu in gpus:
            if gpu in self.owner:
                raise ValueError(f"{gpu} is held by {self.owner[gpu]!r}")
            self.owner[gpu] = owner
            self.held.setdefault(owner, []).append(gpu)

    def release(self, owner: object) -> list[Gpu]:
        gpus = self.held.pop(owner, [])
        for gpu in gpus:
            del self.owner[gpu]
        return gpus

    def domains_of(self, gpus: Iterable[Gpu]) -> set[str]:
        return {self.domain[g] for g in gpus}
