"""The discrete-event runner: determinism, speed, and the router / admission / autoscaler interfaces."""

import zlib

import pytest

from gateway.routing.base import RouteRequest
from simulator import workloads
from simulator.des import FleetActions, FleetView, ProxyAdmission, Simulation, VirtualClock


class RecordingRouter:
    """Least in-flight, then fewest routed; records every hook call and the views it was shown."""

    name = "recording"

    def __init__(self, sticky: bool = False):
        self.sticky = sticky
        self.routed: list[tuple[str, str, float]] = []
        self.routed_count: dict[str, int] = {}
        self.finished: list[tuple[str, str, float]] = []
        self.max_in_flight_seen = 0
        self.max_metrics_age = 0.0

    def pick(self, request: RouteRequest, replicas, now):
        live = [r for r in replicas if r.healthy and not r.draining]
        for r in replicas:
            self.max_in_flight_seen = max(self.max_in_flight_seen, r.in_flight)
            self.max_metrics_age = max(self.max_metrics_age, r.metrics_age_s)
        if not live:
            return None
        if self.sticky and request.session_id:
            ordered = sorted(live, key=lambda r: r.replica_id)
            return ordered[zlib.crc32(request.session_id.encode()) % len(ordered)].replica_id
        counts = self.routed_count
        return min(live, key=lambda r: (r.in_flight, counts.get(r.replica_id, 0), r.replica_id)).replica_id

    def on_routed(self, request, replica_id, now):
        self.routed.append((request.request_id, replica_id, now))
        self.routed_count[replica_id] = self.routed_count.get(replica_id, 0) + 1

    def on_finished(self, request, replica_id, now):
        self.finished.append((request.request_id, replica_id, now))


def small_run(seed: int):
    sim = Simulation(router=RecordingRouter(), replicas=4, seed=seed)
    return sim.run(workloads.shared_prefix(groups=8, prompts_per_group=8, count=600, qps=30, seed=seed))


def test_same_seed_gives_identical_results_and_another_seed_differs():
    first, second, other = small_run(3), small_run(3), small_run(4)
    assert first.digest() == second.digest()
    assert first.summary() == second.summary()
    assert other.digest() != first.digest()


@pytest.mark.slow
def test_ten_thousand_shared_prefix_requests_over_eight_replicas_all_complete_with_prefix_hits():
    # Its speed is a figure of `bench sim` (des_requests_per_s, per wall and per CPU second), not a timed test:
    # a wall-clock bar here measured the machine's neighbours, not the simulator.
    sim = Simulation(router=RecordingRouter(), replicas=8, seed=1)
    result = sim.run(workloads.shared_prefix(count=10_000, qps=60, seed=1))
    assert len(result.completed()) == 10_000
    assert result.prefix_hit_rate() > 0.8


def test_per_request_records_are_consistent_and_router_hooks_pair_up():
    router = RecordingRouter()
    sim = Simulation(router=router, replicas=2, profile="tiny", seed=0)
    result = sim.run(
        workloads.uniform(
            times=workloads.poisson_times(50, count=200, seed=2),
            prompt_tokens=(20, 200),
            output_tokens=(5, 60),
            seed=2,
        )
    )
    assert len(result.requests) == 200 and len(result.completed()) == 200
    for r in result.requests:
        assert r.arrival_s <= r.dispatch_s <= r.scheduled_s <= r.first_token_s <= r.finish_s
        assert r.output_tokens == r.max_tokens
        assert r.ttft_s > 0 and r.e2e_s >= r.ttft_s and r.queue_s >= 0
    assert len(router.routed) == len(router.finished) == 200
    assert {rid for rid, _, _ in router.routed} == {rid for rid, _, _ in router.finished}
    busy = sum(rep.busy_s for rep in result.replicas)
    assert 0 < busy <= result.replica_seconds()
    assert result.gpu_hours() == pytest.approx(result.replica_seconds() / 3600)
    assert router.max_metrics_age <= sim.scrape_interval_s + 1e-9


