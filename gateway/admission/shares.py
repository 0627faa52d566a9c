"""How several proxy processes share each replica's concurrency limit (pure, no Django, no Redis).

Each replica's limit is a pool of slot *holdings*. A process admits at most what it holds on a replica (its
*cap*), and the holdings of the live processes never sum above the limit: ``gateway.proxy.state`` changes them
only in one atomic Redis script, the membership heartbeat (every 0.25 s), which grants a process what it asks
for out of what the other live processes do not hold. So the limit holds by construction, whatever
the processes' views of each other, and the rest of this module only decides what to ask for.

What a process may run on a replica (``allocate``) follows demand, computed the same way in every process from
the last heartbeat read, where each member reports, per replica and priority class, the requests it runs plus
those it queues (its *demand*):

1. ``critical`` demand first, then ``standard``, then ``sheddable``, each class split max-min fair between the
   members (a member with 2 gets 2, the others share the rest evenly); so a process running or queueing
   critical requests gets slots ahead of one busy with sheddable ones, whichever process they arrived at;
2. what is left is split evenly (``fair_share``), so an idle process keeps headroom and its first requests
   need not wait for a heartbeat. Where it does not divide evenly, the members that get one more are the next
   ones in id order from a place that depends on the replica (``spread``): the remainder of every replica going to
   the first ids would move the first processes' allocation at nearly every change of demand anywhere, and
   theirs alone, so they would pay for every other process's churn (``bench scale``'s heartbeat loops).

A process's cap is the smaller of its allocation and its holding; it asks to hold ``max(allocation, what it
runs)`` (a running stream is never revoked), so a process over its allocation admits nothing new and gives
back each slot as its streams end, at its next heartbeat; a process under it takes what the others gave back.
An idle process's share therefore moves to a busy one within about two heartbeats, and back when it gets busy.

Queued requests are per endpoint; on each replica a member counts its endpoint's queue split over the
endpoint's replicas in proportion to their limits (``spread_queue``).

Trade-offs: a member that dies keeps its holdings until its entry expires after the heartbeat TTL; a member
whose heartbeat stalls past the TTL (event loop blocked for seconds) is counted out by the others while it may
still run streams, so the TTL must stay well above the interval; while Redis is unreachable every process keeps
its last caps (nobody can take, so nobody exceeds), except on a replica it was never granted anything of (new to
it since its last beat), which it gives its even share: another process granted more of it before Redis went away
can then run it over its limit by that share. Each process knows only its own holdings; what the others hold is
read in Redis, by the heartbeat, as each replica's total for the replicas whose holding a process asks to change.
"""

from __future__ import annotations

import zlib
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from gateway.admission.classes import CLASSES, CRITICAL, SHEDDABLE

_CRITICAL, _SHEDDABLE = CLASSES.index(CRITICAL), CLASSES.index(SHEDDABLE)


@dataclass(frozen=True)
class Member:
    """One live proxy process as the last heartbeat read showed it (times on the shared Redis clock).

    Its demand per replica (what it runs there plus its share of the endpoint's queue) comes as the heartbeat
    carries it: every class together, and the critical and the sheddable part of that (standard is the rest), each
    only where it is not zero. Maps of plain counts: a process reads every other one's on every beat, and a map of
    ints is the cheapest thing to decode and the collector never walks it (``bench scale``'s ``heartbeat`` loop)."""

    joined: float
    seen_at: float
    holdings: Mapping[str, int] = field(default_factory=dict)  # replica id → slots it holds (this process's only)
    demand: Mapping[str, int] = field(default_factory=dict)  # replica id → running + queued, every class
    critical: Mapping[str, int] = field(default_factory=dict)  # replica id → the critical part of it
    sheddable: Mapping[str, int] = field(default_factory=dict)  # replica id → the sheddable part of it
    # The beat that wrote this (the member's own count) and, where known, the replicas whose total demand moved
    # since an earlier one: (that beat, the replicas). A reader holding the member as of that beat need not
    # compare the maps (``gateway.proxy.membership``).
    beat: int | None = field(default=None, compare=False)
    moved_since: tuple[int, Collection[str]] | None = field(default=None, compare=False)


