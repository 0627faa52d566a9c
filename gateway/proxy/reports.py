"""What this proxy process reports on each heartbeat (``ProxyState._beat``): its streams per replica, its demand
per replica and priority class (what runs plus its share of the endpoint's queue), and the replicas' limits,
summed over its pools of replica slots (each endpoint's runtime and a disaggregated endpoint's prefill pool; a
replica may be in two while a prefill pool retires).

A busy process runs streams on every replica of a large fleet, so the sums are kept, not rebuilt: a pool notes the
replicas whose streams moved (``flight_moved``, on every take and release) and that its replicas or limits changed
(``limits_moved``, on a new snapshot), and a beat reads again only those replicas, adding to each sum the
difference from what the pool reported before. A pool with requests queued, now or at the last beat, is read whole
(its queue is spread over all its replicas), as is a pool new to the sums and one where most replicas moved (whole
is then the cheaper read); a pool gone has what it reported taken away. So a beat costs what moved since the last one, not the fleet (``bench scale``'s ``heartbeat`` loop)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from gateway.admission.shares import class_counts

_PARTS = ("demand", "critical", "sheddable")


@dataclass
class _Reported:
    """What one pool reported last: its streams and demand rows per replica (non-zero only), its limits."""

    flight: dict[str, int] = field(default_factory=dict)
    rows: dict[str, tuple[int, ...]] = field(default_factory=dict)
    limits: dict[str, int] = field(default_factory=dict)
    queued: bool = False


class OwnReports:
    """The sums over this process's pools, brought up to date once a beat by ``refresh``."""

    def __init__(self) -> None:
        self.in_flight: dict[str, int] = {}  # replica id → this process's streams there (non-zero only)
        self.rows: dict[str, tuple[int, ...]] = {}  # replica id → its demand per class (non-zero only)
        self.limits: dict[str, int] = {}  # replica id → its concurrency limit (serving replicas)
        self.parts: dict[str, dict[str, int]] = {name: {} for name in _PARTS}  # ``demand_parts`` of ``rows``
        # Each part as the heartbeat sends it, a JSON member per replica, kept as the part moves: a busy fleet's
        # maps are large, and encoding one whole every beat costs more than the rest of what moved (``encoded``).
        self._json: dict[str, dict[str, str]] = {name: {} for name in _PARTS}
        self._keys: dict[str, str] = {}  # replica id → its JSON key and colon (replicas are few and stable)
        self._pools: dict = {}  # pool → ``_Reported``
        # Replica id → the pools with a slot on it (draining ones too; a replica may be in two), made again when the
        # pools or their replicas change: a beat moves the caps of the replicas that moved, not pool by pool.
        self.pools_of: dict[str, tuple] = {}

    def refresh(self, pools: list, *, whole: bool = False) -> tuple[set[str], set[str]]:
        """Bring the sums up to date with ``pools``; the replicas whose streams moved and those whose demand moved
        since the last refresh. ``whole``: read every pool whole (the heartbeat's full beat: whatever the sums
        missed is put right within that)."""
        flight: dict[str, int] = {}  # replica → the change in its streams
        rows: list[tuple[str, tuple | None, tuple | None]] = []  # (replica, a pool's row before, after)
        limits_moved = reindex = whole
        for pool in self._pools.keys() - set(pools):  # gone: what it reported goes with it
            gone = self._pools.pop(pool)
            _moves(gone, {}, {}, gone.flight.keys() | gone.rows.keys(), flight, rows)
            limits_moved = reindex = True
        for pool in pools:
            last = self._pools.get(pool)
            queue = getattr(pool, "queue", ())
            moved = pool.flight_moved
            if (
                whole
                or last is None
                or pool.limits_moved
                or last.queued
                or len(queue)
                or 2 * len(moved) > len(pool.slots)
            ):
                reindex = reindex or last is None or pool.limits_moved
                pool.flight_moved, pool.limits_moved = set(), False
                now = _Reported(pool.in_flight_by_replica(), pool.demand_by_replica(), pool.replica_limits())
                now.queued = bool(len(queue))
                before = last or _Reported()
                rids = before.flight.keys() | before.rows.keys() | now.flight.keys() | now.rows.keys()
                _moves(before, now.flight, now.rows, rids, flight, rows)
                limits_moved = limits_moved or now.limits != before.limits
                self._pools[pool] = now
            elif moved:  # the usual busy pool: a few of its replicas, each looked at once (kept lean)
                rids, pool.flight_moved = moved, set()
                was_flight, was_rows = last.flight, last.rows
                for rid in rids:
                    n, row = pool.report_of(rid)
                    change = n - was_flight.get(rid, 0)
                    if change:
                        flight[rid] = flight.get(rid, 0) + change
                        _set(was_flight, rid, n or None)
                    old = was_rows.get(rid)
                    if old != row:
                        rows.append((rid, old, row))
                        _set(was_rows, rid, row)
        if limits_moved:  # a snapshot's change: rare, so the limits are summed again whole
            self.limits = {}
            for pool in pools:
                self.limits.update(self._pools[pool].limits)
        if reindex:
            index: dict[str, list] = {}
            for pool in pools:
                for rid in pool.slots:
                    index.setdefault(rid, []).append(pool)
            self.pools_of = {rid: tuple(held) for rid, held in index.items()}
        return self._apply(flight, rows)

    def _apply(self, flight: dict[str, int], rows: list) -> tuple[set[str], set[str]]:
        """Add the changes to the sums and ``parts``; the replicas whose streams and whose demand moved."""
        flight_moved = set()
        for rid, change in flight.items():
            if change:
                _set(self.in_flight, rid, self.in_flight.get(rid, 0) + change or None)
                flight_moved.add(rid)
        rows_moved = set()
        for rid, old, new in rows:
            have = self.rows.get(rid)
            if have == old:  # the replica is in this pool alone
                have = new
            else:
                if have is not None and old is not None:
                    have = tuple(a - b for a, b in zip(have, old, strict=True))
                if new is not None:
                    have = new if have is None else tuple(a + b for a, b in zip(have, new, strict=True))
            _set(self.rows, rid, have if have is not None and any(have) else None)
            rows_moved.add(rid)
        (total, critical, sheddable), keys = (self.parts[name] for name in _PARTS), self._keys
        texts = [self._json[name] for name in _PARTS]
        for rid in rows_moved:  # as ``demand_parts`` gives them
            row = self.rows.get(rid)
            key = keys.get(rid) or keys.setdefault(rid, json.dumps(rid) + ":")
            counts = class_counts(row) if row is not None else (0, 0, 0)
            for part, text, n in zip((total, critical, sheddable), texts, counts, strict=True):
                if n:
                    part[rid], text[rid] = n, key + str(n)
                elif rid in part:
                    del part[rid], text[rid]
        return flight_moved, rows_moved

    def encoded(self, name: str) -> str:
        """``json.dumps(self.parts[name])``, compact, from the members kept (the same map, in another order)."""
        return "{" + ",".join(self._json[name].values()) + "}"


def _moves(before: _Reported, flight: dict, rows: dict, rids, flight_changes: dict, row_changes: list) -> None:
    """One pool's reports on ``rids`` going from ``before`` to ``flight`` and ``rows``: noted as changes."""
    for rid in rids:
        change = flight.get(rid, 0) - before.flight.get(rid, 0)
        if change:
            flight_changes[rid] = flight_changes.get(rid, 0) + change
        old, new = before.rows.get(rid), rows.get(rid)
        if old != new:
            row_changes.append((rid, old, new))


def _set(mapping: dict, key, value) -> None:
    """``mapping[key] = value``, or no ``key`` where ``value`` is None."""
    if value is None:
        mapping.pop(key, None)
    else:
        mapping[key] = value
