"""The rollout state machine on hand-built facts: no database, no clock."""

from dataclasses import replace

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


def test_pending_starts_the_first_batch_bounded_by_max_surge():
    d = decide(facts(m.PENDING), ALL)
    assert (d.state, d.launch, d.traffic_percent) == (m.SURGING, 2, 0)
    assert d.kind == "surge"
    # the surge never exceeds the ready count: one old replica, max_surge 2 → one extra replica
    assert decide(facts(m.PENDING, baseline_ready=1, old_ready=1), ALL).launch == 1


def test_a_full_batch_starting_blocks_further_launches():
    # 3 old + 2 starting = B + S alive: nothing more may start
    assert decide(facts(m.SURGING, new_starting=2), ALL).launch == 0
    # one of them healthy but not warmed yet still holds its slot and gets no traffic
    d = decide(facts(m.SURGING, new_starting=1, new_ready=1), ALL)
    assert (d.launch, d.traffic_percent, d.drain_old) == (0, 0, 0)


def test_warmed_replicas_take_traffic_in_proportion_and_as_many_old_ones_drain():
    d = decide(facts(m.SURGING, new_warmed=2), ALL)
    # 2 of 3 new replicas warmed: 66 % of the traffic, the old version keeps 1 replica for its third
    assert (d.state, d.traffic_percent, d.drain_old, d.launch) == (m.SHIFTING, 66, 2, 0)
    assert d.kind == "shift" and d.new_step
    # while the two old ones drain they still hold accelerators: no launch beyond B + S alive
    draining = dict(traffic_percent=66, new_warmed=2, old_ready=1, old_draining=2)
    assert decide(facts(m.SHIFTING, **draining), ALL).launch == 0
    # once they are gone the next (last) batch starts
    d = decide(facts(m.SHIFTING, **{**draining, "old_draining": 0}), ALL)
    assert (d.launch, d.drain_old, d.traffic_percent, d.kind) == (1, 0, 66, "launch")


def test_all_at_once_promotes_when_every_new_replica_is_warm_and_drains_the_rest_of_the_old_version():
    d = decide(facts(m.SHIFTING, traffic_percent=66, new_warmed=3, old_ready=1), ALL)
    assert (d.state, d.traffic_percent, d.drain_old, d.kind) == (m.PROMOTING, 100, 1, "promote")
    # promoting keeps draining until the old version is gone, then succeeds
    assert decide(facts(m.PROMOTING, traffic_percent=100, new_warmed=3, old_ready=1, old_draining=1), ALL).drain_old
    done = decide(facts(m.PROMOTING, traffic_percent=100, new_warmed=3, old_ready=0, old_draining=0), ALL)
    assert done.state == m.SUCCEEDED and done.traffic_percent == 100


def test_an_idle_endpoint_still_gets_one_new_replica():
    d = decide(facts(m.PENDING, baseline_ready=0, old_ready=0), ALL)
    assert d.launch == 1
    assert decide(facts(m.SURGING, baseline_ready=0, old_ready=0, new_warmed=1), ALL).state == m.PROMOTING


def simulate(baseline: int, config: RolloutConfig, tick_s: float = 10.0) -> list[dict]:
    """Apply each decision to a model fleet (launched replicas are warm by the next tick, drained ones gone)."""
    f = facts(m.PENDING, now=0.0, state_since=0.0, baseline_ready=baseline, old_ready=baseline)
    seen = []
    for _ in range(200):
        d = decide(f, config)
        assert d == decide(f, config)  # repeatable on the same facts
        f = replace(
            f,
            state=d.state,
            state_since=f.now if d.state != f.state else f.state_since,
            traffic_percent=d.traffic_percent,
            step_index=d.step_index,
            step_started_at=f.now if d.new_step else f.step_started_at,
            new_starting=f.new_starting + d.launch,
            old_ready=f.old_ready - d.drain_old,
            old_draining=f.old_draining + d.drain_old,
        )
        p = f.traffic_percent
        seen.append(
            {
                "state": f.state,
                "percent": p,
                "alive": f.alive,
                "routable": (f.new_warmed if p > 0 else 0) + (f.old_ready if p < 100 else 0),
                # each version's share of the traffic per ready replica, against 1/B before the rollout
                "load": max(p / 100 / f.new_warmed if p else 0, (100 - p) / 100 / f.old_ready if p < 100 else 0),
            }
        )
        if f.state in m.FINAL:
            return seen
        f = replace(
            f,
            now=f.now + tick_s,
            new_warmed=f.new_warmed + f.new_starting,
            new_starting=0,
            old_draining=0,
        )
    raise AssertionError(f"no end after 200 ticks: {seen[-3:]}")


