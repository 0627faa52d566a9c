"""Blackbox health checks: pure decisions, then real simulated replica processes (hung, saturated, healthy)."""

import asyncio
import threading
import time
from statistics import median

import httpx
import pytest

from endpoints.health import (
    LAST_OK_KEY,
    HealthConfig,
    _redis,
    after_probe,
    health_check_cycle,
    health_timings,
    last_sign_of_life,
    needs_probe,
    record_completion,
)
from endpoints.models import ReplicaState, Runtime
from tests.factories import EndpointFactory
from tests.waiting import wait_for

# The test configuration: quiet for 1 s → probe; 2 failed probes → failed; 1.5 s first-token budget.
FAST = HealthConfig(idle_after_s=1.0, failures_to_fail=2, ttft_timeout_s=1.5, connect_timeout_s=1.0)


def test_probe_decisions_are_pure():
    assert last_sign_of_life(last_ok_completion_at=None, progress_at=None, last_ok_probe_at=None) is None
    assert last_sign_of_life(last_ok_completion_at=5.0, progress_at=9.0, last_ok_probe_at=7.0) == 9.0
    assert needs_probe(now=10.0, last_alive_at=None, config=FAST)
    assert not needs_probe(now=10.0, last_alive_at=9.5, config=FAST)
    assert needs_probe(now=10.0, last_alive_at=9.0, config=FAST)
    assert after_probe(failures=0, ok=False, config=FAST) == (1, False)
    assert after_probe(failures=1, ok=False, config=FAST) == (2, True)
    assert after_probe(failures=1, ok=True, config=FAST) == (0, False)
    with pytest.raises(ValueError):
        HealthConfig(failures_to_fail=0)


@pytest.fixture
def clean_health_keys():
    client = _redis()
    for pattern in ("infercap:health:*", "infercap:replica_last_ok:*"):
        for key in client.scan_iter(pattern):
            client.delete(key)
    yield client


@pytest.fixture
def sim_endpoint(db, clean_health_keys):
    """An endpoint whose replicas the local actuator runs as simulated vLLM processes; all stopped afterwards."""
    from capacity.autoscaling.actuators.local import LocalActuator

    endpoint = EndpointFactory(
        name="health-model",
        runtime=Runtime.SIM,
        launch_options={"actuator": "local", "profile": "tiny", "speed": 1.0},
    )
    actuator = LocalActuator()
    try:
        yield endpoint, actuator
    finally:
        actuator.terminate(list(endpoint.replicas.exclude(state=ReplicaState.STOPPED)), reason="test teardown")


def _launch_ready(endpoint, actuator, count: int, timeout_s: float = 30.0):
    replicas = actuator.launch(endpoint, count)

    def ready():
        actuator.sync(endpoint)
        return all(r.state == ReplicaState.READY for r in _fresh(replicas))

    wait_for(ready, timeout_s, 0.1, message=f"{count} replicas ready")
    return replicas


def _fresh(replicas):
    for r in replicas:
        r.refresh_from_db()
    return replicas


@pytest.mark.e2e
@pytest.mark.slow
def test_hung_replica_is_detected_failed_and_replaced(sim_endpoint):
    from gateway.proxy.snapshot_loader import read_snapshot

    endpoint, actuator = sim_endpoint
    hung, healthy = _launch_ready(endpoint, actuator, 2)
    report = health_check_cycle(config=FAST)
    assert set(report.probed_ids) == {hung.pk, healthy.pk}  # never seen alive: both probed
    assert all(c.result.ok and c.result.ttft_s < 1.0 for c in report.checks)

    httpx.post(f"{hung.url}/admin/faults", json={"hang": True}, timeout=2).raise_for_status()
    hung_at = time.time()
    assert httpx.get(f"{hung.url}/health", timeout=2).status_code == 200  # a wedged engine still says healthy

    def cycle_that_fails_it():
        report = health_check_cycle(config=FAST)
        return report if hung.pk in report.failed_ids else None

    # One cycle every 0.5 s: the beat interval of this test.
    report = wait_for(cycle_that_fails_it, 20, 0.5, message="the hung replica detected")
    detected_after_s = time.time() - hung_at
    assert detected_after_s <= 15.0
    hung.refresh_from_db()
    healthy.refresh_from_db()
    # failed, then stopped at once by the actuator's restart (which also launched a replacement)
    assert hung.state == ReplicaState.STOPPED and hung.failure_reason.startswith("health: 2 consecutive failed probes")
    assert list(hung.transitions.values_list("to_state", flat=True))[-2:] == [
        ReplicaState.FAILED,
        ReplicaState.STOPPED,
    ]
    assert healthy.state == ReplicaState.READY and healthy.consecutive_probe_failures == 0
    check = next(c for c in report.checks if c.replica_id == hung.pk)
    assert check.restart.startswith("requested via LocalActuator.restart")

    # The proxy's snapshot (what it routes to) no longer lists the hung replica.
    routed_urls = {r.url for r in read_snapshot().endpoints_by_name[endpoint.name].replicas}
    assert hung.url not in routed_urls and healthy.url in routed_urls

    # The restart launched a replacement; once it is ready, health_timings reports detection and recovery.
    replacement = endpoint.replicas.exclude(pk__in=[hung.pk, healthy.pk]).get()

    def replacement_ready():
        actuator.sync(endpoint)
        replacement.refresh_from_db()
        return replacement.state == ReplicaState.READY

    wait_for(replacement_ready, 30, 0.1, message="the replacement ready")
    (timing,) = health_timings(endpoint=endpoint)
    assert timing["replica_id"] == hung.pk
    assert 0 < timing["detected_after_s"] <= 15.0
    assert timing["recovered_after_s"] is not None and timing["recovered_after_s"] < 30


