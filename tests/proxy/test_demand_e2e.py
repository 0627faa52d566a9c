"""What the proxy publishes for others: per-process demand in Redis (autoscaler, console), Prometheus metrics,
and scale-from-zero: a request to an endpoint with no replica waits in the queue and wakes the autoscaler."""

import json
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tenants.models import CapacityReservation
from tests.factories import EndpointFactory
from tests.proxy.conftest import spawn_proxy, spawn_replica
from tests.proxy.helpers import METRICS_AUTH, chat_body, post, wait_for
from tests.proxy.test_admission_e2e import Held, queued

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_demand_hash_metrics_and_scale_from_zero(procs, clean_redis, tenant_a):
    spawn_replica(procs, endpoint=tenant_a.endpoint, name="r1", speed=1.0, concurrency_limit=1)
    # Static actuator: the test starts the first replica itself (a local one started from inside the proxy
    # process would outlive it).
    cold = EndpointFactory(
        name="cold-model",
        owner_tenant=tenant_a.tenant,
        scale_to_zero=True,
        min_replicas=0,
        launch_options={"actuator": "static"},
    )
    CapacityReservation.objects.create(tenant=tenant_a.tenant, endpoint=cold, mu_per_min=100)
    base = spawn_proxy(procs, max_age_standard_s=30)
    key = tenant_a.raw_key
    name = tenant_a.endpoint.name

    # One stream running and one queued behind it: the demand hash shows both, in requests and in MU.
    hold = Held(base, key, chat_body(name, max_tokens=1500))
    results = []
    waiter = threading.Thread(target=lambda: results.append(post(base, key, chat_body(name, max_tokens=5))))
    waiter.start()
    demand_key = f"infercap:demand:{tenant_a.endpoint.pk}"

    def busy():
        fields = clean_redis.hgetall(demand_key)
        reports = [json.loads(v) for v in fields.values()]
        return reports if any(r["in_flight"] == 1 and r["queued"] == 1 for r in reports) else None

    reports = wait_for(busy, timeout=10)
    report = next(r for r in reports if r["queued"] == 1)
    assert report["in_flight_mu"] > 0 and report["queued_mu"] > 0
    assert report["queued_by_class"] == {"critical": 0, "standard": 1, "sheddable": 0}
    assert abs(report["t"] - time.time()) < 3
    assert 0 < clean_redis.ttl(demand_key) <= 5
    hold.release()
    waiter.join(30)
    assert [r.status_code for r in results] == [200]

    # Prometheus exposition parses, with the series the dashboards and the SLO rules read (gateway/proxy/metrics.py).
    text = httpx.get(base + "/metrics", headers=METRICS_AUTH).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for wanted in (
        "infercap_proxy_requests",
        "infercap_proxy_ttft_seconds",
        "infercap_proxy_tpot_seconds",
        "infercap_proxy_e2e_seconds",
        "infercap_proxy_queue_seconds",
        "infercap_proxy_queue_depth",
        "infercap_proxy_shed",
        "infercap_proxy_rate_limited",
        "infercap_proxy_in_flight",
        "infercap_proxy_in_flight_mu",
    ):
        assert wanted in families, wanted
    ok = [
        s
        for s in families["infercap_proxy_requests"].samples
        if s.name.endswith("_total") and s.labels["status"] == "ok"
    ]
    assert (
        sum(s.value for s in ok) == 1
        and ok[0].labels["tenant"] == "tenant-a"
        and ok[0].labels["priority"] == "standard"
    )
    # Goodput: the proxy counts exactly the requests its usage records say met every latency SLO.
    from billing.models import UsageRecord

    wait_for(lambda: UsageRecord.objects.filter(status="ok").count() >= 1, timeout=10)
    good = [s for s in families["infercap_proxy_good_requests"].samples if s.name.endswith("_total")]
    assert sum(s.value for s in good) == UsageRecord.objects.filter(status="ok", slo_met=True).count()

    # Scale from zero: the request waits in the queue, the autoscaler is woken, and it runs once a replica is ready.
    cold_result = []
    waiter = threading.Thread(
        target=lambda: cold_result.append(post(base, key, chat_body("cold-model", max_tokens=3)))
    )
    waiter.start()
    wait_for(lambda: clean_redis.exists(f"infercap:activator:{cold.pk}"), timeout=5)
    wait_for(lambda: queued(base, "cold-model", 1), timeout=10, message="the request in the proxy's queue")
    assert not cold_result, "held in the queue while no replica exists"
    spawn_replica(procs, endpoint=cold, name="c1", speed=20.0)
    waiter.join(30)
    assert cold_result and cold_result[0].status_code == 200