@pytest.mark.parametrize("baseline", [1, 2, 3, 5])
@pytest.mark.parametrize("max_surge", [1, 2, 10])
@pytest.mark.parametrize("config", [ALL, CANARY], ids=["all_at_once", "canary"])
def test_a_rolling_replacement_never_exceeds_the_surge_nor_drops_capacity(baseline, max_surge, config):
    config = replace(config, max_surge=max_surge)
    seen = simulate(baseline, config)
    assert seen[-1]["state"] == m.SUCCEEDED
    surge = min(baseline, max_surge)
    assert max(s["alive"] for s in seen) == baseline + surge
    assert min(s["routable"] for s in seen) >= baseline
    # no version carries more per replica than before the rollout (one point of rounding on the percent)
    assert max(s["load"] for s in seen) <= 1 / baseline + 0.01
    percents = [s["percent"] for s in seen]
    assert percents == sorted(percents) and percents[-1] == 100


def test_three_old_replicas_with_max_surge_1_go_one_at_a_time():
    seen = simulate(3, replace(ALL, max_surge=1))
    assert max(s["alive"] for s in seen) == 4
    shifts = sorted({s["percent"] for s in seen})
    assert shifts == [0, 33, 66, 100]


def test_the_canary_percent_caps_the_new_version_and_keeps_the_old_version_big_enough_for_the_rest():
    # 2 old replicas, canary at 10 %: one new replica takes 10 %, both old ones stay
    d = decide(facts(m.SURGING, baseline_ready=2, old_ready=2, new_warmed=1), replace(CANARY, max_surge=1))
    assert (d.state, d.traffic_percent, d.drain_old, d.launch) == (m.SHIFTING, 10, 0, 0)
    # next step (50 %) once the window passed: one new replica carries half, one old one is drained
    at_10 = dict(baseline_ready=2, old_ready=2, new_warmed=1, traffic_percent=10, step_started_at=1000.0)
    d = decide(facts(m.SHIFTING, now=1030.0, **at_10), replace(CANARY, max_surge=1))
    assert (d.step_index, d.traffic_percent, d.drain_old, d.new_step) == (1, 50, 1, True)


def test_a_canary_step_advances_only_once_the_new_version_carries_its_percent():
    # step 2 (50 %) with one of 3 new replicas warmed: 33 % so far, window over: the step holds
    at_50 = dict(step_index=1, traffic_percent=33, step_started_at=1000.0, new_warmed=1, old_ready=2, now=1100.0)
    d = decide(facts(m.SHIFTING, **at_50), CANARY)
    assert (d.step_index, d.state) == (1, m.SHIFTING)
    d = decide(facts(m.SHIFTING, **{**at_50, "traffic_percent": 50, "new_warmed": 2}), CANARY)
    assert (d.step_index, d.new_step) == (2, True)


def test_canary_walks_its_steps_after_each_observation_window():
    first = decide(facts(m.SURGING, new_warmed=2), CANARY)
    assert (first.state, first.traffic_percent, first.step_index, first.new_step) == (m.SHIFTING, 10, 0, True)
    shifting = dict(traffic_percent=10, step_index=0, step_started_at=1000.0, new_warmed=2)
    # within the window: stay
    assert decide(facts(m.SHIFTING, now=1029.0, **shifting), CANARY).traffic_percent == 10
    second = decide(facts(m.SHIFTING, now=1030.0, **shifting), CANARY)
    assert (second.traffic_percent, second.step_index, second.new_step) == (50, 1, True)
    # the last step (100 %) leaves the rest to capacity: promoted once all 3 new replicas are warm
    at_50 = {**shifting, "traffic_percent": 50, "step_index": 1, "new_warmed": 3, "old_ready": 2}
    last = decide(facts(m.SHIFTING, now=1100.0, **at_50), CANARY)
    assert (last.state, last.traffic_percent, last.drain_old) == (m.PROMOTING, 100, 2)