def class_counts(row: Sequence[int]) -> tuple[int, int, int]:
    """One replica's demand per class (``CLASSES`` order) → (every class, critical, sheddable), as a ``Member``'s
    maps hold them (negative counts read as 0). Per replica each heartbeat: a row of the usual shape takes the short
    way."""
    if len(row) != len(CLASSES) or min(row) < 0:
        row = [max(0, int(row[c])) if c < len(row) else 0 for c in range(len(CLASSES))]
    return sum(row), row[_CRITICAL], row[_SHEDDABLE]


def demand_parts(rows: Mapping[str, Sequence[int]]) -> dict[str, dict[str, int]]:
    """Demand per replica as counts per class → a ``Member``'s ``demand``, ``critical`` and ``sheddable`` maps
    (non-zero counts only, ``class_counts``)."""
    parts: tuple[dict[str, int], ...] = ({}, {}, {})
    for rid, row in rows.items():
        for part, n in zip(parts, class_counts(row), strict=True):
            if n:
                part[rid] = n
    return dict(zip(("demand", "critical", "sheddable"), parts, strict=True))


def fair_share(limit: int, member_ids: list[str], member_id: str, start: int = 0) -> int:
    """``limit // n``, plus one for ``limit % n`` members: the next ones in id order from position ``start``
    (mod n; ``spread``), wrapping (the shares sum to ``limit``)."""
    ordered = sorted(member_ids)
    base, extra = divmod(limit, len(ordered))
    return base + (1 if (ordered.index(member_id) - start) % len(ordered) < extra else 0)


@lru_cache(maxsize=1 << 16)
def spread(rid: str) -> int:
    """Where a replica's remainder starts in the members' id order (``fair_share``'s ``start``): the same in every
    process, and evenly spread over the replicas."""
    return zlib.crc32(rid.encode())


def max_min_fill(capacity: int, demands: Mapping[str, int]) -> dict[str, int]:
    """Integer max-min fair split of ``capacity`` over ``demands``: nobody gets more than it asks, the small
    demands are met in full and the rest share evenly (ties broken by id, so every process computes the same)."""
    out = {mid: 0 for mid in demands}
    left = max(0, capacity)
    pending = sorted((d, mid) for mid, d in demands.items() if d > 0)
    while pending and left > 0:
        n = len(pending)
        smallest = pending[0][0]
        if smallest * n <= left:
            for _, mid in pending:
                out[mid] += smallest
            left -= smallest * n
            pending = [(d - smallest, mid) for d, mid in pending if d > smallest]
            continue
        base, extra = divmod(left, n)
        for i, (_, mid) in enumerate(sorted(pending, key=lambda p: p[1])):
            out[mid] += base + (1 if i < extra else 0)
        left = 0
    return out


