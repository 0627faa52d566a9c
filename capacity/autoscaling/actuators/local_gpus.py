"""This host's GPUs for the local actuator (docs/placement.md, "In the actuators"): the inventory, and who holds
which. A replica of a TP-k group gets k GPUs inside one interconnect domain, all or none, by ``placement``'s
best fit (``infercap_best_fit``: the tightest island, whole domains kept free for larger groups); its
``CUDA_VISIBLE_DEVICES`` names them.

The inventory is ``INFERCAP["LOCAL_GPUS"]``: ``"<gpus>"`` (one NVLink domain, as an HGX board), ``"<gpus>/<island>"``
(NVLink islands of that many, e.g. ``"8/2"`` for a PCIe host with NVLink pairs), empty or ``0`` for none (a CPU-only
host: nothing is allotted and launches run as they always did). Indices are those CUDA enumerates on this host.

The holdings are a small JSON file under the var dir, read and written under a file lock, as the worker processes
of one host share its GPUs. A holding lasts as long as its replica's process runs (``alive``: the pid still runs that
replica's port), so a replica that exits or is stopped frees its GPUs without anyone writing it down; a holding whose
process is not started yet lapses after ``STARTING_GRACE_S``.

The defragmenting step (docs/placement.md, "Local") adds three things: ``allot_at`` (a move's copy on exactly the
GPUs its plan chose), reservations (GPUs held for a waiting group until its moves are done: nobody else's best fit
takes them, and the group's own launch does; each expires), and the waiting groups (a launch capped for want of a
whole group records its key, size and when it was first capped), kept with the moves in flight and the move budget
in ``local-defrag.json`` under the same lock. A reservation is a holding named ``reserved:<key>`` with an ``until``;
a holdings file written before reservations existed reads as it did.

MIG slices (``INFERCAP["LOCAL_MIG"]``, placement/mig.py) are held the same way, one ledger per profile
(``local-mig-<profile>.json``): each slice a domain of one, its index standing for its UUID, which is what
``CUDA_VISIBLE_DEVICES`` gets. A slice's group is always one, so the defragmenting step never looks at them.
"""

import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings

from capacity.autoscaling.actuators.base import ActuatorError
from placement import mig
from placement.cluster import Cluster, Gpu, Node
from placement.policies import infercap_best_fit, visible_devices

HOST = "local"
STARTING_GRACE_S = 120.0
RESERVED = "reserved:"
# A waiting group is asked for again at every horizontal tick (5 s) while its launch is capped; one not asked for
# this long no longer waits (the endpoint scaled in, fell back to another profile, or found room).
WAIT_STALE_S = 20.0


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


def mig_inventory(value: str | None = None) -> dict[str, list[str]]:
    """This host's MIG slices (``INFERCAP["LOCAL_MIG"]``, or ``value``): profile → device UUIDs; {} for none."""
    text = settings.INFERCAP.get("LOCAL_MIG") if value is None else value
    try:
        return mig.local_slices(text)
    except ValueError as exc:
        raise ActuatorError(f"INFERCAP_LOCAL_MIG {text!r}: {exc}") from exc


