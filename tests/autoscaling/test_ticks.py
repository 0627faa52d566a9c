"""Decision ticks: inputs from the proxies' Redis demand, one stored decision per tick even with two workers,
the scale-down delay across ticks, the activator's scale from zero, and the vertical tick on replica /metrics."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core.exceptions import ValidationError
from django.db import connections

from capacity.autoscaling import activator, services, store, ticks
from capacity.autoscaling.activator import request_scale_from_zero
from capacity.autoscaling.actuators.base import Actuator
from capacity.models import AutoscalerDecision
from endpoints.models import Endpoint, Replica, ReplicaState
from tests.factories import ReplicaFactory
from tests.proxy.helpers import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


class RecordingActuator(Actuator):
    """Counts what the services ask for; starts nothing."""

    name = "recording"

    def __init__(self):
        self.launched, self.terminated, self.lock = [], [], threading.Lock()

    def launch(self, endpoint, count, *, standby=False):
        pool = getattr(endpoint, "launch_hardware_profile_id", None)  # a spot pool's launch
        with self.lock:
            self.launched.append((endpoint.pk, count, standby) if pool is None else (endpoint.pk, count, "spot"))
        return [
            ReplicaFactory(
                endpoint=endpoint,
                state=ReplicaState.STARTING,
                actuator=self.name,
                is_standby=standby,
                hardware_profile_id=pool,
            )
            for _ in range(count)
        ]

    def terminate(self, replicas, *, reason):
        with self.lock:
            self.terminated += [r.pk for r in replicas]
        for replica in replicas:
            self.stop_row(replica, reason)

    def sync(self, endpoint):
        pass


@pytest.fixture
def actuator(monkeypatch):
    recording = RecordingActuator()
    monkeypatch.setattr(services, "get_actuator", lambda endpoint: recording)
    return recording


@pytest.fixture
def endpoint(tenant_a):
    Endpoint.objects.filter(pk=tenant_a.endpoint.pk).update(concurrency_limit=10, max_replicas=8, min_replicas=1)
    ReplicaFactory(endpoint=tenant_a.endpoint, state=ReplicaState.READY, actuator="recording")
    tenant_a.endpoint.refresh_from_db()
    return tenant_a.endpoint


def report(client, endpoint, process, **demand):
    client.hset(store.DEMAND_KEY.format(endpoint_id=endpoint.pk), process, json.dumps(demand))


def test_demand_from_fresh_proxy_reports_scales_up_and_is_recorded(clean_store, actuator, endpoint):
    now = time.time()
    # MU of one reference request (500 in / 300 out) under the endpoint's coefficients: a replica holds 10 of them
    ref = ticks.mu_capacity_for(endpoint) / 10
    report(clean_store, endpoint, "proxy-1", t=now, in_flight=20, queued=10, in_flight_mu=20 * ref, queued_mu=10 * ref)
    report(clean_store, endpoint, "proxy-2", t=now - 1, in_flight=5, queued=0, in_flight_mu=5 * ref)
    report(clean_store, endpoint, "proxy-dead", t=now - 60, in_flight=500, queued=0, in_flight_mu=500 * ref)
    decision = ticks.horizontal_tick(endpoint_id=endpoint.pk, tick="h-1", now=now)
    # 35 reference requests' MU against 10 per replica at 0.7 → 5 replicas; from 1 a step may add 4
    assert (decision.current, decision.desired, decision.applied) == (1, 5, True)
    assert decision.reason.startswith("scale up")
    assert decision.inputs["up_need"] == pytest.approx(5.0) and decision.inputs["ready"] == 1
    assert decision.inputs["signal"] == "mu" and decision.inputs["up_need_requests"] == 5.0
    assert decision.inputs["actions"][0].startswith("launched 4")
    assert actuator.launched == [(endpoint.pk, 4, False)]
    endpoint.refresh_from_db()
    assert endpoint.desired_replicas == 5
    # The same tick again (a redelivered task) stores and does nothing
    assert ticks.horizontal_tick(endpoint_id=endpoint.pk, tick="h-1", now=now) is None
    assert AutoscalerDecision.objects.filter(endpoint=endpoint).count() == 1
    assert len(actuator.launched) == 1


def test_scale_up_weighs_requests_by_their_mu(clean_store, actuator, endpoint):
    # 35 requests in flight, but short ones: together they cost what 14 reference requests cost → ceil(14 / 7) = 2
    now = time.time()
    ref = ticks.mu_capacity_for(endpoint) / 10
    report(clean_store, endpoint, "proxy-1", t=now, in_flight=35, queued=0, in_flight_mu=14 * ref)
    decision = ticks.horizontal_tick(endpoint_id=endpoint.pk, tick="h-mu", now=now)
    assert (decision.current, decision.desired) == (1, 2)
    assert decision.inputs["signal"] == "mu" and decision.inputs["up_need_requests"] == 5.0


def test_one_decision_per_tick_with_two_workers(clean_store, actuator, endpoint, monkeypatch):
    report(clean_store, endpoint, "proxy-1", t=time.time(), in_flight=30, queued=0)

    def race(tick):
        barrier, out = threading.Barrier(2), []

        def worker():
            barrier.wait()
            try:
                out.append(ticks.horizontal_tick(endpoint_id=endpoint.pk, tick=tick))
            finally:
                connections.close_all()

        threads = [threading.Thread(target=worker) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        return out

    for i in range(5):
        results = race(f"h-race-{i}")
        assert sum(r is not None for r in results) == 1
    assert AutoscalerDecision.objects.filter(endpoint=endpoint).count() == 5
    assert len(actuator.launched) == 1  # only the first tick had anything to start; the others saw it pending

    # Without the Redis lock (say it expired mid-tick) the unique tick constraint still lets only one through.
    class NoLock(store.TickLock):
        def __enter__(self):
            self.held = True
            return self

    monkeypatch.setattr(store, "TickLock", NoLock)
    results = race("h-nolock")
    assert sum(r is not None for r in results) == 1
    assert AutoscalerDecision.objects.filter(endpoint=endpoint, tick="h-nolock").count() == 1


def test_a_held_lock_skips_the_tick(clean_store, actuator, endpoint):
    with store.TickLock(axis="horizontal", endpoint_id=endpoint.pk) as held:
        assert held.held
        assert ticks.horizontal_tick(endpoint_id=endpoint.pk, tick="h-9") is None
    assert not AutoscalerDecision.objects.exists()


def test_no_scale_down_within_five_minutes_of_a_scale_up_across_ticks(clean_store, actuator, endpoint):
    now = time.time()
    report(clean_store, endpoint, "p", t=now, in_flight=30, queued=0)
    up = ticks.horizontal_tick(endpoint_id=endpoint.pk, tick="h-a", now=now)
    assert up.desired > up.current
    # The new replicas come up; the demand is gone (and so is its window, to isolate the delay rule): the live
    # proxy reports an idle endpoint
    endpoint.replicas.filter(state=ReplicaState.STARTING).update(state=ReplicaState.READY)
    clean_store.delete(store.SAMPLES_KEY.format(endpoint_id=endpoint.pk))
    report(clean_store, endpoint, "p", t=now + 60, in_flight=0, queued=0)
    held = ticks.horizontal_tick(endpoint_id=endpoint.pk, tick="h-b", now=now + 60)
    assert held.desired == held.current and held.reason == "hold: scale-down delay after a scale-up"
    report(clean_store, endpoint, "p", t=now + 400, in_flight=0, queued=0)
    down = ticks.horizontal_tick(endpoint_id=endpoint.pk, tick="h-c", now=now + 400)
    assert down.desired == down.current - 1 and down.reason.startswith("scale down")
    assert len(actuator.terminated) == 0  # the victim drains first (ready → draining); it stops on a later tick
    assert endpoint.replicas.filter(state=ReplicaState.DRAINING).count() == 1


def test_activator_wakes_a_scaled_to_zero_endpoint(clean_store, actuator, tenant_a, monkeypatch):
    endpoint = tenant_a.endpoint
    Endpoint.objects.filter(pk=endpoint.pk).update(scale_to_zero=True, min_replicas=0, desired_replicas=0)
    # The proxy calls it on its event loop, so the wake (Redis, Celery, PostgreSQL) must run on another thread:
    # held at a gate here, the call still returns, and the wake runs once the gate opens.
    gate, woken_on = threading.Event(), []
    real_wake = activator._wake

    def gated_wake(endpoint_id):
        gate.wait(10)
        woken_on.append(threading.get_ident())
        real_wake(endpoint_id)

    monkeypatch.setattr(activator, "_wake", gated_wake)
    assert request_scale_from_zero(endpoint.pk) is True
    assert woken_on == []  # returned before the wake ran
    assert request_scale_from_zero(endpoint.pk) is False  # debounced
    gate.set()
    decision = wait_for(
        lambda: AutoscalerDecision.objects.filter(endpoint=endpoint, tick__startswith="wake-", applied=True).first()
    )
    assert (decision.current, decision.desired) == (0, 1)
    assert actuator.launched == [(endpoint.pk, 1, False)]


def histogram(name, counts, bounds):
    lines, total = [], 0
    for bound, count in zip(bounds, counts, strict=True):
        total += count
        lines.append(f'{name}_bucket{{model_name="m",engine="0",le="{bound}"}} {total}')
    lines.append(f'{name}_bucket{{model_name="m",engine="0",le="+Inf"}} {total}')
    lines.append(f'{name}_count{{model_name="m",engine="0"}} {total}')
    return lines


class MetricsServer:
    """A replica's /metrics over a real socket, with counts the test moves forward."""

    TTFT_BOUNDS = [0.1, 0.5, 1.0, 2.5, 5.0, 10.0]
    TPOT_BOUNDS = [0.01, 0.025, 0.05, 0.1, 0.25]

    def __init__(self):
        self.ttft = [0] * 6
        self.tpot = [0] * 5
        self.waiting, self.kv, self.running = 0, 0.3, 4
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = server.text().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def text(self):
        lines = [
            f'vllm:num_requests_running{{model_name="m",engine="0"}} {self.running}',
            f'vllm:num_requests_waiting{{model_name="m",engine="0"}} {self.waiting}',
            f'vllm:kv_cache_usage_perc{{model_name="m",engine="0"}} {self.kv}',
        ]
        lines += histogram("vllm:time_to_first_token_seconds", self.ttft, self.TTFT_BOUNDS)
        lines += histogram("vllm:inter_token_latency_seconds", self.tpot, self.TPOT_BOUNDS)
        return "\n".join(lines) + "\n"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def metrics_server():
    server = MetricsServer()
    yield server
    server.close()


