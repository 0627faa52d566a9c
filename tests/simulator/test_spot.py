"""Spot capacity in the discrete-event runner: the market lends and takes back replicas, the planner splits the
count, the adapter handles notices (docs/algorithms.md#spot-capacity)."""

import pytest

from capacity.autoscaling.spot import SpotConfig, SpotPlanner
from simulator import workloads
from simulator.autoscaling import EngineSimAutoscaler
from simulator.des import Simulation
from simulator.spot import SpotMarket


class LeastInFlight:
    name = "least"

    def pick(self, request, replicas, now):
        live = [r for r in replicas if r.healthy and not r.draining and r.metrics_age_s < 2.0]
        return min(live, key=lambda r: (r.in_flight, r.replica_id)).replica_id if live else None

    def on_routed(self, request, replica_id, now):
        pass

    def on_finished(self, request, replica_id, now):
        pass


class Launcher:
    """Adds replicas of one capacity type at t=0 and remembers what it got."""

    def __init__(self, n: int, capacity_type: str):
        self.n, self.capacity_type, self.got = n, capacity_type, None

    def tick(self, fleet, actions, now):
        if self.got is None:
            self.got = actions.add_replicas(self.n, cold_start_s=0.5, capacity_type=self.capacity_type)


def test_the_market_refuses_spot_during_an_outage_and_notices_every_spot_replica_when_it_starts():
    market = SpotMarket(reclaims_per_replica_day=0, unavailable=((5.0, 50.0),), notice_s=(30, 30))
    early = Launcher(2, "spot")
    sim = Simulation(router=LeastInFlight(), replicas=1, profile="tiny", autoscaler=early, spot_market=market)
    result = sim.run(workloads.uniform(times=[0.1, 40.0], prompt_tokens=30, output_tokens=20), until_s=60)
    assert early.got == ["r1", "r2"]
    records = {r.replica_id: r for r in result.replicas}
    assert records["r0"].capacity_type == "on_demand" and records["r0"].noticed_s is None
    assert [records[i].noticed_s for i in ("r1", "r2")] == [5.0, 5.0]  # the outage noticed both
    assert [records[i].removed_s for i in ("r1", "r2")] == [35.0, 35.0]  # and took them 30 s later
    assert len(market.reclaims) == 2
    late = SpotMarket(unavailable=((0.0, 50.0),))
    refused = Launcher(3, "spot")
    Simulation(router=LeastInFlight(), replicas=1, profile="tiny", autoscaler=refused, spot_market=late).run(
        workloads.uniform(times=[2.0], prompt_tokens=30, output_tokens=5)
    )
    assert refused.got == [] and late.refused == 3
    with pytest.raises(ValueError):
        Simulation(router=LeastInFlight(), replicas=1, profile="tiny")._actions.add_replicas(1, capacity_type="x")
    with pytest.raises(ValueError):
        SpotMarket(notice_s=(0, 10))


def reclaimed_run(**options):
    """r0 is taken at t=3: it holds a stream started at 0.1 and a request without a token (its engine hung at
    0.5); requests after the notice still reach r0 because nothing handled the notice."""
    sim = Simulation(router=LeastInFlight(), replicas=2, profile="tiny", spot_market=SpotMarket(), **options)
    sim.replicas["r0"].capacity_type = "spot"
    sim.reclaim("r0", at_s=1.0, notice_s=2.0)
    sim.inject_fault("r1", "hang", at_s=0.0)
    sim.inject_fault("r1", "recover", at_s=0.15)
    sim.inject_fault("r0", "hang", at_s=0.5)
    times = [0.1, 0.12, 0.6]  # 0.1 → r0 (streams), 0.12 → r1, 0.6 → r0 (hung: no first token)
    result = sim.run(workloads.uniform(times=times, prompt_tokens=30, output_tokens=900))
    streaming, _other, waiting = sorted(result.requests, key=lambda r: r.arrival_s)
    return result, streaming, waiting


def test_a_reclaimed_replica_retries_what_had_not_streamed_and_resumes_what_was_streaming():
    result, streaming, waiting = reclaimed_run()
    # The stream goes on on r1 from what it had streamed: one answer of 900 tokens, its first token r0's.
    assert streaming.status == "ok" and streaming.replica_id == "r1" and streaming.extra["resumed_from"] == "r0"
    assert streaming.output_tokens == 900 and streaming.first_token_s < 0.5 and streaming.finish_s > 3.0
    assert waiting.status == "ok" and waiting.replica_id == "r1" and waiting.extra["retried_from"] == "r0"
    assert waiting.arrival_s == 0.6 and waiting.first_token_s > 3.0  # its TTFT counts the wait on r0
    record = {r.replica_id: r for r in result.replicas}["r0"]
    assert record.noticed_s == 1.0 and record.reclaimed_s == 3.0 and record.removed_s == 3.0
    # Without resumption (a client of vLLM itself, say), the stream is lost with what it had streamed.
    _, lost, waiting = reclaimed_run(resume_streams=0)
    assert lost.status == "error" and lost.reason == "spot_reclaimed" and lost.finish_s == 3.0
    assert 0 < lost.output_tokens < 900 and waiting.status == "ok"