def test_a_new_replica_that_fails_rolls_back_and_says_which():
    d = decide(facts(m.SURGING, new_starting=1, new_failures=("local-ab12: process 42 exited (code 1)",)), CANARY)
    assert (d.state, d.traffic_percent, d.drain_new) == (m.ROLLING_BACK, 0, True)
    assert "local-ab12" in d.reason


def test_new_replicas_not_healthy_in_time_roll_back():
    assert decide(facts(m.SURGING, now=1120.0, new_starting=2), CANARY).state == m.SURGING
    d = decide(facts(m.SURGING, now=1121.0, new_starting=2, new_warmed=1), CANARY)
    assert d.state == m.ROLLING_BACK
    assert "1 of 3" in d.reason and "121 s" in d.reason


def test_the_health_timeout_runs_per_batch_from_its_launch():
    later = dict(traffic_percent=33, new_warmed=1, old_ready=2, state_since=0.0, now=1000.0)
    # shifting for 1000 s, but the batch waiting now was launched 60 s ago
    assert decide(facts(m.SHIFTING, new_starting=1, new_waiting_since=940.0, **later), ALL).state == m.SHIFTING
    d = decide(facts(m.SHIFTING, new_ready=1, new_waiting_since=870.0, **later), ALL)
    assert d.state == m.ROLLING_BACK and "130 s" in d.reason


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
    assert (d.state, d.traffic_percent, d.drain_new, d.launch_old) == (m.ROLLING_BACK, 0, True, 0)
    assert decide(facts(m.ROLLING_BACK), CANARY).state == m.ROLLED_BACK


def test_rolling_back_after_old_replicas_drained_starts_them_again_within_the_surge():
    # 1 of 3 old replicas left, 2 new ones still alive: room for 2 more (B + S = 5)
    back = dict(old_ready=1, new_warmed=2, state_since=1000.0)
    d = decide(facts(m.ROLLING_BACK, **back), ALL)
    assert (d.state, d.drain_new, d.launch_old, d.traffic_percent) == (m.ROLLING_BACK, True, 2, 0)
    # the new ones draining and two old ones starting fill B + S: nothing more starts, not done yet
    filling = dict(old_ready=1, old_starting=2, new_draining=2, state_since=1000.0)
    assert decide(facts(m.ROLLING_BACK, **filling), ALL) == Decision(m.ROLLING_BACK, 0, 0, drain_new=True)
    assert decide(facts(m.ROLLING_BACK, old_ready=3), ALL).state == m.ROLLED_BACK
    # old replicas that do not come back within the health timeout: rolled back short, and says so
    d = decide(facts(m.ROLLING_BACK, old_ready=1, state_since=1000.0, now=1200.0), ALL)
    assert d.state == m.ROLLED_BACK and "1 of 3 old replicas" in d.reason


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


def test_a_rolling_rollout_is_judged_on_the_same_margins_while_both_versions_serve():
    # batch 1 of 3 warmed, a third of the traffic on it: the new version errs on 25 % against the old one's 1 %
    shifting = dict(traffic_percent=33, step_started_at=1000.0, new_warmed=1, old_ready=2, now=1010.0)
    strict = replace(ALL, min_samples=20)
    d = decide(facts(m.SHIFTING, canary=VersionStats(40, 10), baseline=VersionStats(400, 4), **shifting), strict)
    assert d.state == m.ROLLING_BACK
    assert d.reason.startswith("new version error rate 25.0% vs 1.0% on the old version")
    # as good as the old one: the rollout carries on with its next batch
    ok = decide(facts(m.SHIFTING, canary=VersionStats(40, 0), baseline=VersionStats(400, 4), **shifting), strict)
    assert ok.state == m.SHIFTING