class GpuLedger:
    """The host's GPUs and their holders; ``allot`` and ``started`` change it, each under the file lock."""

    def __init__(
        self,
        nodes: list[Node],
        state_dir: Path,
        *,
        alive: Callable[[int, int], bool],
        clock=time.time,
        name: str = "local-gpus",
        devices: list[str] | None = None,
    ) -> None:
        """``name``: the holdings file's; ``devices``: what ``CUDA_VISIBLE_DEVICES`` calls each index (a MIG slice's
        UUID; None: the index itself)."""
        self.nodes, self.alive, self.clock, self.devices = nodes, alive, clock, devices
        self.path = Path(state_dir) / f"{name}.json"
        self.state_path = Path(state_dir) / ("local-defrag.json" if name == "local-gpus" else f"{name}-defrag.json")

    @contextmanager
    def _locked(self) -> Iterator[dict]:
        """The live holdings (replica name → gpus, pid, port, at), written back when the block ends."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                holdings = self._live(self._read())
                yield holdings
                self._write(self.path, holdings)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    @contextmanager
    def defrag_state(self) -> Iterator[tuple[dict, dict]]:
        """The live holdings and the defragmenting step's state (``waiting``: key → size, since, last; ``moves``:
        copy name → its move; ``spent``: when each move of the last hour started), both written back."""
        with self._locked() as holdings:
            state = _clean(self._read(self.state_path))
            state["waiting"] = {
                key: wait for key, wait in state["waiting"].items() if self.clock() - wait["last"] < WAIT_STALE_S
            }
            yield holdings, state
            self._write(self.state_path, state)

    def _write(self, path: Path, data: dict) -> None:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, sort_keys=True))
        tmp.replace(path)

    def _read(self, path: Path | None = None) -> dict:
        try:
            data = json.loads((path or self.path).read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _live(self, holdings: dict) -> dict:
        return {name: held for name, held in holdings.items() if self._lives(held, self.clock())}

    def _lives(self, held: dict, now: float) -> bool:
        if held.get("until") is not None:  # a reservation
            return now < float(held["until"])
        if held.get("pid") is None:
            return now - float(held.get("at") or 0) < STARTING_GRACE_S
        return self.alive(int(held["pid"]), int(held.get("port") or 0))

    def cluster(self, holdings: dict, *, without: str | None = None) -> Cluster:
        """The host as a placement cluster: each holding's GPUs owned by its name, then each reservation's GPUs
        that no replica holds (a reservation takes a moved replica's GPUs as they free) by ``reserved:<key>``.
        ``without``: a reservation left out (the group's own launch)."""
        cluster = Cluster(self.nodes)
        known = set(cluster.gpus)
        reservations = sorted(name for name in holdings if name.startswith(RESERVED))
        for name in [*(n for n in holdings if not n.startswith(RESERVED)), *reservations]:
            if name == without:
                continue
            gpus = (Gpu(HOST, i) for i in self._indices(holdings[name]))
            cluster.take(name, [g for g in gpus if g in known and g not in cluster.owner])
        return cluster

    def _indices(self, held: dict) -> list[int]:
        """A holding's GPU indices; on a MIG ledger from the UUIDs it holds, as the list of slices may have been
        edited since (a slice no longer listed is held by nobody here)."""
        if self.devices is None or "devices" not in held:
            return [int(i) for i in held.get("gpus") or []]
        return [self.devices.index(d) for d in held.get("devices") or [] if d in self.devices]

    def _holding(self, gpus, *, port: int) -> dict:
        indices = sorted(int(i) for i in gpus)
        named = {"devices": [self.devices[i] for i in indices]} if self.devices is not None else {}
        return {"gpus": indices, "pid": None, "port": port, "at": self.clock(), **named}

    def allot(self, name: str, size: int, *, port: int, group: str | None = None) -> str:
        """Hold a whole group of ``size`` GPUs inside one domain for replica ``name``; its ``CUDA_VISIBLE_DEVICES``.
        ``NoWholeGroup`` (nothing held) where none is free. ``group``: the waiting group's key (endpoint, pool,
        size): its reservation's GPUs are taken first once all are free; a group that finds none waits (its first
        capped time kept), and one that starts no longer waits and loses its reservation."""
        with self.defrag_state() as (holdings, state):
            reserved = f"{RESERVED}{group}" if group else None
            own = self.cluster(holdings, without=reserved)
            mine = [Gpu(HOST, int(i)) for i in (holdings.get(reserved) or {}).get("gpus") or []]
            if len(mine) >= size and all(g in own.gpus and g not in own.owner for g in mine):
                gpus = tuple(sorted(mine))[:size]
            else:
                gpus = infercap_best_fit(self.cluster(holdings), size)
            if gpus is None:
                why = self._why_not(own, size)
                if group:  # written back as the block ends; raised after
                    now = self.clock()
                    since = float((state["waiting"].get(group) or {}).get("since") or now)
                    state["waiting"][group] = {"size": size, "since": since, "last": now}
            else:
                holdings[name] = self._holding((g.index for g in gpus), port=port)
                if group:
                    state["waiting"].pop(group, None)
                    holdings.pop(reserved, None)
        if gpus is None:
            raise NoWholeGroup(why)
        return self._visible(gpus)

    def _visible(self, gpus) -> str:
        if self.devices is None:
            return visible_devices(gpus)[HOST]
        return ",".join(self.devices[g.index] for g in sorted(gpus))

    def _why_not(self, cluster: Cluster, size: int) -> str:
        if self.devices is not None:
            if size > 1:
                return f"a MIG slice holds no TP-{size} group: a replica on a MIG profile is one slice"
            return f"no MIG slice of this profile free ({len(self.devices)} on this host, all held)"
        largest = max((len(g) for g in cluster.domain_gpus.values()), default=0)
        if size > largest:
            return f"no interconnect domain on this host holds a TP-{size} group (the largest has {largest} GPUs)"
        return f"no whole TP-{size} group free in one domain ({cluster.free_count()} GPUs free)"

    def allot_at(self, name: str, gpus: list[int], *, port: int) -> str:
        """Hold exactly ``gpus`` for replica ``name`` (a move's copy on its planned destination); ``NoWholeGroup``
        (nothing held) where any is held or reserved, or not this host's."""
        with self._locked() as holdings:
            cluster = self.cluster(holdings)
            wanted = [Gpu(HOST, int(i)) for i in gpus]
            taken = [g for g in wanted if g not in cluster.gpus or g in cluster.owner]
            if taken or not wanted:
                raise NoWholeGroup(f"GPUs {','.join(str(g.index) for g in taken)} are not free")
            holdings[name] = self._holding(gpus, port=port)
            return self._visible(wanted)

    def reserve(self, group: str, gpus: list[int], *, for_s: float, owners: set[str] = frozenset()) -> bool:
        """Hold ``gpus`` for the waiting ``group`` for ``for_s`` seconds: those free now at once, those a moved
        replica still holds as they free. Whether it did: not where any is held by other than ``owners`` (the
        plan's moved replicas) now, or is not this host's (the plan was made from a snapshot since changed)."""
        with self._locked() as holdings:
            cluster = self.cluster(holdings, without=f"{RESERVED}{group}")
            wanted = [Gpu(HOST, int(i)) for i in gpus]
            taken = [
                g for g in wanted if g not in cluster.gpus or g in cluster.owner and cluster.owner[g] not in owners
            ]
            if taken or not wanted:
                return False
            holdings[f"{RESERVED}{group}"] = {
                "gpus": sorted(int(i) for i in gpus),
                "pid": None,
                "port": 0,
                "at": self.clock(),
                "until": self.clock() + for_s,
            }
            return True

    def unreserve(self, group: str) -> None:
        self.release(f"{RESERVED}{group}")

    def started(self, name: str, pid: int) -> None:
        """The replica's process runs: its holding now lasts as long as the process."""
        with self._locked() as holdings:
            if name in holdings:
                holdings[name]["pid"] = pid

    def release(self, name: str) -> None:
        with self._locked() as holdings:
            holdings.pop(name, None)

    def held(self) -> dict[str, list[int]]:
        """Replica name (``reserved:<key>`` for a reservation) → the GPU indices it holds now; each GPU once (a
        reservation lists what no replica holds)."""
        with self._locked() as holdings:
            cluster = self.cluster(holdings)
        return {name: sorted(g.index for g in cluster.held[name]) for name in holdings if name in cluster.held}

    def moving(self, *, max_age_s: float | None = None) -> dict[str, int]:
        """The copies of moves in flight (name → endpoint id), read without the lock (the file is replaced whole);
        ``max_age_s``: moves started longer ago are left out (a move that outlived its reservation is over)."""
        moves = _clean(self._read(self.state_path))["moves"]
        oldest = self.clock() - max_age_s if max_age_s is not None else float("-inf")
        return {name: move["endpoint_id"] for name, move in moves.items() if move["started_at"] >= oldest}


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _clean(state: dict) -> dict:
    """The defragmenting step's state with what does not read dropped (a hand-edited or truncated file): a waiting
    group without a numeric size, since and last; a move without its source, endpoint, group, size and start."""
    waiting, moves = state.get("waiting"), state.get("moves")
    state["waiting"] = {
        str(key): {part: float(w[part]) for part in ("size", "since", "last")}
        for key, w in (waiting.items() if isinstance(waiting, dict) else ())
        if isinstance(w, dict) and all(_number(w.get(part)) for part in ("size", "since", "last"))
    }
    for w in state["waiting"].values():
        w["size"] = int(w["size"])
    state["moves"] = {
        str(name): m
        for name, m in (moves.items() if isinstance(moves, dict) else ())
        if isinstance(m, dict)
        and isinstance(m.get("source"), str)
        and isinstance(m.get("group"), str)
        and isinstance(m.get("endpoint_id"), int)
        and _number(m.get("size"))
        and _number(m.get("started_at"))
    }
    spent = state.get("spent")
    state["spent"] = [float(t) for t in (spent if isinstance(spent, list) else ()) if _number(t)]
    return state