class Fixed:
    """A policy that always wants ``n`` replicas (the adapter's protocol)."""

    interval_s = 5.0

    def __init__(self, n):
        self.n = n

    def observe(self, sample):
        pass

    def desired(self, *, now, ready, starting):
        return self.n


def test_the_adapter_drains_a_noticed_replica_replaces_it_and_loses_nothing_when_the_notice_outlasts_streams():
    market = SpotMarket(reclaims_per_replica_day=0, notice_s=(60, 60))
    planner = SpotPlanner(SpotConfig(floor_window_s=600, safeguard=0, headroom_fraction=0, replace_s=0))
    scaler = EngineSimAutoscaler(Fixed(4), cold_start_s=5.0, spot=planner)
    sim = Simulation(
        router=LeastInFlight(), replicas=1, profile="tiny", autoscaler=scaler, spot_market=market, cold_start_s=5.0
    )
    # The floor is half the least count asked for: at the first tick r0 stays, r1 and r2 come on spot, r3 on demand.
    sim.reclaim("r1", at_s=20.0, notice_s=60.0)
    result = sim.run(
        workloads.uniform(times=workloads.constant_times(20, count=1200), prompt_tokens=30, output_tokens=50)
    )
    records = {r.replica_id: r for r in result.replicas}
    assert [records[i].capacity_type for i in ("r0", "r1", "r2", "r3")] == ["on_demand", "spot", "spot", "on_demand"]
    noticed = records["r1"]
    assert noticed.noticed_s == 20.0 and noticed.removed_s < 80.0 and noticed.reclaimed_s is None  # drained in time
    replacements = [r for r in result.replicas if r.capacity_type == "spot" and r.added_s >= 20.0]
    assert replacements and replacements[0].added_s <= 21.0  # replaced at the next tick
    assert not [r for r in result.requests if r.status != "ok"]
    assert sum(r.capacity_type == "on_demand" and r.removed_s is None for r in result.replicas) == 2


def test_the_planner_keeps_a_floor_on_demand_adds_a_margin_on_spot_and_falls_back_when_refused():
    planner = SpotPlanner(
        SpotConfig(reclaims_per_replica_day=24.0, replace_s=3600.0, floor_window_s=100.0, unavailable_backoff_s=50)
    )
    first = planner.targets(10, now=0.0)
    # Half of 10 on the floor; 5 burst, 5 at risk (rate · 1 h), and a safeguard of a fifth of the count (2).
    assert (first.on_demand, first.spot) == (5, 5 + 5 + 2)
    assert first.extra == 7 and "+2 safeguard" in first.reason
    fixed = SpotPlanner(SpotConfig(reclaims_per_replica_day=24.0, replace_s=3600.0, headroom_fraction=0))
    assert fixed.targets(10, now=0.0).spot == 5 + 5 + 1  # without headroom: SpotHedge's fixed safeguard of one
    assert SpotPlanner(SpotConfig(headroom_fraction=0.5)).targets(40, now=0.0).extra == 1 + 20  # at risk, 40 / 2
    assert planner.targets(20, now=10.0).on_demand == 5  # the trailing minimum is still 10
    assert planner.targets(20, now=111.0).on_demand == 10  # 10 left the window
    assert planner.targets(4, now=120.0).on_demand == 2
    planner.spot_refused(now=130.0)
    fallback = planner.targets(12, now=131.0)
    assert (fallback.on_demand, fallback.spot) == (12, 0) and "unavailable" in fallback.reason
    assert planner.targets(12, now=181.0).spot > 0  # the back-off is over: spot again
    assert SpotPlanner().targets(1, now=0.0) == SpotPlanner().targets(1, now=0.0)  # deterministic
    assert SpotPlanner().targets(1, now=0.0).spot == 0  # at the floor: nothing on spot
    for bad in (
        {"floor_fraction": 0},
        {"safeguard": -1},
        {"headroom_fraction": 1.5},
        {"floor_window_s": 0},
        {"reclaims_per_replica_day": -1},
    ):
        with pytest.raises(ValueError):
            SpotConfig(**bad)