def spread_queue(queued: tuple[int, ...], limits: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
    """An endpoint's queued requests per class, spread over its replicas in proportion to their limits
    (largest remainders, ties by replica id), so that no request is counted twice."""
    total = sum(max(0, v) for v in limits.values())
    out: dict[str, list[int]] = {rid: [0] * len(queued) for rid in limits}
    if total <= 0:
        return {rid: tuple(v) for rid, v in out.items()}
    for c, count in enumerate(queued):
        if count <= 0:
            continue
        exact = {rid: count * max(0, lim) / total for rid, lim in limits.items()}
        given = {rid: int(x) for rid, x in exact.items()}
        rest = count - sum(given.values())
        for rid in sorted(exact, key=lambda r: (-(exact[r] - given[r]), r))[:rest]:
            given[rid] += 1
        for rid, n in given.items():
            out[rid][c] = n
    return {rid: tuple(v) for rid, v in out.items()}


def allocate(
    me: str,
    members: Mapping[str, Member],
    limits: Mapping[str, int],
    only: Iterable[str] | None = None,
    over: set[str] | None = None,
    totals: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """How many requests ``me`` may run on each replica, from one heartbeat read (see the module docstring).

    Only ``me``'s part of each replica's split is worked out: a class whose demand the slots left cover gives every
    member its demand, so the max-min fill runs only for the class that runs out (it takes all that is left), and
    the even split of the rest is ``me``'s share alone; where every member's demand fits in the limit (the usual
    case), that is one look-up per member and no class is looked at. A heartbeat covers every replica of the fleet, so
    this is per replica and member (``bench scale``'s ``heartbeat`` loop). ``only``: those replicas alone; ``over``:
    a set to add the replicas to where the members' demand exceeds the limit (the only ones whose split looks at
    the classes: elsewhere a member's share follows from the totals alone); ``totals``: every member's demand summed
    per replica, where the caller keeps it (``ShareBook``): a replica under its limit then costs two look-ups, not one
    per member (many processes, each with demand on a few replicas)."""
    if only is not None:
        limits = {rid: limits[rid] for rid in only if rid in limits}
    if me not in members:
        return dict(limits)  # not a member yet: ask for everything; the grant gives what is free
    ids = sorted(members)  # the id order every process uses (``fair_share``, ``max_min_fill``'s ties)
    n, rank = len(ids), ids.index(me)
    demand_maps = [members[mid].demand for mid in ids]
    gets = [d.get for d in demand_maps]  # bound once: this loop runs per replica and member
    own, total_of = gets[rank], (totals or {}).get
    # Replicas some member reports demand on; the rest split evenly. ``only`` is the replicas whose demand moved
    # (``ShareBook``): nearly all demanded, so no set of them is built (an undemanded one's sums are all 0, and the
    # branch below gives it the even share all the same).
    demanded = set().union(*demand_maps) if only is None else None
    classes = range(len(CLASSES))
    out = {}
    for rid, limit in limits.items():
        if demanded is not None and rid not in demanded:  # the usual replica of a large fleet: nobody's requests on it
            base, extra = divmod(max(0, limit), n)
            out[rid] = base + (1 if extra and (rank - spread(rid)) % n < extra else 0)
            continue
        if totals is not None:
            left = limit - total_of(rid, 0)
            if left >= 0:  # every member's demand fits, in every class: each gets its own and a share of the rest
                base, extra = divmod(left, n)
                out[rid] = own(rid, 0) + base + (1 if extra and (rank - spread(rid)) % n < extra else 0)
                continue
        sums = [get(rid, 0) for get in gets]
        left = limit - sum(sums)
        if left >= 0:
            base, extra = divmod(left, n)
            out[rid] = sums[rank] + base + (1 if extra and (rank - spread(rid)) % n < extra else 0)
            continue
        if over is not None:
            over.add(rid)
        mine, left = 0, limit
        # Only the members with demand here take part in its classes' split (many processes, a few on each replica).
        active = [(mid, own) for mid, own in zip(ids, sums, strict=True) if own or mid == me]
        at = [mid for mid, _ in active].index(me)
        for c in classes:
            if left <= 0:
                break
            wanted = [_count(members[mid], rid, c, own) for mid, own in active]
            total = sum(wanted)
            if total <= left:  # everyone's demand in this class fits
                mine += wanted[at]
                left -= total
                continue
            mine += max_min_fill(left, {mid: w for (mid, _), w in zip(active, wanted, strict=True)})[me]
            left = 0
        if left > 0:
            base, extra = divmod(left, n)
            mine += base + (1 if extra and (rank - spread(rid)) % n < extra else 0)
        out[rid] = mine
    return out


def _count(member: Member, rid: str, klass: int, total: int) -> int:
    """One member's demand on a replica in a class (running plus queued), from its heartbeat's maps."""
    if klass == _CRITICAL:
        return member.critical.get(rid, 0)
    if klass == _SHEDDABLE:
        return member.sheddable.get(rid, 0)
    return max(0, total - member.critical.get(rid, 0) - member.sheddable.get(rid, 0))
