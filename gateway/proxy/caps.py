"""How a pool of replica slots (an endpoint's runtime, a disaggregated endpoint's prefill pool) follows this process's
share of each replica's limit (``gateway.admission.shares``; ``ProxyState``'s heartbeat sets it): a slot admits up
to ``min(its limit, its cap)``, and ``caps`` None means no sharing (the whole limits)."""

from __future__ import annotations

from collections.abc import Mapping


def set_caps(pool, caps: dict[str, int] | None, *, merge: bool = False) -> None:
    """Follow new caps: ``caps`` is every replica's, or with ``merge`` only those whose cap moved (a heartbeat's:
    in a busy fleet a beat moves a few replicas of many pools, and is not paid per slot of each)."""
    slots = pool.slots
    if merge and pool.caps is not None and caps is not None:
        pool.caps.update(caps)
        for rid, cap in caps.items():
            slot = slots[rid]
            slot.view.concurrency_limit = min(slot.limit, cap)
        return
    pool.caps = caps
    for rid, slot in slots.items():
        slot.view.concurrency_limit = slot.limit if caps is None else min(slot.limit, caps.get(rid, 0))


def new_cap(pool, rid: str, limit: int, back: bool) -> int:
    """What a replica's slot admits as a snapshot makes it (``back``: new to the pool, or returning after it was
    removed): the whole limit without sharing; 0 for one new or back until the caps are next worked out (a cap kept
    from before it went is stale: another process may hold all of it now); else its cap within the new limit."""
    caps = pool.caps
    if caps is None:
        return limit
    if back:
        caps[rid] = 0
        return 0
    return min(limit, caps.get(rid, 0))


def lower_caps(pool, allocation: Mapping[str, int], only=None) -> None:
    """Before a heartbeat gives slots back: admit nothing beyond this process's new allocation (``only``: on those
    replicas alone)."""
    caps = pool.caps
    if caps is None:
        return
    slots = pool.slots
    for rid in slots if only is None else slots.keys() & only:
        share = allocation.get(rid)
        if share is not None:
            view = slots[rid].view
            view.concurrency_limit = caps[rid] = min(view.concurrency_limit, share)


def lower_caps_of(pools_of: Mapping[str, tuple], allocation: Mapping[str, int], rids) -> None:
    """``lower_caps`` on ``rids`` in every pool with a slot on one (``pools_of``: ``OwnReports.pools_of``): a beat's,
    paid per replica that moved rather than per pool."""
    for rid in rids:
        share = allocation.get(rid)
        if share is None:
            continue
        for pool in pools_of.get(rid, ()):
            caps, slot = pool.caps, pool.slots.get(rid)
            if caps is not None and slot is not None:
                view = slot.view
                view.concurrency_limit = caps[rid] = min(view.concurrency_limit, share)