def test_vertical_tick_cuts_the_limit_after_three_overloaded_cycles(clean_store, tenant_a, metrics_server):
    endpoint = tenant_a.endpoint
    Endpoint.objects.filter(pk=endpoint.pk).update(concurrency_limit=64, ttft_slo_ms=2000, tpot_slo_ms=100)
    replica = ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY, url=metrics_server.url, concurrency_limit=64)
    metrics_server.running = 48  # three quarters of the limit in use: a loaded replica, whose health is evidence
    # Long ago the replica was fast: those counts must not count in today's p95 (the tick diffs scrapes)
    metrics_server.ttft = [1000, 0, 0, 0, 0, 0]
    metrics_server.tpot = [0, 1000, 0, 0, 0]
    first = ticks.vertical_tick(endpoint_id=endpoint.pk, tick="v-1")
    assert first.desired == 64 and first.inputs["verdict"] == "healthy"
    # Now 40% of first tokens take 2.5–5 s: p95 TTFT 5 s against a 2 s SLO, and the KV cache is nearly full (TTFT
    # alone would wait longer: docs/algorithms.md#vertical)
    metrics_server.ttft = [1060, 0, 0, 0, 40, 0]
    metrics_server.kv = 0.95
    metrics_server.tpot = [0, 1100, 0, 0, 0]
    second = ticks.vertical_tick(endpoint_id=endpoint.pk, tick="v-2")
    # p95 interpolated in the (2.5, 5] s bucket as Prometheus does: 2.5 + 2.5 × (95 − 60) / 40
    assert second.inputs["ttft_p95_ms"] == pytest.approx(4687.5) and second.inputs["verdict"] == "overload"
    assert second.desired == 64 and second.inputs["overload_streak"] == 1  # one cycle is not stable yet
    metrics_server.ttft = [1120, 0, 0, 0, 80, 0]
    metrics_server.tpot = [0, 1200, 0, 0, 0]
    third = ticks.vertical_tick(endpoint_id=endpoint.pk, tick="v-3")
    assert third.desired == 64 and third.inputs["overload_streak"] == 2  # the streak survives between ticks
    metrics_server.ttft = [1180, 0, 0, 0, 120, 0]
    metrics_server.tpot = [0, 1300, 0, 0, 0]
    fourth = ticks.vertical_tick(endpoint_id=endpoint.pk, tick="v-4")
    assert fourth.desired == 45 and fourth.reason.startswith("decrease")
    endpoint.refresh_from_db()
    replica.refresh_from_db()
    assert endpoint.concurrency_limit == 45 and replica.concurrency_limit == 45
    assert ticks.vertical_tick(endpoint_id=endpoint.pk, tick="v-4") is None


