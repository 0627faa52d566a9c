"""Small statistics the benchmarks share (pure): the 95 % confidence interval of a mean, and the bootstrap interval
of a difference of medians."""

import math
import random
import statistics

from capacity.percentiles import percentile

# Two-sided 95 % Student t quantiles by degrees of freedom (samples − 1); beyond 30, 2.0 (exact at 60 degrees,
# within 2 % from 31 up and conservative past 60).
_T95 = {
    1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
    11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086,
    21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048, 29: 2.045, 30: 2.042,
}  # fmt: skip


def interval(values: list[float]) -> list[float] | None:
    """The 95 % confidence interval of the mean of ``values`` (None for fewer than two)."""
    if len(values) < 2:
        return None
    mean, half = statistics.fmean(values), _T95.get(len(values) - 1, 2.0) * statistics.stdev(values)
    half /= math.sqrt(len(values))
    return [round(mean - half, 4), round(mean + half, 4)]


def added_p50_interval(direct: list[float], proxied: list[float], *, resamples: int = 400) -> list[float] | None:
    """95 % bootstrap interval of p50(proxied) − p50(direct) in ms (seconds in): how far the run's own sampling
    noise could move the added p50 (fixed seed, so the same samples give the same interval); None for fewer than
    20 of either."""
    if len(direct) < 20 or len(proxied) < 20:
        return None
    rng = random.Random(0)
    diffs = sorted(
        percentile(rng.choices(proxied, k=len(proxied)), 50) - percentile(rng.choices(direct, k=len(direct)), 50)
        for _ in range(resamples)
    )
    return [round(percentile(diffs, 2.5) * 1000, 2), round(percentile(diffs, 97.5) * 1000, 2)]
