"""This host's GPUs for the local actuator (docs/placement.md, "In the actuators"): the inventory, and who holds
which. A replica of a TP-k group gets k GPUs inside one interconnect domain, all or none, by ``capacity.placement``'s
best fit (``infercap_best_fit``: the tightest island, whole domains kept free for larger groups); its
``CUDA_VISIBLE_DEVICES`` names them.

The inventory is ``INFERCAP["LOCAL_GPUS"]``: ``"<gpus>"`` (one NVLink domain, as an HGX board), ``"<gpus>/<island>"``
(NVLink islands of that many, e.g. ``"8/2"`` for a PCIe host with NVLink pairs), empty or ``0`` for none (a CPU-only
host: nothing is allotted and launches run as they always did). Indices are those CUDA enumerates on this host.

The holdings are a small JSON file under the var dir, read and written under a file lock, as the worker processes
of one host share its GPUs. A holding lasts as long as its replica's process runs (``alive``: the pid still runs that
replica's port), so a replica that exits or is stopped frees its GPUs without anyone writing it down; a holding whose
process is not started yet lapses after ``STARTING_GRACE_S``.
"""

import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from capacity.autoscaling.actuators.base import ActuatorError
from capacity.placement.cluster import Cluster, Gpu, Node
from capacity.placement.policies import infercap_best_fit, visible_devices

HOST = "local"
STARTING_GRACE_S = 120.0


class NoWholeGroup(Exception):
    """No whole group of the size asked is free inside one domain; the message says why."""


def inventory(value: str | int | None) -> list[Node]:
    """The host's GPUs as placement nodes (one node, its islands the domains); [] for none."""
    text = str(value if value is not None else "").strip()
    if text in ("", "0"):
        return []
    count, _, island = text.partition("/")
    try:
        gpus, size = int(count), int(island) if island else None
        if gpus < 0:
            raise ValueError("a GPU count is not negative")
        return [Node(HOST, gpus, island=size)] if gpus else []
    except ValueError as exc:
        raise ActuatorError(
            f"INFERCAP_LOCAL_GPUS {text!r}: '<gpus>' or '<gpus>/<island>' (an island dividing the GPUs): {exc}"
        ) from exc


class GpuLedger:
    """The host's GPUs and their holders; ``allot`` and ``started`` change it, each under the file lock."""

    def __init__(
        self, nodes: list[Node], state_dir: Path, *, alive: Callable[[int, int], bool], clock=time.time
    ) -> None:
        self.nodes, self.alive, self.clock = nodes, alive, clock
        self.path = Path(state_dir) / "local-gpus.json"

    @contextmanager
    def _locked(self) -> Iterator[dict]:
        """The live holdings (replica name → gpus, pid, port, at), written back when the block ends."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                holdings = self._live(self._read())
                yield holdings
                tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps(holdings, sort_keys=True))
                tmp.replace(self.path)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _live(self, holdings: dict) -> dict:
        now = self.clock()
        return {
            name: held
            for name, held in holdings.items()
            if (held.get("pid") is not None and self.alive(int(held["pid"]), int(held.get("port") or 0)))
            or (held.get("pid") is None and now - float(held.get("at") or 0) < STARTING_GRACE_S)
        }

    def _cluster(self, holdings: dict) -> Cluster:
        cluster = Cluster(self.nodes)
        known = set(cluster.gpus)
        for name, held in holdings.items():
            cluster.take(name, [g for g in (Gpu(HOST, int(i)) for i in held.get("gpus") or []) if g in known])
        return cluster

    def allot(self, name: str, size: int, *, port: int) -> str:
        """Hold a whole group of ``size`` GPUs inside one domain for replica ``name``; its ``CUDA_VISIBLE_DEVICES``.
        ``NoWholeGroup`` (nothing held) where none is free."""
        with self._locked() as holdings:
            cluster = self._cluster(holdings)
            gpus = infercap_best_fit(cluster, size)
            if gpus is None:
                largest = max((len(g) for g in cluster.domain_gpus.values()), default=0)
                if size > largest:
                    raise NoWholeGroup(
                        f"no interconnect domain on this host holds a TP-{size} group (the largest has {largest} GPUs)"
                    )
                raise NoWholeGroup(f"no whole TP-{size} group free in one domain ({cluster.free_count()} GPUs free)")
            holdings[name] = {"gpus": [g.index for g in gpus], "pid": None, "port": port, "at": self.clock()}
            return visible_devices(gpus)[HOST]

    def started(self, name: str, pid: int) -> None:
        """The replica's process runs: its holding now lasts as long as the process."""
        with self._locked() as holdings:
            if name in holdings:
                holdings[name]["pid"] = pid

    def release(self, name: str) -> None:
        with self._locked() as holdings:
            holdings.pop(name, None)

    def held(self) -> dict[str, list[int]]:
        """Replica name → the GPU indices it holds now."""
        with self._locked() as holdings:
            return {name: list(held["gpus"]) for name, held in holdings.items()}
