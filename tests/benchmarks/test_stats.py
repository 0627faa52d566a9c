"""The 95 % interval of a mean that the benchmarks report (Student t, by the number of samples)."""

import math
import statistics

import pytest

from benchmarks.serving.stats import interval


@pytest.mark.parametrize(("values", "t"), [([1.0, 2.0, 3.0], 4.303), ([float(v % 7) for v in range(20)], 2.093)])
def test_interval_is_the_mean_plus_or_minus_t_standard_errors(values, t):
    half = t * statistics.stdev(values) / math.sqrt(len(values))
    mean = statistics.fmean(values)
    assert interval(values) == [round(mean - half, 4), round(mean + half, 4)]


def test_interval_needs_two_values_and_is_a_point_for_equal_ones():
    assert interval([]) is None and interval([5.0]) is None
    assert interval([2.5, 2.5, 2.5]) == [2.5, 2.5]
    wide, narrow = interval([0.0, 10.0]), interval([0.0, 10.0] * 20)
    assert narrow[0] > wide[0] and narrow[1] < wide[1]  # more samples, the same spread: a narrower interval
