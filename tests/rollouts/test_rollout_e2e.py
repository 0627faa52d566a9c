"""Rollouts with real simulated replica processes (started by the local actuator) behind the real proxy.

The test drives the same tick the beat task runs (``rollout_tick``) in a loop, while client threads keep a steady
stream of requests going through the proxy.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from capacity.autoscaling.actuators.local import pid_alive
from capacity.autoscaling.services import reconcile
from endpoints.models import Endpoint, Replica, ReplicaState, Rollout, RolloutState
from endpoints.rollouts import services, ticks
from endpoints.rollouts.selectors import version_stats
from tenants.models import CapacityReservation
from tests.proxy.conftest import ROOT, spawn_proxy, subprocess_database_url
from tests.proxy.helpers import chat_body, sse_events, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

LOCAL = {"actuator": "local", "profile": "tiny", "autoscale": False}


def start_endpoint(endpoint, replicas: int) -> Endpoint:
    Endpoint.objects.filter(pk=endpoint.pk).update(
        launch_options=LOCAL, min_replicas=0, max_replicas=4, desired_replicas=replicas
    )
    endpoint.refresh_from_db()
    # room for steady traffic: the tenant's reservation must not be what limits it
    CapacityReservation.objects.filter(endpoint=endpoint).update(mu_per_min=1e6, rpm_limit=None, tpm_limit=None)
    services.ensure_current_version(endpoint)
    reconcile(endpoint=endpoint)
    wait_for(lambda: reconcile(endpoint=endpoint) is not None and ready_count(endpoint) == replicas, 30, 0.2)
    return endpoint


def ready_count(endpoint, version_ids=None) -> int:
    qs = Replica.objects.filter(endpoint=endpoint, state=ReplicaState.READY, is_standby=False)
    if version_ids is not None:
        qs = qs.filter(version_id__in=version_ids)
    return qs.count()


def routable_ready(endpoint) -> int:
    """Ready replicas of the versions that take traffic (what the proxy may route to right now)."""
    rollout = Rollout.objects.filter(endpoint=endpoint).order_by("-id").first()
    if rollout is None or rollout.state in (RolloutState.SUCCEEDED,):
        endpoint.refresh_from_db()
        return ready_count(endpoint, [endpoint.current_version_id])
    weights = {v for v, w in rollout.traffic_weights().items() if w > 0}
    if rollout.state in (RolloutState.ROLLED_BACK, RolloutState.FAILED):
        weights = {rollout.from_version_id}
    return ready_count(endpoint, weights)


class SteadyTraffic:
    """``clients`` threads sending short streamed requests back to back through the proxy until stopped."""

    def __init__(self, base: str, model: str, key: str, clients: int = 4, max_tokens: int = 12, pause_s=0.05) -> None:
        self.base, self.model, self.key, self.max_tokens, self.pause_s = base, model, key, max_tokens, pause_s
        self.results: list[tuple[int, bool]] = []
        self.errors: list[str] = []  # the first few failed bodies, for the assertion message
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self.stop.is_set():
                try:
                    response = client.post(
                        f"{self.base}/v1/chat/completions",
                        json=chat_body(self.model, max_tokens=self.max_tokens),
                        headers={"Authorization": f"Bearer {self.key}"},
                    )
                    events = sse_events(response.text)
                    complete = (
                        bool(events)
                        and events[-1] == "[DONE]"
                        and not any(isinstance(e, dict) and "error" in e for e in events)
                    )
                    self.results.append((response.status_code, complete))
                    if not complete and len(self.errors) < 5:
                        self.errors.append(response.text[:300])
                except httpx.HTTPError:
                    self.results.append((0, False))
                self.stop.wait(self.pause_s)

    def __enter__(self) -> "SteadyTraffic":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)

    @property
    def failed(self) -> int:
        return sum(1 for status, complete in self.results if status != 200 or not complete)


def alive_count(endpoint) -> int:
    """Replicas of any version holding a process (starting, ready or draining): what the surge bound limits."""
    return Replica.objects.filter(
        endpoint=endpoint,
        state__in=[ReplicaState.PENDING, ReplicaState.STARTING, ReplicaState.READY, ReplicaState.DRAINING],
    ).count()


def drive(rollout, endpoint, *, until, timeout=60.0, on_tick=None, alive=None) -> list[int]:
    """Tick the rollout (as the beat task would) until ``until`` holds; returns routable capacity per tick (and
    appends the replicas alive after each tick to ``alive``: replicas only start and stop inside a tick)."""
    capacity = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ticks.rollout_tick(rollout_id=rollout.pk)
        capacity.append(routable_ready(endpoint))
        if alive is not None:
            alive.append(alive_count(endpoint))
        rollout.refresh_from_db()
        if on_tick is not None:
            on_tick(rollout)
        if until(rollout):
            return capacity
        time.sleep(0.3)
    raise AssertionError(f"rollout stuck in {rollout.state}: {list(rollout.events.values_list('message', flat=True))}")


def finished(rollout) -> bool:
    return rollout.state in (RolloutState.SUCCEEDED, RolloutState.ROLLED_BACK, RolloutState.FAILED)


def drive_under_traffic(base, endpoint, raw_key, rollout, *, timeout: float, settle_s: float):
    """Steady traffic through the proxy while ``rollout`` runs to its end (then ``settle_s`` more); returns the
    traffic, routable ready replicas per tick, alive replicas per tick and the traffic percent per tick."""
    traffic_seen, alive = [], [alive_count(endpoint)]
    with SteadyTraffic(base, endpoint.name, raw_key) as traffic:
        wait_for(lambda: len(traffic.results) >= 10, 20)
        capacity = drive(
            rollout,
            endpoint,
            until=finished,
            timeout=timeout,
            alive=alive,
            on_tick=lambda r: traffic_seen.append(r.traffic_percent),
        )
        time.sleep(settle_s)
    return traffic, capacity, alive, traffic_seen


def test_canary_rollout_under_steady_traffic_loses_no_request_and_no_capacity(
    procs, clean_store, reap_local_replicas, tenant_a
):
    endpoint = start_endpoint(tenant_a.endpoint, 2)
    v1 = endpoint.current_version
    old_ids = set(endpoint.replicas.filter(state=ReplicaState.READY).values_list("id", flat=True))
    base = spawn_proxy(procs)
    v2 = services.create_version(endpoint=endpoint, launch_options={**LOCAL, "speed": 2.0}, note="faster decode")
    rollout = services.start_rollout(
        endpoint=endpoint, to_version=v2, strategy="canary", canary_steps=[50, 100], step_duration_s=3, max_surge=1
    )
    assert rollout.baseline_ready == 2
    # after it ends, traffic keeps flowing on the new version alone for a second
    traffic, capacity, alive, traffic_seen = drive_under_traffic(
        base, endpoint, tenant_a.raw_key, rollout, timeout=90, settle_s=1.0
    )
    rollout.refresh_from_db()
    endpoint.refresh_from_db()
    assert rollout.state == RolloutState.SUCCEEDED, rollout.reason
    # Every request through the rollout was answered in full, and capacity never dipped below the start
    assert len(traffic.results) > 50
    assert traffic.failed == 0, f"{traffic.failed} of {len(traffic.results)} failed: {traffic.errors}"
    assert min(capacity) >= 2, capacity
    assert max(alive) == 3, alive  # max_surge 1: one extra replica at most
    # Traffic moved in the canary's steps, surge replicas started one at a time (max_surge=1)
    assert 50 in traffic_seen and traffic_seen[-1] == 100
    launches = [e.data for e in rollout.events.filter(kind="launched")]
    assert [len(d["replicas"]) for d in launches] == [1, 1]
    # The endpoint now serves v2 from new replicas; the old ones were drained and their processes are gone
    assert endpoint.current_version == v2 and endpoint.launch_options["speed"] == 2.0
    assert ready_count(endpoint, [v2.pk]) == 2
    old = Replica.objects.filter(pk__in=old_ids)
    assert all(r.state == ReplicaState.STOPPED for r in old)
    assert all(list(r.transitions.values_list("to_state", flat=True))[-2:] == ["draining", "stopped"] for r in old)
    assert not any(pid_alive(int(r.actuator_ref)) for r in old)
    # both versions served requests during the canary step (usage records join through Replica.version)
    stats = wait_for(
        lambda: (s := version_stats(endpoint=endpoint, since=rollout.created_at)) and len(s) == 2 and s, 10
    )
    assert stats[v1.pk].requests > 0 and stats[v2.pk].requests > 0
    kinds = list(rollout.events.values_list("kind", flat=True))
    assert kinds[0] == "created" and "shift" in kinds and "promote" in kinds and kinds[-1] == "succeeded"
    figures = {
        "requests": len(traffic.results),
        "failed": traffic.failed,
        "baseline_ready": rollout.baseline_ready,
        "min_routable_ready": min(capacity),
        "max_routable_ready": max(capacity),
        "peak_replicas": max(alive),
        "rollout_s": round((rollout.finished_at - rollout.started_at).total_seconds(), 1),
        "served_by_version": {f"v{v.number}": stats[v.pk].requests for v in (v1, v2)},
    }
    print(json.dumps(figures))


def test_rolling_replacement_of_three_replicas_one_at_a_time_under_steady_traffic(
    procs, clean_store, reap_local_replicas, tenant_a
):
    endpoint = start_endpoint(tenant_a.endpoint, 3)
    old_ids = set(endpoint.replicas.filter(state=ReplicaState.READY).values_list("id", flat=True))
    base = spawn_proxy(procs)
    v2 = services.create_version(endpoint=endpoint, launch_options={**LOCAL, "speed": 2.0})
    rollout = services.start_rollout(endpoint=endpoint, to_version=v2, max_surge=1)
    traffic, capacity, alive, traffic_seen = drive_under_traffic(
        base, endpoint, tenant_a.raw_key, rollout, timeout=120, settle_s=0.5
    )
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.SUCCEEDED, rollout.reason
    assert traffic.failed == 0, f"{traffic.failed} of {len(traffic.results)} failed: {traffic.errors}"
    assert len(traffic.results) > 50
    # never more than one extra replica, never fewer routable ready replicas than the three at the start
    assert max(alive) == 4, alive
    assert min(capacity) >= 3, capacity
    # one new replica at a time; traffic followed the warmed new replicas a third at a time
    launches = [len(e.data["replicas"]) for e in rollout.events.filter(kind="launched")]
    assert launches == [1, 1, 1]
    assert [p for p in dict.fromkeys(traffic_seen)] == [0, 33, 66, 100], traffic_seen
    # an old replica was drained after each batch, not all at the end
    drained_at = sorted(
        Replica.objects.get(pk=pk).transitions.filter(to_state="draining").values_list("at", flat=True)[0]
        for pk in old_ids
    )
    promoted_at = rollout.events.get(kind="promote").at
    assert sum(1 for at in drained_at if at < promoted_at) == 2
    assert ready_count(endpoint, [v2.pk]) == 3 and not endpoint.replicas.filter(pk__in=old_ids, state="ready").exists()
    print(
        json.dumps(
            {
                "test": "rolling 3 replicas, max_surge 1",
                "requests": len(traffic.results),
                "failed": traffic.failed,
                "baseline_ready": rollout.baseline_ready,
                "min_routable_ready": min(capacity),
                "peak_replicas": max(alive),
                "rollout_s": round((rollout.finished_at - rollout.started_at).total_seconds(), 1),
            }
        )
    )


def test_new_version_that_never_gets_healthy_is_rolled_back(procs, clean_store, reap_local_replicas, tenant_a):
    endpoint = start_endpoint(tenant_a.endpoint, 1)
    base = spawn_proxy(procs)
    # the new replicas never bind their port within the rollout's health timeout
    v2 = services.create_version(endpoint=endpoint, launch_options={**LOCAL, "faults": {"startup_delay_s": 600}})
    rollout = services.start_rollout(endpoint=endpoint, to_version=v2, health_timeout_s=3)
    with SteadyTraffic(base, endpoint.name, tenant_a.raw_key, clients=2) as traffic:
        capacity = drive(rollout, endpoint, until=finished, timeout=40)
    rollout.refresh_from_db()
    endpoint.refresh_from_db()
    assert rollout.state == RolloutState.ROLLED_BACK
    assert "0 of 1 new-version replica(s) healthy" in rollout.reason
    assert endpoint.current_version.number == 1 and "faults" not in endpoint.launch_options
    assert traffic.failed == 0 and len(traffic.results) > 5
    assert min(capacity) >= 1
    new = Replica.objects.filter(version=v2)
    assert new.exists() and all(r.state == ReplicaState.STOPPED for r in new)
    assert not any(pid_alive(int(r.actuator_ref)) for r in new)
    rollback = rollout.events.get(kind="rollback")
    assert rollback.from_state == RolloutState.SURGING and rollback.data["new"]["starting"] == 1


def faulty_canary(procs, endpoint, raw_key, faults: dict, canary_steps: list[int]):
    """A canary of a version launched with ``faults``, driven under steady traffic through a real proxy until it
    ends; returns the refreshed rollout, the traffic, and the new version."""
    base = spawn_proxy(procs)
    v2 = services.create_version(endpoint=endpoint, launch_options={**LOCAL, "faults": faults})
    rollout = services.start_rollout(
        endpoint=endpoint,
        to_version=v2,
        strategy="canary",
        canary_steps=canary_steps,
        step_duration_s=120,
        min_samples=8,
    )
    with SteadyTraffic(base, endpoint.name, raw_key, clients=3) as traffic:
        drive(rollout, endpoint, until=finished, timeout=60)
    rollout.refresh_from_db()
    return rollout, traffic, v2


def test_canary_with_injected_errors_is_rolled_back_on_the_burn_comparison(
    procs, clean_store, reap_local_replicas, tenant_a
):
    endpoint = start_endpoint(tenant_a.endpoint, 1)
    # every request on the new version breaks off mid-stream (after its first tokens reached the client)
    rollout, traffic, v2 = faulty_canary(procs, endpoint, tenant_a.raw_key, {"fail_after_tokens": 2}, [30, 100])
    endpoint.refresh_from_db()
    assert rollout.state == RolloutState.ROLLED_BACK
    assert rollout.reason.startswith("canary error rate 100.0% vs 0.0% on the old version")
    assert endpoint.current_version.number == 1
    rollback = rollout.events.get(kind="rollback")
    assert rollback.from_state == RolloutState.SHIFTING
    assert rollback.data["canary"]["requests"] >= 8 and rollback.data["baseline"]["errors"] == 0
    # only the canary's share failed: the old version kept answering
    ok = len(traffic.results) - traffic.failed
    assert traffic.failed > 0 and ok > traffic.failed
    assert not Replica.objects.filter(version=v2).exclude(state=ReplicaState.STOPPED).exists()


def test_canary_failing_before_the_first_byte_is_rolled_back_though_retries_hide_it_from_clients(
    procs, clean_store, reap_local_replicas, tenant_a
):
    endpoint = start_endpoint(tenant_a.endpoint, 1)
    # half the requests on the new version get a 500 before any byte (its warm-up passes on a later tick): the
    # proxy retries each on the old version, so the usage record names the old replica and the client sees a success
    rollout, traffic, _ = faulty_canary(procs, endpoint, tenant_a.raw_key, {"error_rate": 0.5}, [50, 100])
    assert rollout.state == RolloutState.ROLLED_BACK, rollout.reason
    assert rollout.reason.startswith("canary error rate"), rollout.reason
    assert "vs 0.0% on the old version" in rollout.reason
    rollback = rollout.events.get(kind="rollback")
    assert rollback.data["canary"]["requests"] >= 8 and rollback.data["canary"]["error_rate"] > 0.2
    assert traffic.failed == 0 and len(traffic.results) > 10  # every failed attempt was retried
    print(json.dumps({"test": "canary failing before the first byte", "requests": len(traffic.results),
                      "failed": traffic.failed, "canary": rollback.data["canary"]}))  # fmt: skip


def test_canary_that_misses_the_latency_slo_is_rolled_back_on_the_burn_comparison(
    procs, clean_store, reap_local_replicas, tenant_a
):
    endpoint = start_endpoint(tenant_a.endpoint, 1)
    # the tiny engine decodes a token in a few ms; 30 times slower misses a 40 ms TPOT target on every request
    Endpoint.objects.filter(pk=endpoint.pk).update(tpot_slo_ms=40)
    rollout, traffic, _ = faulty_canary(procs, endpoint, tenant_a.raw_key, {"slow_factor": 30}, [50, 100])
    assert rollout.state == RolloutState.ROLLED_BACK
    assert rollout.reason.startswith("canary latency SLO misses"), rollout.reason
    rollback = rollout.events.get(kind="rollback")
    assert rollback.data["canary"]["errors"] == 0 and rollback.data["canary"]["latency_burn"] > 0.5
    assert traffic.failed == 0  # slow, not broken: every request was still answered


TICKER = """
import time, django
django.setup()
from endpoints.rollouts import services, ticks
ticks.LOCK_TTL_S = 4  # the lock a killed worker leaves behind expires sooner than in production (30 s)
while True:
    r = ticks.rollout_tick(rollout_id={rollout_id})
    print(r.state if r else "locked", flush=True)
    time.sleep(0.3)