def test_predictive_floor_from_yesterdays_usage_rollups(clean_store, actuator, endpoint):
    from datetime import UTC, datetime, timedelta

    from billing.models import UsageMinute

    now = time.time()
    at = datetime.fromtimestamp(now, tz=UTC).replace(second=0, microsecond=0)
    # Yesterday, starting one minute from now-of-day: 1,800 requests a minute (30 req/s); today so far: quiet.
    for minute in range(1, 4):
        UsageMinute.objects.create(
            endpoint=endpoint, tenant=endpoint.owner_tenant, start=at - timedelta(days=1) + timedelta(minutes=minute),
            requests=1800, ok=1800, ttft_sum_ms=1800 * 200.0, tpot_sum_ms=1800 * 20.0, output_tokens=1800 * 100,
        )  # fmt: skip
    UsageMinute.objects.create(
        endpoint=endpoint, tenant=endpoint.owner_tenant, start=at - timedelta(minutes=2), requests=60, ok=60,
        ttft_sum_ms=60 * 200.0, tpot_sum_ms=60 * 20.0, output_tokens=60 * 100,
    )  # fmt: skip
    floor, detail = ticks.predicted_floor_for(endpoint, now=now)
    # in flight: 0.2 s TTFT + 100 tokens × 20 ms = 2.2 s per request; 30 req/s → 66 in flight at 7 per replica
    assert detail["seconds_per_request"] == pytest.approx(2.2)
    assert detail["yesterday_rps"] == pytest.approx(30.0)
    assert floor == 10
    decision = ticks.horizontal_tick(endpoint_id=endpoint.pk, tick="h-predict", now=now)
    assert decision.desired == 8 and decision.reason == "below floor (predictive_floor)"  # capped by max_replicas 8


