"""The vertical policy: fast decrease on overload, slow increase when healthy, only on stable signals, bounded."""

import pytest

from capacity.autoscaling.vertical import VerticalConfig, VerticalInputs, VerticalState, decide


def run_cycles(n, limit=64, **signals):
    base = dict(min_limit=8, max_limit=128, ttft_slo_ms=2000, tpot_slo_ms=100)
    state, decisions = VerticalState(), []
    for _ in range(n):
        d = decide(VerticalInputs(current_limit=limit, state=state, **base, **signals))
        state, limit = d.state, d.desired
        decisions.append(d)
    return decisions


HEALTHY = dict(ttft_p95_ms=300, tpot_p95_ms=30, kv_usage=0.3, waiting_per_replica=0)
OVERLOADED = dict(ttft_p95_ms=300, tpot_p95_ms=130, kv_usage=0.3, waiting_per_replica=0)  # decode too slow
TTFT_ONLY = dict(ttft_p95_ms=3000, tpot_p95_ms=30, kv_usage=0.3, waiting_per_replica=0)


def test_an_overload_shorter_than_a_cold_start_does_not_move_the_limit():
    first, second, third = run_cycles(3, **OVERLOADED)
    assert first.desired == second.desired == 64 and second.reason.startswith("hold")
    # the third consecutive overloaded cycle (90 s) cuts fast: ×0.7, bounded to 30% per cycle
    assert third.desired == 45 and third.reason.startswith("decrease")


def test_replica_ttft_alone_waits_out_a_backlog_handed_to_a_fresh_replica():
    # A replica fresh from its cold start gets the proxy's backlog at once and its TTFT p95 is far over the SLO
    # while decode, KV cache and its queue are fine: that is the horizontal axis catching up, not too many
    # sequences. Three such cycles (90 s, shorter than a cold start) must not cut the limit...
    assert [d.desired for d in run_cycles(7, **TTFT_ONLY)] == [64] * 7
    # ...eight (4 min, longer than any cold start) do
    assert run_cycles(8, **TTFT_ONLY)[-1].desired == 45
    # and TTFT beside another signal is an overload like any other
    assert run_cycles(3, ttft_p95_ms=3000, tpot_p95_ms=30, kv_usage=0.97)[-1].desired == 45


def test_increase_is_slow_and_needs_three_healthy_cycles():
    decisions = run_cycles(6, **HEALTHY)
    assert [d.desired for d in decisions] == [64, 64, 72, 72, 72, 81]


def test_a_flapping_signal_never_moves_the_limit():
    limit, state = 64, VerticalState()
    for i in range(10):
        signals = OVERLOADED if i % 2 else HEALTHY
        d = decide(
            VerticalInputs(
                current_limit=limit,
                min_limit=8,
                max_limit=128,
                ttft_slo_ms=2000,
                tpot_slo_ms=100,
                state=state,
                **signals,
            )
        )
        state, limit = d.state, d.desired
    assert limit == 64


def test_between_thresholds_holds_and_resets_streaks():
    # TTFT at 80% of SLO: not overloaded, not healthy
    (d,) = run_cycles(1, ttft_p95_ms=1600, tpot_p95_ms=30)
    assert d.desired == 64 and d.state == VerticalState()


@pytest.mark.parametrize(
    "signals",
    [
        dict(ttft_p95_ms=300, tpot_p95_ms=150),  # TPOT over SLO
        dict(ttft_p95_ms=300, tpot_p95_ms=30, kv_usage=0.97),  # KV cache nearly full
        dict(ttft_p95_ms=300, tpot_p95_ms=30, waiting_per_replica=12),  # replicas queueing internally
    ],
)
def test_each_overload_signal_decreases(signals):
    assert run_cycles(3, **signals)[-1].desired < 64


def test_bounds_hold():
    assert run_cycles(4, limit=9, **OVERLOADED)[-1].desired == 8
    assert run_cycles(9, limit=126, **HEALTHY)[-1].desired == 128
    # a limit outside the bounds is pulled in
    assert (
        decide(
            VerticalInputs(current_limit=500, min_limit=8, max_limit=128, ttft_slo_ms=2000, tpot_slo_ms=100)
        ).desired
        == 128
    )


def test_no_samples_holds():
    (d,) = run_cycles(1)
    assert d.desired == 64 and "no latency samples" in d.reason


def test_change_per_cycle_is_bounded():
    cfg = VerticalConfig(decrease_factor=0.1, max_change_fraction=0.25, overload_cycles=1)
    d = decide(
        VerticalInputs(current_limit=100, min_limit=1, max_limit=128, ttft_slo_ms=2000, tpot_slo_ms=100, **OVERLOADED),
        cfg,
    )
    assert d.desired == 75


def test_increase_can_require_a_loaded_fleet():
    cfg = VerticalConfig(increase_min_busy=0.5, healthy_cycles=1)
    base = dict(current_limit=64, min_limit=8, max_limit=128, ttft_slo_ms=2000, tpot_slo_ms=100, **HEALTHY)
    idle = decide(VerticalInputs(busy_fraction=0.1, **base), cfg)
    assert idle.desired == 64 and "only 10% of the limit in use" in idle.reason
    assert decide(VerticalInputs(busy_fraction=0.7, **base), cfg).desired == 72


def test_a_quiet_fleet_does_not_raise_the_limit_by_default():
    # A night at one replica is "healthy" at any limit: by default that is no evidence for more sequences
    assert [d.desired for d in run_cycles(6, busy_fraction=0.05, **HEALTHY)] == [64] * 6
    assert run_cycles(3, busy_fraction=0.75, **HEALTHY)[-1].desired == 72


def test_a_fleet_healthy_well_below_its_limit_does_not_raise_it():
    # Replicas running 40 % of their limit, healthy, through a plateau hour: healthy at that batch says nothing of
    # the limit, and the horizontal axis would shrink the fleet to run most of whatever the limit became (a
    # real-length day walked it 64 -> 232 this way and missed the SLO all afternoon).
    assert [d.desired for d in run_cycles(120, busy_fraction=0.4, **HEALTHY)] == [64] * 120