def test_admission_queues_then_rejects_with_retry_after_and_respects_the_limit():
    router = RecordingRouter()
    sim = Simulation(
        router=router,
        replicas=1,
        profile="tiny",
        concurrency_limit=4,
        admission=ProxyAdmission(max_queue=10),
    )
    burst = workloads.uniform(times=[0.0] * 100, prompt_tokens=50, output_tokens=20)
    result = sim.run(burst)
    rejected = [r for r in result.requests if r.status == "rejected"]
    # 4 run, 10 wait, the rest find the queue full; each request costs 0.25 MU (50/1000 + 20/100), and with nothing
    # finished yet Retry-After is (10 queued + 4 in flight) x 0.25 MU at the replica's nominal 1 MU/s: 3.5 → 4 s
    assert len(rejected) == 86 and {(r.reason, r.retry_after_s) for r in rejected} == {("queue_full", 4)}
    assert len(result.completed()) == 14
    assert router.max_in_flight_seen <= 4


class ScriptedAutoscaler:
    """Adds two replicas at t=5 (10 s cold start), sets concurrency at t=8, drains the newest at t=30."""

    def __init__(self):
        self.added: list[str] = []
        self.views: list[FleetView] = []

    def tick(self, fleet: FleetView, actions: FleetActions, now: float) -> None:
        self.views.append(fleet)
        if now == 5.0:
            self.added = actions.add_replicas(2, cold_start_s=10.0)
        if now == 8.0:
            actions.set_concurrency(3)
        if now == 30.0:
            actions.drain(self.added[-1])


def test_autoscaler_hook_adds_replicas_after_a_cold_start_and_drains_them():
    scaler = ScriptedAutoscaler()
    clock = VirtualClock()
    router = RecordingRouter()
    sim = Simulation(router=router, replicas=1, profile="tiny", autoscaler=scaler, clock=clock)
    result = sim.run(
        workloads.uniform(times=workloads.constant_times(4, count=200), prompt_tokens=40, output_tokens=40)
    )
    assert clock.now() == result.end_s >= 49
    records = {rep.replica_id: rep for rep in result.replicas}
    for replica_id in scaler.added:
        assert records[replica_id].added_s == 5.0 and records[replica_id].ready_s == 15.0
        first_routed = min(t for _, rid, t in router.routed if rid == replica_id)
        assert first_routed >= 15.0
    drained = records[scaler.added[-1]]
    assert drained.removed_s is not None and drained.removed_s >= 30.0
    assert drained.replica_seconds(result.end_s) == pytest.approx(drained.removed_s - 5.0)
    at_6 = next(v for v in scaler.views if v.now == 6.0)
    assert at_6.count("starting") == 2 and at_6.count("ready") == 1
    later = next(v for v in scaler.views if v.now == 20.0)
    assert {r.concurrency_limit for r in later.replicas} == {3}
    assert all(r.status == "ok" for r in result.requests)
    assert any(sample["starting"] == 2 for sample in result.timeline)


def test_removing_a_replica_aborts_its_requests():
    class Remover:
        def tick(self, fleet, actions, now):
            if now == 2.0:
                actions.remove("r0")

    sim = Simulation(router=RecordingRouter(), replicas=1, profile="tiny", autoscaler=Remover())
    result = sim.run(workloads.uniform(times=[0.5, 0.6], prompt_tokens=40, output_tokens=900), until_s=30)
    assert [r.status for r in result.requests] == ["aborted", "aborted"]
    assert result.replicas[0].removed_s == 2.0


def test_multi_turn_sessions_follow_their_previous_turn_and_hit_the_prefix_cache():
    sim = Simulation(router=RecordingRouter(sticky=True), replicas=2, profile="llama-8b-h100")
    result = sim.run(workloads.multi_turn(sessions=10, turns=3, session_rate_per_s=2, think_time_s=2, seed=5))
    assert len(result.requests) == 30 and len(result.completed()) == 30
    by_id = {r.request_id: r for r in result.requests}
    for r in result.requests:
        session, turn = r.request_id.rsplit("-t", 1)
        if int(turn) > 0:
            previous = by_id[f"{session}-t{int(turn) - 1}"]
            assert r.arrival_s >= previous.finish_s
            assert r.prompt_tokens > previous.prompt_tokens
            assert r.cached_tokens >= previous.prompt_tokens - 16


