"""Hard limits on what the autoscaler may start, whatever demand asks (pure: no Django).

A tenant's quota bounds its endpoints' replicas and GPUs (``quota_ceiling``), and every launch goes through
``launch_allowance``: what is left of the quota, at most so many launches per endpoint per tick, and what the fleet's
per-tick budget still grants. Each binding limit says why, for the decision's reason.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class QuotaLeft:
    """What a tenant may still start: serving replicas, standby replicas, GPUs (None: no quota, a shared endpoint)."""

    serving: int | None = None
    standby: int | None = None
    gpus: int | None = None


def quota_ceiling(*, max_replicas: int, left: QuotaLeft, gpus_per_replica: int) -> tuple[int, str]:
    """The endpoint's effective max replicas: its own max, or fewer when the tenant's quota has less left.

    ``left`` excludes this endpoint's own serving replicas (they are what the ceiling is about)."""
    ceiling, why = max(0, max_replicas), ""
    if left.serving is not None and left.serving < ceiling:
        ceiling, why = max(0, left.serving), f"tenant replica quota caps replicas at {max(0, left.serving)}"
    if left.gpus is not None:
        by_gpus = max(0, left.gpus) // max(1, gpus_per_replica)
        if by_gpus < ceiling:
            ceiling, why = by_gpus, f"tenant GPU quota caps replicas at {by_gpus}"
    return ceiling, why


def launch_allowance(
    *,
    wanted: int,
    standby: bool,
    left: QuotaLeft,
    gpus_per_replica: int,
    per_tick_left: int,
) -> tuple[int, list[str]]:
    """How many of ``wanted`` launches may go ahead before the fleet budget, and why fewer when fewer."""
    allowed, notes = max(0, wanted), []
    limits = []
    slots = left.standby if standby else left.serving
    if slots is not None:
        limits.append((max(0, slots), "tenant warm pool quota" if standby else "tenant replica quota"))
    if left.gpus is not None:
        limits.append((max(0, left.gpus) // max(1, gpus_per_replica), "tenant GPU quota"))
    limits.append((max(0, per_tick_left), "launches per endpoint per tick"))
    for limit, name in limits:
        if limit < allowed:
            allowed = limit
            notes.append(f"{name} allows {limit}")
    return allowed, notes


def rollout_surge_allowance(
    *, wanted: int, baseline: int, left: QuotaLeft, old_gpus_per_replica: int, new_gpus_per_replica: int
) -> tuple[int, str]:
    """The largest surge up to ``wanted`` a rollout may run within the tenant's quota (0: none fits), and why when
    it is less than ``wanted``.

    A rollout of ``baseline`` (B) ready replicas with surge S keeps at most B + S alive (``endpoints.rollouts.
    machine``): S replicas more than now, and at most max(B·g_old + S·g_new, B·g_new + S·g_old) GPUs, the peaks of
    its first and its last batch. ``left`` is what the tenant has left with those B replicas already counted."""
    old, new = max(1, old_gpus_per_replica), max(1, new_gpus_per_replica)
    base = max(0, baseline)
    why = ""
    for surge in range(max(0, wanted), 0, -1):
        extra_gpus = max(base * old + surge * new, base * new + surge * old) - base * old
        if left.serving is not None and surge > left.serving:
            why = f"the tenant's replica quota has {max(0, left.serving)} replica(s) left"
        elif left.gpus is not None and extra_gpus > left.gpus:
            why = f"the tenant's GPU quota has {max(0, left.gpus)} GPU(s) left, a surge of {surge} needs {extra_gpus}"
        else:
            return surge, why
    return 0, why