"""


def test_a_worker_killed_mid_rollout_leaves_a_rollout_the_next_worker_finishes(
    procs, clean_store, reap_local_replicas, tenant_a
):
    endpoint = start_endpoint(tenant_a.endpoint, 2)
    v2 = services.create_version(endpoint=endpoint, launch_options={**LOCAL, "speed": 2.0})
    rollout = services.start_rollout(endpoint=endpoint, to_version=v2, max_surge=1)
    # A separate worker process ticks the rollout until it has launched its first surge replica; then it is killed
    env = {**os.environ, "DATABASE_URL": subprocess_database_url(), "DJANGO_SETTINGS_MODULE": "config.settings.test"}
    worker = subprocess.Popen(
        [sys.executable, "-c", TICKER.format(rollout_id=rollout.pk)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_for(lambda: Replica.objects.filter(version=v2, state=ReplicaState.STARTING).exists(), 30, 0.05)
        os.killpg(worker.pid, signal.SIGKILL)
    finally:
        worker.wait(10)
        worker.stdout.close()
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.SURGING
    first = Replica.objects.get(version=v2)
    # The next worker (this process: nothing carried over in memory) picks up from the row and finishes
    capacity = drive(rollout, endpoint, until=finished, timeout=60)
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.SUCCEEDED
    assert min(capacity) >= 2
    new = Replica.objects.filter(version=v2)
    # the surge replica the dead worker started was adopted, not started twice: 2 new in total
    assert new.count() == 2 and first.pk in {r.pk for r in new}
    assert all(r.state == ReplicaState.READY for r in new)


def test_a_crash_between_recording_a_decision_and_acting_on_it_is_repaired_by_the_next_tick(
    clean_store, reap_local_replicas, tenant_a, monkeypatch
):
    endpoint = start_endpoint(tenant_a.endpoint, 1)
    v2 = services.create_version(endpoint=endpoint, launch_options={**LOCAL, "speed": 2.0})
    rollout = services.start_rollout(endpoint=endpoint, to_version=v2)
    real_drain = ticks._drain

    def crash(*args, **kwargs):
        raise SystemExit("worker killed")

    # The promote decision is recorded, then the worker dies before draining the old version
    monkeypatch.setattr(ticks, "_drain", crash)
    with pytest.raises(SystemExit):
        drive(rollout, endpoint, until=lambda r: r.state == RolloutState.PROMOTING, timeout=30)
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.PROMOTING
    assert endpoint.replicas.filter(version=endpoint.current_version_id).count() >= 1
    old = Replica.objects.get(endpoint=endpoint, version__number=1)
    assert old.state == ReplicaState.READY  # not drained yet
    # The next tick re-derives the same decision from the row and drains
    monkeypatch.setattr(ticks, "_drain", real_drain)
    drive(rollout, endpoint, until=finished, timeout=30)
    rollout.refresh_from_db()
    old.refresh_from_db()
    assert rollout.state == RolloutState.SUCCEEDED and old.state == ReplicaState.STOPPED
    assert rollout.events.filter(kind="promote").count() == 1  # the decision was not recorded twice