def test_requests_too_long_for_the_model_fail_cleanly():
    sim = Simulation(router=RecordingRouter(), replicas=1, profile="tiny")
    result = sim.run(workloads.uniform(times=[0.0, 0.1], prompt_tokens=2000, output_tokens=10))
    assert {r.status for r in result.requests} == {"error"}
    assert "maximum" in result.requests[0].reason


def test_bursty_trace_has_spikes_of_ten_times_and_quiet_nights():
    times, rate = workloads.bursty_times(duration_s=3600, peak_qps=5, spikes=2, spike_s=30, seed=1)
    arrivals = list(times)
    assert rate(0.0) < 0.05 * 5  # night
    assert rate(1800.0) == pytest.approx(5, rel=0.05)  # midday peak, no spike there for this seed or not
    spike_rates = [rate(t) / workloads.diurnal_rate(t, peak_qps=5, day_s=3600) for t in range(0, 3600)]
    assert max(spike_rates) == pytest.approx(10, rel=0.01)
    night = sum(1 for t in arrivals if t < 300)
    day = sum(1 for t in arrivals if 1650 <= t < 1950)
    assert day > 10 * max(night, 1)


def test_shared_prefix_workload_shape():
    reqs = list(
        workloads.shared_prefix(
            groups=4,
            prompts_per_group=3,
            system_tokens=2048,
            question_tokens=256,
            output_tokens=256,
            count=50,
            qps=10,
            seed=1,
        )
    )
    assert len(reqs) == 50
    assert all(r.prompt_tokens == 2048 + 256 and r.output_tokens == 256 for r in reqs)
    assert len({r.prompt_parts[0] for r in reqs}) == 4
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(reqs, reqs[1:], strict=False))
    # the block-aligned system prompt is hashed once and continued: same chain as hashing the whole text
    from simulator.tokens import block_hashes

    assert reqs[0].block_hashes() == block_hashes(reqs[0].prompt_text)


def test_a_router_that_never_picks_ends_the_run_with_unserved_requests():
    class Nowhere(RecordingRouter):
        def pick(self, request, replicas, now):
            return None

    sim = Simulation(router=Nowhere(), replicas=1, profile="tiny", stall_limit_s=30)
    result = sim.run(workloads.uniform(times=[0.0, 1.0], prompt_tokens=10, output_tokens=5))
    assert [r.status for r in result.requests] == ["unserved", "unserved"]
    assert 30 <= result.end_s <= 33


class RoundRobin(RecordingRouter):
    def __init__(self):
        super().__init__()
        self.turn = 0

    def pick(self, request, replicas, now):
        live = sorted((r for r in replicas if r.healthy and r.metrics_age_s < 2.0), key=lambda r: r.replica_id)
        if not live:
            return None
        self.turn += 1
        return live[self.turn % len(live)].replica_id