def test_drains_finish_when_idle_and_are_bounded_when_not(clean_store, actuator, endpoint, metrics_server):
    from datetime import timedelta

    from django.utils import timezone

    busy = ReplicaFactory(endpoint=endpoint, state=ReplicaState.DRAINING, actuator="recording", url=metrics_server.url)
    # running 4 (from the canned /metrics): a fresh drain waits
    assert services.finish_drains(endpoint=endpoint, actuator=actuator) == []
    # past the drain timeout it is stopped anyway
    endpoint.replicas.filter(pk=busy.pk).update(state_changed_at=timezone.now() - timedelta(seconds=200))
    assert services.finish_drains(endpoint=endpoint, actuator=actuator) == [f"stopped {busy.name} (drain timed out)"]
    # an idle draining replica stops once the proxies had time to stop routing to it
    metrics_server.running = 0
    idle = ReplicaFactory(endpoint=endpoint, state=ReplicaState.DRAINING, actuator="recording", url=metrics_server.url)
    assert services.finish_drains(endpoint=endpoint, actuator=actuator) == []  # within the grace period
    endpoint.replicas.filter(pk=idle.pk).update(state_changed_at=timezone.now() - timedelta(seconds=3))
    assert services.finish_drains(endpoint=endpoint, actuator=actuator) == [f"stopped {idle.name} (drained)"]
    assert actuator.terminated == [busy.pk, idle.pk]


def test_redis_down_skips_the_ticks_without_a_decision(clean_store, actuator, endpoint, monkeypatch):
    # Nothing listens on port 1: the lock, the demand window and the histogram snapshots are unreachable. The ticks
    # crashed the Celery task with ConnectionError; they now skip (no decision rather than one on zero demand)
    import redis

    unreachable = redis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.2, socket_timeout=0.2)
    monkeypatch.setattr(store, "client", lambda: unreachable)
    assert ticks.horizontal_tick(endpoint_id=endpoint.pk, tick="h-down") is None
    assert ticks.vertical_tick(endpoint_id=endpoint.pk, tick="v-down") is None
    assert not AutoscalerDecision.objects.exists() and actuator.launched == actuator.terminated == []


