"""The horizontal policy's spike-onset floor (docs/algorithms.md#spike-onset) on hand-built arrival series."""

import math
import random

import pytest

from capacity.autoscaling.demand import DemandSample
from capacity.autoscaling.horizontal import (
    HorizontalConfig,
    HorizontalInputs,
    OnsetConfig,
    decide,
    onset,
)

SECONDS_IN_FLIGHT = 30.0  # Little's law for the series below: in flight = rate × 30 s


def arrivals_series(rates, *, end=600.0, seed=7):
    """One sample per second ending at ``end``: Poisson arrivals at ``rates[i]`` requests/s and the in-flight demand
    that rate brings (rate × 30 s), oldest first."""
    rng = random.Random(seed)
    n = len(rates)
    out = []
    for i, rate in enumerate(rates):
        count, threshold, p = 0, math.exp(-rate), rng.random()
        while p > threshold:
            count += 1
            p *= rng.random()
        out.append(DemandSample(t=end - (n - 1 - i), in_flight=rate * SECONDS_IN_FLIGHT, arrivals=count))
    return out


def inputs(samples, **kw):
    base = dict(
        now=samples[-1].t,
        samples=samples,
        ready=3,
        starting=0,
        min_replicas=1,
        max_replicas=60,
        target_concurrency=64,
    )
    base.update(kw)
    return HorizontalInputs(**base)


def ramp(base, top, ramp_s, *, before_s=400, into_s):
    """``before_s`` seconds at ``base``, then ``into_s`` seconds of a linear ramp to ``top`` over ``ramp_s``."""
    return [base] * before_s + [base + (top - base) * min(1.0, (i + 1) / ramp_s) for i in range(into_s)]


def test_a_spike_onset_orders_replicas_for_the_projected_rate_in_one_step():
    # Given 3 requests/s for minutes, then a ramp towards 19/s over 65 s, 24 s in
    samples = arrivals_series(ramp(3.0, 19.0, 65, into_s=24))
    cfg = HorizontalConfig()
    seen = onset(samples, now=samples[-1].t, cfg=cfg.onset)
    decision = decide(inputs(samples), cfg)
    blind = decide(inputs(samples), HorizontalConfig(onset=None))
    # Then the onset is read, its projection is above the present rate, and the floor takes the fleet there at once:
    # more replicas than the reactive rule's bounded step, with the spike-onset floor named
    assert seen is not None and seen.projected_rate > seen.later_rate > seen.earlier_rate
    assert decision.inputs["floor_reason"] == "spike_onset"
    assert decision.desired > blind.desired
    assert decision.reason.startswith("below floor (spike_onset)")
    # And the floor is the long window's demand scaled by the projection (Little's law), never beyond max_growth
    assert (
        decision.desired
        <= math.ceil(cfg.onset.max_growth * seen.later_rate * SECONDS_IN_FLIGHT / (64 * cfg.target_utilization)) + 1
    )


def test_a_noisy_flat_rate_never_reads_as_an_onset():
    # Given 5 minutes and more of Poisson arrivals at a flat 3 requests/s, and a quiet night at 0.2/s
    for rate, seed in ((3.0, 1), (3.0, 2), (0.2, 3), (8.0, 4)):
        samples = arrivals_series([rate] * 1800, end=1800.0, seed=seed)
        # When the policy looks at every second of the last 25 minutes
        for end in range(301, 1801):
            window = [s for s in samples if s.t <= end]
            # Then no onset is read and the fleet sized for the rate is left alone
            assert onset(window, now=float(end), cfg=OnsetConfig()) is None, (rate, seed, end)
        ready = max(1, math.ceil(rate * SECONDS_IN_FLIGHT / (64 * 0.7)))
        decision = decide(inputs(samples, ready=ready))
        assert decision.inputs["floor_reason"] != "spike_onset"


def test_a_plateau_after_the_ramp_is_no_longer_an_onset():
    # Given a spike that reached its top 60 s ago: the rate is high but no longer climbing
    samples = arrivals_series(ramp(3.0, 18.0, 10, into_s=70))
    # Then there is no onset: the reactive rule sizes the plateau on its own
    assert onset(samples, now=samples[-1].t, cfg=OnsetConfig()) is None
    assert decide(inputs(samples, ready=20)).inputs["floor_reason"] != "spike_onset"


def test_a_step_spike_is_projected_at_most_max_growth_times_its_rate():
    # Given a step from 3/s to 15/s 6 s ago: the halves' slope extended by a cold start would be enormous
    samples = arrivals_series([3.0] * 400 + [15.0] * 6)
    seen = onset(samples, now=samples[-1].t, cfg=OnsetConfig(max_growth=1.5))
    # Then the projection is bounded by max_growth × the later half's rate
    assert seen is not None
    assert seen.projected_rate == pytest.approx(1.5 * seen.later_rate)


def test_no_onset_before_the_long_window_is_covered():
    # Given a policy that has seen only 2 minutes of samples, the last seconds of them a ramp
    samples = arrivals_series(ramp(3.0, 19.0, 30, before_s=100, into_s=20))
    # Then it reads no onset: it has no long rate to compare with
    assert onset(samples, now=samples[-1].t, cfg=OnsetConfig()) is None


def test_onset_off_leaves_the_reactive_rule():
    samples = arrivals_series(ramp(3.0, 19.0, 65, into_s=24))
    decision = decide(inputs(samples), HorizontalConfig(onset=None))
    assert decision.inputs["onset"] is None
    assert decision.inputs["floor_reason"] != "spike_onset"


@pytest.mark.parametrize(
    "kw",
    [
        {"short_window_s": 300.0},
        {"ratio": 1.0},
        {"min_z": -1.0},
        {"rise": 0.9},
        {"max_growth": 0.5},
        {"lead_s": -1.0},
    ],
)
def test_onset_config_rejects_nonsense(kw):
    with pytest.raises(ValueError):
        OnsetConfig(**kw)
