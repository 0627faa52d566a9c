"""The one percentile of the code base, nearest rank: the capacity ledger's, the replica benchmark's, the simulator's
and the benchmarks' figures all read latencies and usage with it. Pure: no Django."""

from __future__ import annotations

import math
from collections.abc import Iterable


def percentile(values: Iterable[float], q: float) -> float | None:
    """The q-th percentile (q in 0–100) by nearest rank: the ⌈q/100 · n⌉-th smallest of the n values (the smallest
    for q = 0, the largest for q ≥ 100). Always one of the values, never an interpolation between two, so a p95 of
    per-minute usage is a minute that happened. None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    rank = min(len(ordered), max(1, math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]
