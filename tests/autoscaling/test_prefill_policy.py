"""The prefill pool's policy (capacity/autoscaling/prefill.py): scale on computed prompt tokens per second and on a
TTFT queue, down only on a read fleet and after the delay."""

import pytest

from capacity.autoscaling.prefill import PrefillConfig, PrefillInputs, RateSample, decide, tokens_per_s_capacity

NOW = 10_000.0


def inputs(rate: float, **kw) -> PrefillInputs:
    base = dict(
        now=NOW,
        samples=[RateSample(t=NOW - s, tokens_per_s=rate) for s in range(0, 300, 5)],
        ready=2,
        starting=0,
        min_replicas=1,
        max_replicas=8,
        tokens_per_s_per_replica=10_000.0,
        ttft_slo_ms=1000.0,
        scraped=2,
    )
    base.update(kw)
    return PrefillInputs(**base)


def test_capacity_follows_the_prefill_coefficients():
    # 1,000 MU/min at 0.001 MU per prompt token: 1e6 tokens a minute, 16,667 a second.
    assert tokens_per_s_capacity(mu_per_min=1000.0, alpha=0.001) == pytest.approx(16_666.67, rel=1e-4)
    assert tokens_per_s_capacity(mu_per_min=1000.0, alpha=0.0) is None
    assert tokens_per_s_capacity(mu_per_min=float("nan"), alpha=0.001) is None


def test_scales_up_on_the_prompt_rate():
    # 45,000 tokens/s at 60 % of 10,000 per replica needs 7.5 → 8 replicas; the step bound allows +4 from 2.
    d = decide(inputs(45_000.0))
    assert d.desired == 6 and d.reason.startswith("scale up")
    assert d.inputs["up_need"] == pytest.approx(7.5)


def test_holds_within_tolerance_and_at_max():
    assert decide(inputs(11_000.0)).desired == 2  # needs 1.83 of 2
    capped = decide(inputs(90_000.0, ready=8, max_replicas=8))
    assert capped.desired == 8 and "max replicas" in capped.reason


def test_a_ttft_queue_adds_a_replica_the_rate_does_not_show():
    # Mean rate fits 2 replicas, but prompts queue and TTFT is past the SLO: one more.
    d = decide(inputs(6_000.0, ttft_p95_ms=2500.0, waiting=5))
    assert d.desired == 3 and "TTFT" in d.reason
    # One straggler (one waiting prompt on two replicas) is not a queue.
    assert decide(inputs(6_000.0, ttft_p95_ms=2500.0, waiting=1)).desired == 2
    # Already starting one: wait for it.
    assert decide(inputs(6_000.0, ttft_p95_ms=2500.0, waiting=5, ready=2, starting=1)).desired == 3


def test_scales_down_on_the_five_minute_peak_after_the_delay():
    quiet = inputs(1_000.0, ready=6, scraped=6, last_scale_up_at=NOW - 600)
    d = decide(quiet)
    assert d.desired == 5 and d.reason.startswith("scale down")  # one 20 % step from 6
    recent_up = inputs(1_000.0, ready=6, scraped=6, last_scale_up_at=NOW - 60)
    assert decide(recent_up).desired == 6
    # A burst four minutes ago holds the pool: the down window's peak needs 4 replicas.
    samples = [RateSample(t=NOW - s, tokens_per_s=24_000.0 if s == 240 else 1_000.0) for s in range(0, 300, 5)]
    assert decide(inputs(0, samples=samples, ready=6, scraped=6)).desired == 5
    assert decide(inputs(0, samples=samples, ready=4, scraped=4)).desired == 4


def test_never_scales_down_on_an_unread_fleet_or_below_one():
    assert decide(inputs(0.0, ready=4, scraped=3)).desired == 4
    assert decide(inputs(0.0, ready=4, scraped=4, tokens_per_s_per_replica=None)).desired == 4
    assert decide(inputs(0.0, ready=0, starting=0, min_replicas=0)).desired == 1
    assert decide(inputs(0.0, ready=1, scraped=1, min_replicas=0)).desired == 1


def test_config_rejects_nonsense():
    with pytest.raises(ValueError):
        PrefillConfig(target_utilization=0)
    with pytest.raises(ValueError):
        PrefillConfig(max_scale_down_fraction=1.0)
