"""The rollout state machine on hand-built facts: no database, no clock."""

import pytest

from endpoints.rollouts import machine as m
from endpoints.rollouts.machine import Decision, RolloutConfig, RolloutFacts, VersionStats, compare, decide

CANARY = RolloutConfig(
    strategy=m.CANARY,
    canary_steps=(10, 50, 100),
    step_duration_s=30,
    max_surge=2,
    health_timeout_s=120,
    error_rate_margin=0.05,
    latency_burn_margin=0.10,
    min_samples=20,
)
ALL = RolloutConfig(strategy=m.ALL_AT_ONCE, max_surge=2, health_timeout_s=120)


def facts(state, **kw):
    base = dict(state=state, now=1000.0, state_since=1000.0, baseline_ready=3, old_ready=3)
    return RolloutFacts(**{**base, **kw})


def test_pending_starts_the_surge_bounded_by_max_surge():
    d = decide(facts(m.PENDING), ALL)
    assert (d.state, d.launch, d.traffic_percent) == (m.SURGING, 2, 0)
    assert d.kind == "surge"


def test_surge_tops_up_to_the_old_ready_count_with_at_most_max_surge_starting():
    # 2 starting already: nothing more may start
    assert decide(facts(m.SURGING, new_starting=2), ALL).launch == 0
    # one of them healthy but not warmed yet still counts as starting
    assert decide(facts(m.SURGING, new_starting=1, new_ready=1), ALL).launch == 0
    # both warmed: the third starts
    assert decide(facts(m.SURGING, new_warmed=2), ALL).launch == 1
    # never beyond the baseline count
    assert decide(facts(m.SURGING, new_warmed=2, new_starting=1), ALL).launch == 0


def test_no_traffic_moves_until_every_new_replica_is_warmed_up():
    d = decide(facts(m.SURGING, new_warmed=2, new_ready=1), ALL)
    assert d.state == m.SURGING and d.traffic_percent == 0 and not d.drain_old


def test_all_at_once_promotes_when_all_new_replicas_are_warm_and_drains_the_old_version():
    d = decide(facts(m.SURGING, new_warmed=3), ALL)
    assert (d.state, d.traffic_percent, d.drain_old) == (m.PROMOTING, 100, True)
    # promoting keeps draining until the old version is gone, then succeeds
    assert decide(facts(m.PROMOTING, traffic_percent=100, new_warmed=3, old_ready=0, old_draining=2), ALL).drain_old
    done = decide(facts(m.PROMOTING, traffic_percent=100, new_warmed=3, old_ready=0, old_draining=0), ALL)
    assert done.state == m.SUCCEEDED and done.traffic_percent == 100


def test_an_idle_endpoint_still_gets_one_new_replica():
    d = decide(facts(m.PENDING, baseline_ready=0, old_ready=0), ALL)
    assert d.launch == 1
    assert decide(facts(m.SURGING, baseline_ready=0, new_warmed=1), ALL).state == m.PROMOTING


def test_canary_walks_its_steps_after_each_observation_window():
    first = decide(facts(m.SURGING, new_warmed=3), CANARY)
    assert (first.state, first.traffic_percent, first.step_index, first.new_step) == (m.SHIFTING, 10, 0, True)
    shifting = dict(traffic_percent=10, step_index=0, step_started_at=1000.0, new_warmed=3)
    # within the window: stay
    assert decide(facts(m.SHIFTING, now=1029.0, **shifting), CANARY).traffic_percent == 10
    second = decide(facts(m.SHIFTING, now=1030.0, **shifting), CANARY)
    assert (second.traffic_percent, second.step_index, second.new_step) == (50, 1, True)
    last = decide(facts(m.SHIFTING, now=1100.0, **{**shifting, "traffic_percent": 50, "step_index": 1}), CANARY)
    assert (last.state, last.traffic_percent, last.drain_old) == (m.PROMOTING, 100, True)


def test_a_new_replica_that_fails_rolls_back_and_says_which():
    d = decide(facts(m.SURGING, new_starting=1, new_failures=("local-ab12: process 42 exited (code 1)",)), CANARY)
    assert (d.state, d.traffic_percent, d.drain_new) == (m.ROLLING_BACK, 0, True)
    assert "local-ab12" in d.reason


def test_new_replicas_not_healthy_in_time_roll_back():
    assert decide(facts(m.SURGING, now=1120.0, new_starting=2), CANARY).state == m.SURGING
    d = decide(facts(m.SURGING, now=1121.0, new_starting=2, new_warmed=1), CANARY)
    assert d.state == m.ROLLING_BACK
    assert "1 of 3" in d.reason and "121 s" in d.reason


def test_canary_error_burn_rolls_back_only_past_the_margin_and_with_enough_samples():
    shifting = dict(traffic_percent=10, step_index=0, step_started_at=1000.0, new_warmed=3, now=1010.0)
    bad = VersionStats(requests=40, errors=8)  # 20 %
    good = VersionStats(requests=400, errors=4)  # 1 %
    d = decide(facts(m.SHIFTING, canary=bad, baseline=good, **shifting), CANARY)
    assert d.state == m.ROLLING_BACK and "error rate 20.0% vs 1.0%" in d.reason
    # too few canary samples: no verdict yet
    few = VersionStats(requests=19, errors=19)
    assert decide(facts(m.SHIFTING, canary=few, baseline=good, **shifting), CANARY).state == m.SHIFTING
    # within the margin (old version equally bad): keep going
    same = VersionStats(requests=40, errors=3)
    assert (
        decide(facts(m.SHIFTING, canary=same, baseline=VersionStats(400, 20), **shifting), CANARY).state == m.SHIFTING
    )


def test_canary_latency_burn_compares_slo_misses_among_answered_requests():
    slow = VersionStats(requests=50, errors=0, slo_misses=15)  # 30 % missed
    base = VersionStats(requests=500, errors=0, slo_misses=50)  # 10 %
    assert "latency SLO misses 30.0% vs 10.0%" in compare(slow, base, CANARY)
    assert compare(VersionStats(50, 0, 9), base, CANARY) is None  # 18 %: within the 10-point margin


def test_paused_and_finished_rollouts_do_nothing():
    for state in (m.PAUSED, m.SUCCEEDED, m.ROLLED_BACK, m.FAILED):
        d = decide(facts(state, traffic_percent=10, new_failures=("x",)), CANARY)
        assert d == Decision(state=state, traffic_percent=10, step_index=0)


def test_rolling_back_drains_the_new_version_until_none_is_left():
    d = decide(facts(m.ROLLING_BACK, new_warmed=1, new_draining=1), CANARY)
    assert (d.state, d.traffic_percent, d.drain_new) == (m.ROLLING_BACK, 0, True)
    assert decide(facts(m.ROLLING_BACK), CANARY).state == m.ROLLED_BACK


def test_decisions_are_repeatable_on_the_same_facts():
    f = facts(m.SURGING, new_warmed=1, new_starting=1)
    assert decide(f, CANARY) == decide(f, CANARY)


@pytest.mark.parametrize(
    "steps, error",
    [
        ([], "non-empty"),
        ([10, 5, 100], "rise"),
        ([10, 50], "end at 100"),
        ([0, 100], "between 1 and 100"),
        (["10", 100], "whole percents"),
    ],
)
def test_canary_steps_are_validated(steps, error):
    with pytest.raises(ValueError, match=error):
        m.validate_canary_steps(steps)