def test_silent_proxies_do_not_scale_a_busy_endpoint_to_zero(clean_store, actuator, endpoint):
    # 3 ready replicas under load; then the proxies stop reporting (cut off from Redis: the hash expires after 5 s)
    Endpoint.objects.filter(pk=endpoint.pk).update(scale_to_zero=True, min_replicas=0, desired_replicas=3)
    for _ in range(2):
        ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY, actuator="recording")
    now = time.time()
    report(clean_store, endpoint, "p", t=now, in_flight=20, queued=0)
    busy = ticks.horizontal_tick(endpoint_id=endpoint.pk, tick="h-s0", now=now)
    assert (busy.current, busy.desired) == (3, 3)
    clean_store.delete(store.DEMAND_KEY.format(endpoint_id=endpoint.pk))
    # Ten minutes later, one tick every 30 s: zero-demand samples used to walk it down to 0 replicas
    for i in range(1, 21):
        held = ticks.horizontal_tick(endpoint_id=endpoint.pk, tick=f"h-s{i}", now=now + 30 * i)
        assert held.desired == 3 and held.inputs["demand_reported"] is False
        if 30 * i > 300:  # the busy sample has left the 5-minute window: only the missing report holds it
            assert held.reason.startswith("hold: no fresh demand report")
    assert actuator.terminated == [] and not endpoint.replicas.filter(state=ReplicaState.DRAINING).exists()
    # A live proxy that has no report for this endpoint (it served none of its requests since it started) vouches
    # for zero demand: the scale-down resumes, one step
    redis_now = clean_store.time()
    member = {"j": redis_now[0], "t": redis_now[0] + redis_now[1] / 1e6, "f": {}}
    clean_store.hset(store.PROXY_MEMBERS_KEY, "proxy-1", json.dumps(member))
    down = ticks.horizontal_tick(endpoint_id=endpoint.pk, tick="h-s21", now=now + 30 * 21)
    assert (down.current, down.desired) == (3, 2) and down.inputs["demand_reported"] is True


def test_endpoint_with_unusable_coefficients_scales_on_requests(clean_store, actuator, endpoint):
    # A model profile whose coefficient reads infinite (a bad import): the reference request costs inf MU and the
    # replica's MU capacity was inf, so any demand read as none. The tick scales on requests and stores valid JSON
    endpoint.model_profile.__class__.objects.filter(pk=endpoint.model_profile_id).update(beta=float("inf"))
    endpoint.refresh_from_db()
    assert ticks.mu_capacity_for(endpoint) is None
    now = time.time()
    report(clean_store, endpoint, "p", t=now, in_flight=30, queued=0, in_flight_mu=5.0)
    decision = ticks.horizontal_tick(endpoint_id=endpoint.pk, tick="h-inf", now=now)
    decision.refresh_from_db()
    assert (decision.current, decision.desired) == (1, 5) and decision.inputs["signal"] == "requests"
    assert decision.inputs["mu_capacity_per_replica"] is None
    json.dumps(decision.inputs, allow_nan=False)


def test_zero_concurrency_limit_in_the_database_does_not_crash_the_tick(clean_store, actuator, endpoint):
    # The model's validator keeps the limit ≥ 1, but a SQL update or a migration can leave 0: decide() raised
    Endpoint.objects.filter(pk=endpoint.pk).update(concurrency_limit=0)
    now = time.time()
    report(clean_store, endpoint, "p", t=now, in_flight=3, queued=0)
    decision = ticks.horizontal_tick(endpoint_id=endpoint.pk, tick="h-zero", now=now)
    assert decision is not None and decision.inputs["target_concurrency"] == 1.0 and decision.desired == 5


def test_nan_replica_metrics_neither_crash_the_vertical_tick_nor_the_drain(
    clean_store, actuator, endpoint, metrics_server
):
    # A replica whose exporter prints NaN gauges: the vertical decision's JSON held NaN (PostgreSQL refuses it, the
    # tick crashed) and the drain order's int(NaN) crashed the reconcile of a scale-in
    metrics_server.running, metrics_server.waiting, metrics_server.kv = "NaN", "NaN", "NaN"
    metrics_server.ttft = [10, 0, 0, 0, 0, 0]
    metrics_server.tpot = [10, 0, 0, 0, 0]
    endpoint.replicas.update(url=metrics_server.url)
    decision = ticks.vertical_tick(endpoint_id=endpoint.pk, tick="v-nan")
    decision.refresh_from_db()
    assert decision.inputs["kv_usage"] == 0.0 and decision.inputs["busy_fraction"] == 0.0
    json.dumps(decision.inputs, allow_nan=False)
    ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY, actuator="recording", url=metrics_server.url)
    Endpoint.objects.filter(pk=endpoint.pk).update(desired_replicas=1)
    endpoint.refresh_from_db()
    actions = services.reconcile(endpoint=endpoint)
    assert any(a.startswith("draining") for a in actions)