def _gauge(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=2).text.splitlines():
        if line.startswith(name):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} missing")


class _Overload:
    """Keeps ``clients`` streaming completions against one replica until stopped (a 3× overload of 8 slots)."""

    def __init__(self, url: str, clients: int):
        self.url, self.clients = url, clients
        self.completed = 0
        self.errors = 0
        self.ttfts: list[float] = []  # each finished stream's first line, from its start (it queued behind the rest)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _client(self, http: httpx.AsyncClient) -> None:
        body = {"prompt": "load " * 40, "max_tokens": 200, "stream": True, "ignore_eos": True}
        while not self._stop.is_set():
            try:
                started, first = time.monotonic(), None
                async with http.stream("POST", f"{self.url}/v1/completions", json=body, timeout=30) as response:
                    async for line in response.aiter_lines():
                        if first is None and line.startswith("data:"):
                            first = time.monotonic() - started
                        if self._stop.is_set():
                            break
                self.completed += 1
                if first is not None:
                    self.ttfts.append(first)
            except httpx.HTTPError:
                self.errors += 1

    async def _main(self) -> None:
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=self.clients + 4)) as http:
            await asyncio.gather(*(self._client(http) for _ in range(self.clients)))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=35)


@pytest.mark.e2e
@pytest.mark.slow
def test_saturated_replica_is_never_marked_failed(sim_endpoint):
    endpoint, actuator = sim_endpoint
    (busy,) = _launch_ready(endpoint, actuator, 1)
    # idle_after_s=0: probe on every cycle even though the replica is busy, the hardest case for false failures.
    always_probe = HealthConfig(idle_after_s=0.0, failures_to_fail=2, ttft_timeout_s=1.5, connect_timeout_s=1.0)
    ttfts = []
    with _Overload(busy.url, clients=24) as load:
        # The batch is full (24 streams on 8 slots) before the first probe.
        wait_for(lambda: _gauge(busy.url, "vllm:num_requests_waiting") >= 8, 30, message="8 requests waiting")
        waiting = []
        for _ in range(8):
            report = health_check_cycle(config=always_probe)
            (check,) = report.checks
            assert check.probed and check.result.ok, check.result
            ttfts.append(check.result.ttft_s)
            waiting.append(_gauge(busy.url, "vllm:num_requests_waiting"))
            time.sleep(0.3)  # on purpose: probe cycles spread over the overload, as the beat spreads them
    assert load.completed > 8 and load.errors == 0
    assert max(waiting) >= 8, f"the replica was not saturated: waiting {waiting}"
    busy.refresh_from_db()
    assert busy.state == ReplicaState.READY and busy.consecutive_probe_failures == 0
    # No probe failed: each first token came inside the budget although 16 requests waited.
    assert max(ttfts) < always_probe.ttft_timeout_s
    # And the probe jumps the queue (it may still wait for one running sequence to free a batch slot, as in vLLM:
    # nothing is preempted for it): its median first token comes in under half the median of the load's own
    # requests, which queue behind two batches. Judged against the load, not a fixed time: on a loaded CI machine
    # the replica's tokens come slower for both (a run saw probes at 0.7-0.8 s), and the ratio is what shows the jump.
    assert len(load.ttfts) >= 8
    assert median(ttfts) < 0.5 * median(load.ttfts), (ttfts, load.ttfts)


