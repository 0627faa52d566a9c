"""The local actuator with real simulated replica processes behind the real proxy: start, drain, stop, restart."""

import threading
import time

import httpx
import pytest

from capacity.autoscaling.actuators import get_actuator
from capacity.autoscaling.actuators.local import pid_alive
from capacity.autoscaling.services import _in_flight, reconcile
from capacity.autoscaling.ticks import horizontal_inputs
from capacity.models import AutoscalerDecision
from endpoints.models import Endpoint, ReplicaState
from tests.proxy.conftest import spawn_proxy
from tests.proxy.helpers import chat_body, sse_events, wait_for, wait_usage

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def configure(endpoint, **launch):
    Endpoint.objects.filter(pk=endpoint.pk).update(
        launch_options={"actuator": "local", "profile": "tiny", **launch},
        min_replicas=0,
        max_replicas=4,
    )
    endpoint.refresh_from_db()
    return endpoint


def scale(endpoint, desired):
    Endpoint.objects.filter(pk=endpoint.pk).update(desired_replicas=desired)
    endpoint.refresh_from_db()
    return reconcile(endpoint=endpoint)


def set_limit(endpoint, limit):
    """As the vertical tick does: the replicas' rows, then the endpoint's save, which bumps the proxies' snapshot."""
    endpoint.replicas.exclude(state=ReplicaState.STOPPED).update(concurrency_limit=limit)
    endpoint.concurrency_limit = limit
    endpoint.save(update_fields=["concurrency_limit", "updated_at"])


def ready(endpoint):
    return list(endpoint.replicas.filter(state=ReplicaState.READY, is_standby=False))


def converge(endpoint, predicate, timeout=30.0):
    def step():
        reconcile(endpoint=endpoint)
        return predicate()

    return wait_for(step, timeout, interval=0.2)