def test_demand_window_keeps_five_minutes_of_sampler_and_tick_samples(clean_store, endpoint):
    # The sampler pushes one sample per second and every 5 s tick one more: a peak 296 s ago is still in the
    # scale-down window (330 samples kept covered 275 s)
    t0 = time.time()
    report(clean_store, endpoint, "p", t=t0, in_flight=50)
    for s in range(296):
        if s:
            report(clean_store, endpoint, "p", t=t0 + s, in_flight=1)
        ticks.sample_demand(endpoint_id=endpoint.pk, now=t0 + s)
        if s % 5 == 0:
            ticks.sample_demand(endpoint_id=endpoint.pk, now=t0 + s)  # the tick's own sample
    window = ticks.sample_demand(endpoint_id=endpoint.pk, now=t0 + 296)
    assert max(s.requests for s in window) == 50 and min(s.t for s in window) == pytest.approx(t0)


def test_an_interruption_notice_wakes_the_autoscaler_which_replaces_the_replica_and_drains_it_before_it_is_taken(
    clean_store, actuator, endpoint, metrics_server, monkeypatch
):
    from datetime import timedelta

    from django.utils import timezone

    from tenants.models import AuditEntry

    woken = []
    monkeypatch.setattr(services, "_wake_autoscaler", lambda endpoint_id, tick: woken.append((endpoint_id, tick)))
    spot = endpoint.replicas.get()
    spot.url = metrics_server.url  # four requests running: still busy when the cloud takes it
    spot.save(update_fields=["url"])
    services.replica_interruption_notice(replica=spot, notice_s=120)
    spot.refresh_from_db()
    assert spot.state == ReplicaState.READY  # it serves on until 30 s before it is taken
    assert timedelta(seconds=118) < spot.terminate_at - timezone.now() <= timedelta(seconds=120)
    assert woken and woken[0][0] == endpoint.pk and woken[0][1].startswith(f"notice-{spot.pk}-")
    assert (
        AuditEntry.objects.get(action="replica.interruption_notice", object_id=str(spot.pk)).detail["notice_s"] == 120
    )
    # A later notice never gives it more time; an earlier one takes it sooner.
    first = spot.terminate_at
    services.replica_interruption_notice(replica=spot, notice_s=600)
    spot.refresh_from_db()
    assert spot.terminate_at == first
    services.replica_interruption_notice(replica=spot, notice_s=60)
    spot.refresh_from_db()
    assert spot.terminate_at < first and spot.state == ReplicaState.READY
    # The woken tick: the noticed replica no longer counts, so its replacement is launched at once.
    decision = ticks.horizontal_tick(endpoint_id=endpoint.pk, tick=woken[0][1])
    assert decision.inputs["ready"] == 0 and actuator.launched == [(endpoint.pk, 1, False)]
    # Within 30 s of being taken it stops taking new requests (the reconcile loop's drain_noticed)...
    assert services.drain_noticed(endpoint=endpoint, actuator=actuator) == []
    Endpoint.objects.get(pk=endpoint.pk).replicas.filter(pk=spot.pk).update(
        terminate_at=timezone.now() + timedelta(seconds=25)
    )
    assert services.drain_noticed(endpoint=endpoint, actuator=actuator) == [
        f"draining {spot.name} (taken at {Replica.objects.get(pk=spot.pk).terminate_at:%H:%M:%S})"
    ]
    spot.refresh_from_db()
    assert spot.state == ReplicaState.DRAINING and spot.transitions.last().reason.startswith("interruption notice")
    # Busy, within its notice: the drain waits for its streams; at terminate_at it is stopped whatever it runs.
    assert services.finish_drains(endpoint=endpoint, actuator=actuator) == []
    Endpoint.objects.get(pk=endpoint.pk).replicas.filter(pk=spot.pk).update(terminate_at=timezone.now())
    assert services.finish_drains(endpoint=endpoint, actuator=actuator) == [f"stopped {spot.name} (reclaimed)"]
    spot.refresh_from_db()
    assert spot.state == ReplicaState.STOPPED
    with pytest.raises(ValidationError) as stopped:
        services.replica_interruption_notice(replica=spot, notice_s=30)
    assert "replica" in stopped.value.message_dict
    # A replica still booting never served: stopped at once.
    booting = ReplicaFactory(endpoint=endpoint, state=ReplicaState.STARTING, actuator="recording")
    services.replica_interruption_notice(replica=booting, notice_s=30)
    booting.refresh_from_db()
    assert booting.state == ReplicaState.STOPPED and booting.pk in actuator.terminated