def test_a_crashed_replica_s_requests_go_on_elsewhere_as_the_proxy_sends_them_and_new_ones_are_retried():
    class Janitor:
        def __init__(self):
            self.seen_failed_at = None

        def tick(self, fleet, actions, now):
            failed = [r.replica_id for r in fleet.replicas if r.state == "failed"]
            if failed and self.seen_failed_at is None:
                self.seen_failed_at = now
            if now >= 10 and failed:
                actions.remove(failed[0])

    def run(**options):
        janitor = Janitor()
        sim = Simulation(
            router=RoundRobin(), replicas=2, profile="tiny", autoscaler=janitor, scrape_interval_s=0.05, **options
        )
        sim.inject_fault("r0", "crash", at_s=5.0)
        result = sim.run(
            workloads.uniform(times=workloads.constant_times(10, count=150), prompt_tokens=30, output_tokens=400)
        )
        return result, janitor

    result, janitor = run()
    # Streams cut by the crash are resumed on r1 (the proxy's resume.py), whole: all 400 tokens, one answer.
    resumed = [r for r in result.requests if r.extra.get("resumed_from") == "r0"]
    assert resumed and all(r.status == "ok" and r.replica_id == "r1" and r.output_tokens == 400 for r in resumed)
    assert all(r.first_token_s < 5.0 for r in resumed)  # the client's first token came from r0
    assert all(r.status == "ok" for r in result.requests)  # nothing lost, nothing refused
    # Requests sent to r0 after it died (its metrics still looked fine) are retried on r1.
    retried = [
        r for r in result.requests if r.arrival_s > 5.0 and r.status == "ok" and r.dispatch_s and r.arrival_s < 7
    ]
    assert retried and all(r.replica_id == "r1" for r in retried)
    record = {rep.replica_id: rep for rep in result.replicas}["r0"]
    assert record.failed_s == 5.0 and record.removed_s == 10.0
    assert janitor.seen_failed_at <= 6.0
    # Without resumption (resume_streams=0) the cut streams are lost, as before the proxy resumed them.
    lost, _ = run(resume_streams=0)
    crashed = [r for r in lost.requests if r.reason == "replica_crashed"]
    assert len(crashed) == len(resumed) and all(r.replica_id == "r0" and r.finish_s == 5.0 for r in crashed)


def test_a_hung_replica_stops_and_resumes_where_it_was():
    def run(hang: bool):
        sim = Simulation(router=RoundRobin(), replicas=1, profile="tiny")
        if hang:
            sim.inject_fault("r0", "hang", at_s=1.0)
            sim.inject_fault("r0", "recover", at_s=5.0)
        return sim.run(workloads.uniform(times=times, prompt_tokens=30, output_tokens=300))

    times = [0.5, 0.6]
    normal, hung = run(False), run(True)
    for before, after in zip(normal.requests, hung.requests, strict=True):
        assert after.status == "ok" and after.output_tokens == before.output_tokens
        assert after.finish_s == pytest.approx(before.finish_s + 4.0, abs=1e-6)
    times = [0.5, 2.0]  # the second arrives during the hang: accepted, no token until the engine resumes
    late = run(True).requests[1]
    assert late.status == "ok" and late.first_token_s > 5.0


def test_a_slow_replica_takes_proportionally_longer():
    def run(factor: float):
        sim = Simulation(router=RoundRobin(), replicas=1, profile="tiny")
        if factor != 1:
            sim.inject_fault("r0", "slow", at_s=0.0, factor=factor)
        return sim.run(workloads.uniform(times=[0.1], prompt_tokens=30, output_tokens=200))

    assert run(3.0).requests[0].e2e_s == pytest.approx(3 * run(1.0).requests[0].e2e_s, rel=0.01)
    with pytest.raises(ValueError):
        Simulation(router=RoundRobin(), replicas=1).inject_fault("r0", "melt")


def test_a_replica_hung_for_good_ends_the_run_instead_of_ticking_forever():
    sim = Simulation(router=RoundRobin(), replicas=1, profile="tiny", stall_limit_s=20)
    sim.inject_fault("r0", "hang", at_s=0.2)
    result = sim.run(workloads.uniform(times=[0.1, 0.15], prompt_tokens=30, output_tokens=500))
    assert [r.status for r in result.requests] == ["unserved", "unserved"]
    assert result.end_s <= 30


def test_results_split_by_tenant():
    sim = Simulation(router=RecordingRouter(), replicas=2, profile="tiny")
    result = sim.run(
        workloads.uniform(times=workloads.constant_times(20, count=40), prompt_tokens=20, output_tokens=10, tenants=2)
    )
    parts = result.by("tenant")
    assert set(parts) == {"tenant-0", "tenant-1"}
    assert [len(p.requests) for p in parts.values()] == [20, 20]
    assert parts["tenant-0"].slo_attainment() == 1.0 and parts["tenant-0"].gpu_hours() == result.gpu_hours()
