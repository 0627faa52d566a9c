"""Burn-rate arithmetic, budgets, the SLI counting rules and the alert state machine (pure, no database)."""

from datetime import UTC, datetime, timedelta

import pytest

from billing.slo import (
    WINDOW_PAIRS,
    SliSpec,
    alert_step,
    budget_remaining,
    burn_rate,
    exhaustion_at,
    pair_condition,
    sli_counts,
    snap_bound,
)

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def test_burn_rate_is_error_ratio_over_budget():
    assert burn_rate(999, 1000, 0.999) == pytest.approx(1.0)
    assert burn_rate(856, 1000, 0.99) == pytest.approx(14.4)
    assert burn_rate(0, 0, 0.999) == 0.0  # no traffic burns nothing


def test_budget_remaining_and_exhaustion():
    # 1,000,000 requests at 99.9%: 1,000 bad allowed; 250 bad leaves 75 %.
    assert budget_remaining(1_000_000 - 250, 1_000_000, 0.999) == pytest.approx(0.75)
    assert budget_remaining(1_000_000 - 2_000, 1_000_000, 0.999) == pytest.approx(-1.0)
    assert budget_remaining(0, 0, 0.999) == 1.0
    # At burn 2 the whole 30-day budget lasts 15 days, so 75 % of it lasts 11.25 days.
    eta = exhaustion_at(remaining=0.75, burn=2.0, period_s=30 * 86400, now=NOW)
    assert eta == NOW + timedelta(days=11.25)
    assert exhaustion_at(remaining=0.5, burn=0.0, period_s=30 * 86400, now=NOW) is None
    assert exhaustion_at(remaining=-0.1, burn=0.0, period_s=30 * 86400, now=NOW) == NOW


def test_window_pairs_are_the_sre_workbook_ones():
    assert [(p.severity, p.long_window, p.short_window, p.burn_rate) for p in WINDOW_PAIRS] == [
        ("page", "1h", "5m", 14.4),
        ("page", "6h", "30m", 6.0),
        ("ticket", "1d", "2h", 3.0),
        ("ticket", "3d", "6h", 1.0),
    ]


def test_pair_needs_both_windows_above_threshold():
    page = WINDOW_PAIRS[0]
    assert pair_condition({"1h": 15, "5m": 20}, page)
    assert not pair_condition({"1h": 15, "5m": 2}, page)  # the short window says it has stopped: no page
    assert not pair_condition({"1h": 3, "5m": 100}, page)  # a blip: the long window has not burned enough


SUMS = {
    "requests": 100,
    "ok": 80,
    "good": 60,
    "rate_limited": 5,
    "client_cancelled": 5,
    "ttft_le_1000": 70,
    "ttft_le_2000": 75,
    "tpot_le_50": 65,
    "tpot_le_100": 78,
}


def test_sli_counting_rules():
    spec = dict(objective=0.99, ttft_ms=2000, tpot_ms=100)
    # Rate-limited and cancelled requests are the client's doing: 90 valid, 80 ok.
    assert sli_counts(SliSpec(kind="availability", **spec), SUMS) == (80, 90)
    assert sli_counts(SliSpec(kind="ttft", **spec), SUMS) == (75, 80)
    assert sli_counts(SliSpec(kind="tpot", **spec), SUMS) == (78, 80)
    assert sli_counts(SliSpec(kind="goodput", **spec), SUMS) == (60, 90)
    # Custom goodput thresholds fall back to the Fréchet lower bound of the two histograms: 70 + 65 - 80.
    custom = SliSpec(kind="goodput", objective=0.99, ttft_ms=1200, tpot_ms=60, thresholds_are_endpoint_defaults=False)
    assert sli_counts(custom, SUMS) == (55, 90)


def test_thresholds_snap_down_to_a_histogram_bound():
    assert snap_bound(2000, (1000, 2000, 3000)) == 2000
    assert snap_bound(2999, (1000, 2000, 3000)) == 2000
    assert snap_bound(10, (1000, 2000)) == 1000


def test_bad_specs_are_refused():
    with pytest.raises(ValueError):
        SliSpec(kind="latency", objective=0.99, ttft_ms=1, tpot_ms=1)
    with pytest.raises(ValueError):
        SliSpec(kind="ttft", objective=1.0, ttft_ms=1, tpot_ms=1)


def test_alert_state_machine():
    t0 = NOW
    step = alert_step(state=None, condition=True, pending_since=None, now=t0, for_s=60)
    assert (step.state, step.notify) == ("pending", None)
    step = alert_step(state="pending", condition=True, pending_since=t0, now=t0 + timedelta(seconds=30), for_s=60)
    assert (step.state, step.notify) == ("pending", None)
    step = alert_step(state="pending", condition=True, pending_since=t0, now=t0 + timedelta(seconds=60), for_s=60)
    assert (step.state, step.notify) == ("firing", "firing")
    step = alert_step(state="firing", condition=True, pending_since=t0, now=t0 + timedelta(minutes=5), for_s=60)
    assert (step.state, step.notify) == ("firing", None)  # still firing: no second notification
    step = alert_step(state="firing", condition=False, pending_since=t0, now=t0 + timedelta(minutes=6), for_s=60)
    assert (step.state, step.notify) == ("resolved", "resolved")
    # A pending alert whose condition clears resolves quietly.
    step = alert_step(state="pending", condition=False, pending_since=t0, now=t0 + timedelta(seconds=30), for_s=60)
    assert (step.state, step.notify) == ("resolved", None)
    assert alert_step(state=None, condition=False, pending_since=None, now=t0, for_s=60).state is None
