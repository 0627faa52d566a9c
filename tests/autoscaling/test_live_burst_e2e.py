"""The live loop under a burst, end to end: real proxy, real simulated replicas from the local actuator, the
decision ticks. The stored decisions carry the demand the proxy reported, priced in MU with the coefficients the
policy converts ``target_concurrency`` with; the burst scales up in bounded steps without a cascade while replicas
boot; after the load stops the endpoint shrinks one step at a time only after the 5-minute window (injected clock),
down to its floor."""

import json
import math
import threading
import time

import httpx
import pytest

from capacity.autoscaling import store
from capacity.autoscaling.ticks import horizontal_tick, mu_capacity_for
from capacity.unit_resolver import endpoint_coefficients
from capacity.units import REFERENCE_REQUEST, estimate_request_mu
from endpoints.models import Endpoint, ReplicaState
from tests.autoscaling.test_local_actuator_e2e import configure, converge, ready, scale
from tests.proxy.conftest import spawn_proxy
from tests.proxy.helpers import chat_body, sse_events, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

STREAMS = 16
LIMIT = 4


def test_burst_scales_up_bounded_and_back_down_one_step_after_the_window(
    procs, clean_store, reap_local_replicas, tenant_a
):
    endpoint = configure(tenant_a.endpoint, profile_opts={"decode_t0_s": 0.02})
    Endpoint.objects.filter(pk=endpoint.pk).update(concurrency_limit=LIMIT, max_replicas=4, min_replicas=1)
    endpoint.refresh_from_db()
    scale(endpoint, 1)
    converge(endpoint, lambda: len(ready(endpoint)) == 1)
    base = spawn_proxy(procs)
    # Each request is the reference request (2,000 characters ≈ 500 prompt tokens, 300 out): one in flight is
    # worth exactly a 1/LIMIT of a replica's MU capacity
    reference_mu = estimate_request_mu(
        endpoint_coefficients(endpoint), prompt_tokens=REFERENCE_REQUEST[0], max_tokens=REFERENCE_REQUEST[1]
    )
    assert mu_capacity_for(endpoint) == pytest.approx(LIMIT * reference_mu)
    results = []

    def stream():
        with httpx.Client(timeout=120) as client:
            response = client.post(
                f"{base}/v1/chat/completions",
                json=chat_body(endpoint.name, max_tokens=REFERENCE_REQUEST[1], content="x" * 2000),
                headers={"Authorization": f"Bearer {tenant_a.raw_key}"},
            )
            results.append((response.status_code, sse_events(response.text)))

    threads = [threading.Thread(target=stream) for _ in range(STREAMS)]
    for t in threads:
        t.start()
    decisions, reports = [], []
    key = store.DEMAND_KEY.format(endpoint_id=endpoint.pk)

    def tick():
        for raw in clean_store.hgetall(key).values():
            report = json.loads(raw)
            if report.get("in_flight"):
                reports.append(report)
        decision = horizontal_tick(endpoint_id=endpoint.pk, tick=f"h-burst-{len(decisions)}")
        if decision is not None:
            decisions.append(decision)
        return all(not t.is_alive() for t in threads)

    wait_for(tick, 120, interval=1.0)
    assert len(results) == STREAMS and all(status == 200 and ev[-1] == "[DONE]" for status, ev in results)

    # Units: the proxy priced each request in flight at the reference MU, with the policy's coefficients
    assert reports
    for report in reports:
        assert report["in_flight_mu_reserved"] == pytest.approx(report["in_flight"] * reference_mu, rel=1e-3)
        # ... and reports it at the expected cost (these requests run to their max_tokens: close to it)
        assert report["in_flight_mu"] == pytest.approx(
            report["in_flight_mu_reserved"] * report["cost_ratio"], rel=1e-3
        )
        assert 0.9 <= report["cost_ratio"] <= 1.1
    peak_reported = max(r["in_flight_mu"] + r.get("queued_mu", 0.0) for r in reports)
    ups = [d for d in decisions if d.desired > d.current]
    assert ups, [(d.current, d.desired, d.reason) for d in decisions]
    for d in decisions:
        # The stored demand is what the proxy reported (never more than its peak) and decides in MU
        assert d.inputs["signal"] == "mu"
        assert d.inputs["demand_mu_20s"] <= peak_reported * (1 + 1e-6)
        assert d.inputs["up_need_mu"] == pytest.approx(
            d.inputs["demand_mu_20s"] / (LIMIT * reference_mu * 0.7), abs=1e-3
        )
    first = ups[0]
    # 16 requests need ceil(16 / (4 · 0.7)) = 6 replicas, capped at 4 and bounded by the step (+max(1×, 4))
    assert first.current == 1 and first.desired <= 4
    # No cascade: a scale-up never asks for more than the demand needs, counting the replicas already starting
    for d in ups:
        assert d.desired <= max(math.ceil(d.inputs["up_need"]), d.current)
    assert max(d.desired for d in decisions) == 4
    # Demand for 5.71 replicas at the ceiling of 4 says so (it read "within tolerance")
    assert all(
        d.reason.startswith("hold: at max replicas") for d in decisions if d.current == 4 and d.inputs["up_need"] > 4.4
    )
    print(
        "burst decisions:",
        [
            (d.current, d.desired, d.inputs["ready"], d.inputs["starting"], d.inputs["demand_requests_20s"], d.reason)
            for d in decisions
        ],
    )

    # The load is over. Injected clock: 60 s later the 5-minute window still holds the burst; past the 5-minute window (and the
    # delay) it removes one replica per decision, 30 s apart, down to min_replicas = 1
    endpoint.refresh_from_db()
    assert endpoint.desired_replicas == 4 and len(ready(endpoint)) == 4
    end = time.time()
    held = horizontal_tick(endpoint_id=endpoint.pk, tick="h-after-60", now=end + 60)
    assert held.desired == held.current == 4 and held.inputs["down_need"] > 4  # the burst is in the 5-min window
    steps = []
    for i in range(8):
        d = horizontal_tick(endpoint_id=endpoint.pk, tick=f"h-down-{i}", now=end + 310 + 20 * i)
        steps.append((d.current, d.desired, d.reason))
    print("scale-down decisions:", steps)
    moves = [(c, w) for c, w, _ in steps if w != c]
    assert moves == [(4, 3), (3, 2), (2, 1)]
    # 20 s between ticks, 30 s cooldown: a hold between every two steps (each tick stamped with the injected
    # clock; with the rows' save times the three steps came on three ticks in a row)
    assert [c for c, _, _ in steps] == [4, 3, 3, 2, 2, 1, 1, 1]
    assert steps[1][2] == "hold: cooling down after a scale-down"
    assert steps[-1][:2] == (1, 1)  # the floor holds
    endpoint.refresh_from_db()
    assert endpoint.desired_replicas == 1
    converge(endpoint, lambda: not endpoint.replicas.filter(state=ReplicaState.DRAINING).exists())
    assert len(ready(endpoint)) == 1
