"""How several proxy processes split each replica's concurrency limit between them (pure, no Django).

Each process sends at most its *cap* of concurrent requests to a replica. Live processes are the members of
one heartbeat group (``endpoints.proxy.state`` keeps it in Redis: each member writes its join time, its last
heartbeat and its in-flight count per replica, all stamped with Redis' clock, and reads everyone's in the same
atomic script). From one such read every member computes the same fair split: ``limit // n`` each, and the
remainder one by one to the first members in id order. A member's cap is then::

    cap_i = max(0, limit - sum over the other members j of max(in_flight_j, fair_j))

which equals its fair share when everyone is within theirs, and is smaller while another member still runs
more than its new share (after a member joined, the older ones keep their surplus streams until they end).
So the sum over processes stays within the limit through membership changes, provided that:

* a new member takes nothing until every other member has heartbeated after it joined (``settled``): from then
  on they all count it, so none of them still admits against the old, larger share;
* a member that leaves deletes its entry (its streams are over) or, when it dies, its entry expires after the
  heartbeat TTL; the others grow only then.

Trade-offs: a joining process queues its first requests for about one heartbeat interval; a dead process's
share is idle for up to the TTL; a member whose heartbeat stalls past the TTL (event loop blocked for seconds)
is counted out by the others while it may still run streams, so the TTL must stay well above the interval;
and while Redis is unreachable every process keeps its last caps (nobody can see a change, so nobody grows).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Member:
    """One live proxy process as the last heartbeat read showed it (times on the shared Redis clock)."""

    joined: float
    seen_at: float
    in_flight: Mapping[str, int] = field(default_factory=dict)  # replica id → streams it runs there


def fair_share(limit: int, member_ids: list[str], member_id: str) -> int:
    """``limit // n``, plus one for the first ``limit % n`` members in id order (the shares sum to ``limit``)."""
    ordered = sorted(member_ids)
    base, extra = divmod(limit, len(ordered))
    return base + (1 if ordered.index(member_id) < extra else 0)


def settled(me: str, members: Mapping[str, Member]) -> bool:
    """Every other member has heartbeated since ``me`` joined, so each of them counts ``me`` already."""
    mine = members.get(me)
    if mine is None:
        return False
    return all(m.seen_at > mine.joined for mid, m in members.items() if mid != me)


def replica_caps(me: str, members: Mapping[str, Member], limits: Mapping[str, int]) -> dict[str, int]:
    """This process's cap per replica (``limits``: replica id → its concurrency limit)."""
    if me not in members or not settled(me, members):
        return {rid: 0 for rid in limits}
    ids = list(members)
    if len(ids) == 1:
        return dict(limits)
    caps = {}
    for rid, limit in limits.items():
        others = sum(
            max(m.in_flight.get(rid, 0), fair_share(limit, ids, mid)) for mid, m in members.items() if mid != me
        )
        caps[rid] = max(0, limit - others)
    return caps