def test_start_drain_and_stop_without_losing_a_request(procs, clean_store, reap_local_replicas, tenant_a):
    # Slow decode steps (50 ms) so that a 300-token stream lasts about 15 s: long enough to be cut by a bad drain,
    # and to be seen in flight on both replicas at once through the proxies' reports on a loaded CI host (at 3 s
    # and then at 7.5 s streams, fresh-clone CI runs with the three test groups side by side missed that window).
    endpoint = configure(tenant_a.endpoint, profile_opts={"decode_t0_s": 0.05})
    # Four slots per replica while the first eight streams start, so they must split four and four whatever the
    # proxy's first view of the fleet. With the limit open, a proxy that saw one replica first (its metrics not yet
    # scraped, or its slot share not yet granted by the membership beat) put all eight on it, and the other stayed
    # empty for 30 s in about half the fresh-clone CI runs (stops 36-38).
    Endpoint.objects.filter(pk=endpoint.pk).update(concurrency_limit=4)
    # Given two replicas started by the actuator as real processes, ready once their /health answers
    actions = scale(endpoint, 2)
    assert any(a.startswith("launched 2") for a in actions)
    converge(endpoint, lambda: len(ready(endpoint)) == 2)
    replicas = ready(endpoint)
    assert all(pid_alive(int(r.actuator_ref)) for r in replicas)
    # Both replicas must take streams: on a loaded CI host a replica whose /metrics scrape misses the proxy's 2 s
    # staleness window counts as saturated, and every stream can go to the other (seen once on a fresh-clone
    # run); staleness has its own tests (tests/proxy/test_metrics_staleness.py).
    base = spawn_proxy(procs, metrics_stale_s=30)

    # And streams in flight on both replicas through the proxy
    results: list[tuple[int, list]] = []

    def stream(n):
        # Distinct prompts: identical ones would share a cached prefix and prefix affinity could keep them together,
        # while this test is about draining, not placement.
        with httpx.Client(timeout=60) as client:
            response = client.post(
                f"{base}/v1/chat/completions",
                json=chat_body(endpoint.name, max_tokens=300, content=f"stream {n}: tell me a long story"),
                headers={"Authorization": f"Bearer {tenant_a.raw_key}"},
            )
            results.append((response.status_code, sse_events(response.text)))

    threads = [threading.Thread(target=stream, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    # Each replica seen with streams at some poll: a loaded CI host lets one /metrics scrape of two time out (1 s),
    # and "both at the same poll" then failed for 30 s in fresh-clone CI (stops 36-38) while the streams ran.
    seen: set[int] = set()
    wait_for(lambda: seen.update(r.pk for r in replicas if (_in_flight(r) or 0) > 0) or len(seen) == 2, 30)

    # When the endpoint scales in to one replica (with room on the survivor for the late streams below, which would
    # otherwise queue behind its four for longer than the standard class's queue age)
    set_limit(endpoint, 16)
    actions = scale(endpoint, 1)
    victim = endpoint.replicas.get(state=ReplicaState.DRAINING)
    assert f"draining {victim.name}" in actions
    wait_for(lambda: (_in_flight(victim) or 0) > 0, 10)  # it still has streams to finish
    # ...and new requests keep arriving while it drains
    time.sleep(1.0)  # the proxies' snapshot follows within a poll interval
    late = [threading.Thread(target=stream, args=(n,)) for n in range(8, 14)]
    for t in late:
        t.start()
    converge(endpoint, lambda: endpoint.replicas.get(pk=victim.pk).state == ReplicaState.STOPPED, timeout=60)
    for t in threads + late:
        t.join(60)

    # Then every request finished with its full stream, and the drained replica's process is gone
    assert len(results) == 14
    for status, events in results:
        assert status == 200
        assert events[-1] == "[DONE]"
        assert events[-2]["choices"][0]["finish_reason"] in ("length", "stop")
    assert not pid_alive(int(victim.actuator_ref))
    states = list(victim.transitions.values_list("to_state", flat=True))
    assert states == ["starting", "ready", "draining", "stopped"]
    survivor = endpoint.replicas.get(state=ReplicaState.READY)
    assert pid_alive(int(survivor.actuator_ref))

    # Scaling to zero drains the last one too
    scale(endpoint, 0)
    converge(endpoint, lambda: not endpoint.replicas.exclude(state=ReplicaState.STOPPED).exists())
    assert not pid_alive(int(survivor.actuator_ref))


def test_warm_pool_standby_is_promoted_on_scale_up(clean_store, reap_local_replicas, tenant_a):
    endpoint = configure(tenant_a.endpoint)
    Endpoint.objects.filter(pk=endpoint.pk).update(warm_pool_size=1)
    endpoint.refresh_from_db()
    # A standby is started and becomes ready, but does not count as capacity
    scale(endpoint, 0)
    converge(endpoint, lambda: endpoint.replicas.filter(is_standby=True, state=ReplicaState.READY).exists())
    assert ready(endpoint) == []
    inputs = horizontal_inputs(endpoint, now=time.time())
    assert (inputs.ready, inputs.starting) == (0, 0)  # the horizontal policy does not count it either
    standby = endpoint.replicas.get(is_standby=True)
    # On scale-up it is promoted at once (no cold start) and the pool is refilled behind it
    actions = scale(endpoint, 1)
    assert f"promoted standby {standby.name}" in actions
    assert [r.pk for r in ready(endpoint)] == [standby.pk]
    assert horizontal_inputs(endpoint, now=time.time()).ready == 1
    assert any(a.startswith("warm pool: started") for a in actions)
    converge(endpoint, lambda: endpoint.replicas.filter(is_standby=True, state=ReplicaState.READY).count() == 1)


def test_restart_replaces_a_crashed_replica_and_sync_marks_dead_processes(clean_store, reap_local_replicas, tenant_a):
    endpoint = configure(tenant_a.endpoint)
    scale(endpoint, 1)
    converge(endpoint, lambda: len(ready(endpoint)) == 1)
    (first,) = ready(endpoint)
    # A process that dies is noticed by sync: failed, then stopped
    httpx.post(f"{first.url}/admin/crash", json={}, timeout=2)
    wait_for(lambda: not pid_alive(int(first.actuator_ref)), 10)
    get_actuator(endpoint).sync(endpoint)
    first.refresh_from_db()
    assert first.state == ReplicaState.STOPPED
    assert list(first.transitions.values_list("to_state", flat=True))[-2:] == ["failed", "stopped"]
    # restart() (what the health checker calls) replaces a replica with a fresh process
    scale(endpoint, 1)
    converge(endpoint, lambda: len(ready(endpoint)) == 1)
    (second,) = ready(endpoint)
    (third,) = get_actuator(endpoint).restart(second)
    second.refresh_from_db()
    assert second.state == ReplicaState.STOPPED and not pid_alive(int(second.actuator_ref))
    converge(endpoint, lambda: endpoint.replicas.get(pk=third.pk).state == ReplicaState.READY)
    # A row closed without its process (someone else's cleanup): the next sync stops the orphan
    third.refresh_from_db()
    get_actuator(endpoint).stop_row(third, "closed by hand")
    assert pid_alive(int(third.actuator_ref))
    get_actuator(endpoint).sync(endpoint)
    assert not pid_alive(int(third.actuator_ref))


def test_live_scale_up_from_proxy_demand(procs, clean_store, reap_local_replicas, tenant_a):
    """The whole loop: proxy demand reports → 1 s samples → 5 s-style ticks → local replicas → proxy routes to them."""
    from capacity.autoscaling.ticks import horizontal_tick, sample_demand

    endpoint = configure(tenant_a.endpoint, profile_opts={"decode_t0_s": 0.02})
    Endpoint.objects.filter(pk=endpoint.pk).update(concurrency_limit=4, max_replicas=3, min_replicas=1)
    endpoint.refresh_from_db()
    scale(endpoint, 1)
    converge(endpoint, lambda: len(ready(endpoint)) == 1)
    base = spawn_proxy(procs)
    results = []

    def stream():
        with httpx.Client(timeout=90) as client:
            response = client.post(
                f"{base}/v1/chat/completions",
                json=chat_body(endpoint.name, max_tokens=300),
                headers={"Authorization": f"Bearer {tenant_a.raw_key}"},
            )
            results.append((response.status_code, sse_events(response.text)))

    # 12 concurrent streams (about 7 s each) against 4 slots per replica: the proxy queues 8 and reports it to Redis
    # every second; three waves leave time for new replicas to start and take the queued ones
    threads = [threading.Thread(target=stream) for _ in range(12)]
    for t in threads:
        t.start()
    decisions = []

    def tick():
        sample_demand(endpoint_id=endpoint.pk)
        decision = horizontal_tick(endpoint_id=endpoint.pk, tick=f"h-live-{len(decisions)}")
        decisions.append(decision)
        return len(ready(endpoint)) == 3

    wait_for(tick, 40, interval=0.5)
    for t in threads:
        t.join(90)
    ups = [d for d in decisions if d and d.desired > d.current]
    assert ups and ups[0].inputs["up_need"] > 1  # demand came from the proxy's reports
    endpoint.refresh_from_db()
    assert endpoint.desired_replicas == 3
    assert len(results) == 12 and all(status == 200 and events[-1] == "[DONE]" for status, events in results)
    # and the queued requests were served by the replicas the autoscaler added
    records = wait_usage(12, timeout=20, endpoint=endpoint)
    assert len({r.replica_id for r in records}) >= 2


def test_scale_from_zero_through_the_proxy(procs, clean_store, reap_local_replicas, tenant_a):
    """No replica: the proxy holds the request and its activator wakes the autoscaler at once (eager Celery in
    tests, so the proxy process runs that tick and launches the replica); the regular ticks, played here by a
    thread instead of beat, see it healthy; the held request is answered."""
    from django.db import connections

    from capacity.autoscaling.ticks import horizontal_tick

    endpoint = configure(tenant_a.endpoint)
    Endpoint.objects.filter(pk=endpoint.pk).update(scale_to_zero=True, min_replicas=0, desired_replicas=0)
    base = spawn_proxy(procs)
    stop = threading.Event()

    def beat():
        i = 0
        while not stop.is_set():
            horizontal_tick(endpoint_id=endpoint.pk, tick=f"h-beat-{i}")
            i += 1
            stop.wait(0.5)
        connections.close_all()

    results = []

    def request():
        results.append(
            httpx.post(
                f"{base}/v1/chat/completions",
                json=chat_body(endpoint.name, max_tokens=16),
                headers={"Authorization": f"Bearer {tenant_a.raw_key}"},
                timeout=60,
            )
        )

    ticker, requester = threading.Thread(target=beat), threading.Thread(target=request)
    started = time.monotonic()
    try:
        requester.start()
        # The wake-up tick comes from the proxy, before any regular tick runs
        wake = wait_for(
            lambda: AutoscalerDecision.objects.filter(endpoint=endpoint, tick__startswith="wake-").first(), 15
        )
        assert (wake.current, wake.desired) == (0, 1)
        ticker.start()
        requester.join(60)
    finally:
        stop.set()
        if ticker.ident:
            ticker.join(10)
    (response,) = results
    assert response.status_code == 200, response.text
    assert sse_events(response.text)[-1] == "[DONE]"
    assert time.monotonic() - started < 30
    assert endpoint.replicas.filter(state=ReplicaState.READY).count() == 1