def test_with_a_spot_pool_the_count_is_split_the_margin_is_not_counted_and_a_refusal_falls_back(
    clean_store, actuator, endpoint, monkeypatch
):
    from capacity.models import HardwareProfile
    from endpoints.validation import spot_pool_errors
    from tests.factories import HardwareProfileFactory

    pool = HardwareProfileFactory(
        name="a100-spot", capacity_type=HardwareProfile.CapacityType.SPOT, usd_per_gpu_hour=0.9,
        preemptions_per_replica_day=1.0,
    )  # fmt: skip
    Endpoint.objects.filter(pk=endpoint.pk).update(spot_hardware_profile=pool)
    endpoint.refresh_from_db()
    assert spot_pool_errors(endpoint) == {}
    now = time.time()
    ref = ticks.mu_capacity_for(endpoint) / 10
    report(clean_store, endpoint, "proxy-1", t=now, in_flight=35, queued=0, in_flight_mu=35 * ref)
    decision = ticks.horizontal_tick(endpoint_id=endpoint.pk, tick="h-spot-1", now=now)
    # The policy wants 5: half of the least count (5: no history) stays on on-demand (3), the burst of 2 on spot
    # plus one replica at risk of a reclaim before a replacement serves and SpotHedge's safeguard of one.
    assert decision.desired == 5
    split = decision.inputs["spot"]
    assert (split["on_demand"], split["spot"], split["floor"], split["extra"]) == (3, 4, 3, 2)
    endpoint.refresh_from_db()
    assert (endpoint.desired_replicas, endpoint.desired_spot_replicas) == (7, 4)
    assert actuator.launched == [(endpoint.pk, 2, False), (endpoint.pk, 4, "spot")]
    assert endpoint.replicas.filter(hardware_profile=pool).count() == 4
    # The next tick, same demand: the margin is not capacity, so the policy holds at 5 and nothing more starts.
    report(clean_store, endpoint, "proxy-1", t=now + 5, in_flight=35, queued=0, in_flight_mu=35 * ref)
    again = ticks.horizontal_tick(endpoint_id=endpoint.pk, tick="h-spot-2", now=now + 5)
    assert again.desired == 5 and again.inputs["ready"] + again.inputs["starting"] == 5
    assert len(actuator.launched) == 2
    # The market refuses a spot launch: on-demand only for the back-off.
    endpoint.replicas.filter(hardware_profile=pool).update(state=ReplicaState.STOPPED)
    refuse = actuator.launch
    monkeypatch.setattr(
        actuator,
        "launch",
        lambda ep, count, *, standby=False: (
            (_ for _ in ()).throw(services.ActuatorError("no spot capacity"))
            if getattr(ep, "launch_hardware_profile_id", None)
            else refuse(ep, count, standby=standby)
        ),
    )
    report(clean_store, endpoint, "proxy-1", t=now + 10, in_flight=35, queued=0, in_flight_mu=35 * ref)
    refused = ticks.horizontal_tick(endpoint_id=endpoint.pk, tick="h-spot-3", now=now + 10)
    assert any(a.startswith("spot: launch failed") for a in refused.inputs["actions"])
    assert store.spot_unavailable(endpoint.pk)
    report(clean_store, endpoint, "proxy-1", t=now + 15, in_flight=35, queued=0, in_flight_mu=35 * ref)
    fallback = ticks.horizontal_tick(endpoint_id=endpoint.pk, tick="h-spot-4", now=now + 15)
    assert fallback.inputs["spot"]["spot"] == 0 and fallback.inputs["spot"]["reason"].startswith("spot unavailable")
    endpoint.refresh_from_db()
    assert endpoint.desired_spot_replicas == 0 and endpoint.desired_replicas == fallback.desired