@pytest.mark.e2e
def test_busy_replica_is_not_probed_when_it_shows_progress(sim_endpoint):
    endpoint, actuator = sim_endpoint
    (busy,) = _launch_ready(endpoint, actuator, 1)
    with _Overload(busy.url, clients=12):
        first = health_check_cycle(config=FAST)
        assert first.probed_ids == [busy.pk]  # its token counter was never seen before: no evidence yet
        # On purpose: past idle_after_s (1 s), so the first cycle's probe no longer counts as a sign of life and
        # only the token counter's growth can spare the replica a probe.
        time.sleep(1.2)
        later = health_check_cycle(config=FAST)
        assert later.probed_ids == []  # the counter grew: alive without a probe


def test_a_recent_proxy_completion_skips_the_probe(sim_endpoint):
    endpoint, _actuator = sim_endpoint
    from tests.factories import ReplicaFactory

    replica = ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY, url="http://127.0.0.1:9", actuator="static")
    record_completion(replica_id=replica.pk)
    assert _redis().get(LAST_OK_KEY.format(replica_id=replica.pk)) is not None
    report = health_check_cycle(config=FAST)
    assert report.probed_ids == []
    # Without that evidence the (unreachable) replica is probed and its failures counted.
    _redis().delete(LAST_OK_KEY.format(replica_id=replica.pk))
    report = health_check_cycle(config=FAST)
    assert report.probed_ids == [replica.pk] and not report.checks[0].result.ok
    replica.refresh_from_db()
    assert replica.consecutive_probe_failures == 1 and replica.state == ReplicaState.READY


def test_beat_runs_the_probe_cycle(sim_endpoint):
    from workers.schedule import beat_schedule
    from workers.tasks.health import probe_cycle

    assert beat_schedule()["health-probe-cycle"]["task"] == "health.probe_cycle"
    endpoint, _actuator = sim_endpoint
    from tests.factories import ReplicaFactory

    ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY, url="http://127.0.0.1:9", actuator="static")
    # Eager in tests: the task runs the real cycle against the (unreachable) replica.
    assert probe_cycle.delay().get()["probed"] == 1


def test_overlapping_cycles_do_not_probe_twice(db, clean_health_keys):
    from endpoints.health import CYCLE_LOCK_KEY

    clean_health_keys.set(CYCLE_LOCK_KEY, "someone-else", ex=30)
    assert health_check_cycle(config=FAST).skipped == "another health cycle is running"
    assert clean_health_keys.get(CYCLE_LOCK_KEY) == b"someone-else"  # not ours to release
    clean_health_keys.delete(CYCLE_LOCK_KEY)
    assert health_check_cycle(config=FAST).skipped == ""


def test_a_timeout_while_releasing_the_cycle_lock_is_retried_not_left_to_block_later_cycles(clean_health_keys):
    import redis

    from endpoints.health import CYCLE_LOCK_KEY, _release_cycle_lock

    class SlowOnce:
        """The real client, whose first script call times out as a descheduled process's read does."""

        def __init__(self, client):
            self.client, self.calls = client, 0

        def eval(self, *args):
            self.calls += 1
            if self.calls == 1:
                raise redis.TimeoutError("Timeout reading from socket")
            return self.client.eval(*args)

    clean_health_keys.set(CYCLE_LOCK_KEY, "ours", ex=30)
    slow = SlowOnce(clean_health_keys)
    _release_cycle_lock(slow, "ours")
    assert slow.calls == 2 and clean_health_keys.get(CYCLE_LOCK_KEY) is None
    # still only our own: another cycle's lock stays
    clean_health_keys.set(CYCLE_LOCK_KEY, "someone-else", ex=30)
    _release_cycle_lock(clean_health_keys, "ours")
    assert clean_health_keys.get(CYCLE_LOCK_KEY) == b"someone-else"


def test_a_cycle_whose_lock_reply_timed_out_still_releases_the_lock(db, clean_health_keys, monkeypatch):
    import redis

    from endpoints import health
    from endpoints.health import CYCLE_LOCK_KEY

    real = health._redis()

    class ReplyLost:
        """SET lands on the server, but its reply times out; everything else is the real client."""

        def set(self, *args, **kwargs):
            real.set(*args, **kwargs)
            raise redis.TimeoutError("Timeout reading from socket")

        def __getattr__(self, name):
            return getattr(real, name)

    monkeypatch.setattr(health, "_redis", lambda: ReplyLost())
    assert health_check_cycle(config=FAST).skipped == ""
    assert clean_health_keys.get(CYCLE_LOCK_KEY) is None  # the next cycle is not skipped for up to lock_ttl
