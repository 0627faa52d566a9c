"""bench scale's arithmetic on synthetic data: the growth exponent of a known power law, its projection to a goal's
size and the size at which a limit is reached, and the verdicts ``_judge`` prints (the bench's run itself is
tests/benchmarks/test_smoke.py's ``test_scale``)."""

import math
import random

import pytest

from benchmarks.operations.scale import LOOPS, _judge, _lookup
from benchmarks.operations.scale_rows import breaks_at, growth_exponent, projected


@pytest.mark.parametrize("k", [0.0, 0.5, 1.0, 1.7, 2.0])
def test_the_fit_recovers_the_exponent_of_an_exact_power_law(k):
    sizes = [100, 1_000, 10_000, 100_000]
    seconds = [0.003 * n**k for n in sizes]
    assert growth_exponent(sizes, seconds) == pytest.approx(k, abs=1e-9)


def test_the_fit_is_least_squares_on_log_log_axes_through_noise():
    rng = random.Random(3)
    sizes = [10 * 2**i for i in range(12)]
    seconds = [0.01 * n**1.3 * math.exp(rng.gauss(0, 0.05)) for n in sizes]
    assert growth_exponent(sizes, seconds) == pytest.approx(1.3, abs=0.03)
    # Off the line, the slope of the least-squares line (log10 x = 0..3, y = 0, 2, 2, 3: 4.5 / 5), not of the ends.
    assert growth_exponent([1, 10, 100, 1_000], [1, 100, 100, 1_000]) == pytest.approx(0.9)


def test_no_fit_without_two_distinct_positive_sizes():
    assert growth_exponent([100, 100], [1.0, 2.0]) is None
    assert growth_exponent([100], [1.0]) is None
    assert growth_exponent([100, 1_000, 10_000], [0.0, 0.0, 1.0]) is None  # one usable point only


def test_projection_and_breaking_size_follow_the_exponent():
    sizes, seconds = [10, 100], [0.1, 1.0]  # linear: 10 ms a unit
    assert projected(sizes, seconds, 1.0, 1_000) == pytest.approx(10.0)
    assert projected(sizes, seconds, 1.0, 10) == 0.1  # a measured size: its measured figure
    assert breaks_at(sizes, seconds, 1.0, 5.0) == pytest.approx(500)
    assert breaks_at([10, 100], [0.1, 10.0], 2.0, 1_000.0) == pytest.approx(1_000)
    assert breaks_at(sizes, [0.1, 0.1], 0.0, 5.0) is None  # flat: it never reaches the limit


def test_a_goal_past_the_measured_sizes_is_projected_and_says_where_it_breaks():
    loop = LOOPS["autoscaler_tick"]  # < 1 s at 1,000 endpoints
    # 20 CPU-ms an endpoint; the wall clock, on a busy machine, three times that.
    results = [{"seconds": n * 0.06, "cpu_s": n * 0.02, "decisions_stored": n} for n in (20, 50, 100)]
    out = _judge("autoscaler_tick", loop, [20, 50, 100], results, lambda message: None)
    assert out["scale.autoscaler_tick.exponent"] == pytest.approx(1.0)
    assert out["scale.autoscaler_tick.goal_judged"] == "projected, CPU seconds"
    assert out["scale.autoscaler_tick.seconds"] == [1.2, 3.0, 6.0]
    assert out["scale.autoscaler_tick.at_goal"] == pytest.approx(20.0)
    assert out["scale.autoscaler_tick.goal_met"] is False
    assert out["scale.autoscaler_tick.breaks_at"] == 50  # 1 s at 50 endpoints
    assert out["scale.autoscaler_tick.decisions_stored"] == [20, 50, 100]


def test_ingestion_is_judged_on_its_rate_per_cpu_second_and_on_nothing_lost():
    loop = LOOPS["ingestion"]
    fast = [
        {
            "seconds": n / 9_000,
            "cpu_s": n / 25_000,
            "records_per_s": 9_000,
            "records_per_cpu_s": 25_000,
            "lost": 0,
            "duplicated": 0,
        }  # fmt: skip
        for n in (1_000, 10_000)
    ]
    assert _judge("ingestion", loop, [1_000, 10_000], fast, lambda message: None)["scale.ingestion.goal_met"]
    lossy = [dict(fast[0]), dict(fast[1], lost=1)]
    assert not _judge("ingestion", loop, [1_000, 10_000], lossy, lambda message: None)["scale.ingestion.goal_met"]
    slow = [dict(fast[0]), dict(fast[1], records_per_cpu_s=15_000)]
    assert not _judge("ingestion", loop, [1_000, 10_000], slow, lambda message: None)["scale.ingestion.goal_met"]


def test_the_snapshot_goal_needs_its_memory_too_and_the_look_up_must_stay_flat():
    loop = LOOPS["snapshot_build"]
    sizes = [1_000, 10_000]
    heavy = [
        {"seconds": 0.01 * n / 1_000, "cpu_s": 0.01 * n / 1_000, "memory_mb": 3.0 * n / 1_000, "lookup_us": 2.0}
        for n in sizes
    ]
    out = _judge("snapshot_build", loop, sizes, heavy, lambda message: None)
    assert out["scale.snapshot_build.at_goal"] == pytest.approx(1.0)  # fast enough at 100,000 keys…
    assert out["scale.snapshot_build.memory_mb_at_goal"] == 300  # …but 300 MB held
    assert out["scale.snapshot_build.goal_met"] is False
    assert _lookup(sizes, heavy, lambda message: None)["scale.key_lookup.goal_met"]
    cache_misses = [dict(heavy[0]), dict(heavy[1], lookup_us=8.0)]  # 4× but 6 µs more: within the goal
    assert _lookup(sizes, cache_misses, lambda message: None)["scale.key_lookup.goal_met"]
    growing = [dict(heavy[0]), dict(heavy[1], lookup_us=40.0)]
    assert not _lookup(sizes, growing, lambda message: None)["scale.key_lookup.goal_met"]


def test_the_burn_tick_says_when_its_goal_size_had_fewer_rows_than_the_goal():
    loop = LOOPS["burn_tick"]
    results = [{"seconds": n / 1_000, "cpu_s": n / 2_000, "rows": n * 100} for n in (100, 1_000, 10_000)]
    out = _judge("burn_tick", loop, [100, 1_000, 10_000], results, lambda message: None)
    assert out["scale.burn_tick.goal_judged"] == "measured over 1,000,000 rows (the goal's: 100 M), CPU seconds"
    assert out["scale.burn_tick.at_goal"] == 5.0 and out["scale.burn_tick.goal_met"]
