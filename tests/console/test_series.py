"""Chart series come from the per-minute rollups: rates per second, p95 from histogram buckets, ready replicas."""

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from billing.rollups import usage_rollup_run
from billing.slo import TTFT_BOUNDS_MS
from console.selectors import bucket_quantile, endpoint_series
from endpoints.models import Replica, ReplicaState
from endpoints.services import replica_transition
from tests.factories import UsageRecordFactory


def test_bucket_quantile_interpolates_like_prometheus():
    bounds = (100, 200, 500)
    assert bucket_quantile(0.95, bounds, [0, 100, 100], 100) == pytest.approx(195.0)
    assert bucket_quantile(0.5, bounds, [50, 100, 100], 100) == pytest.approx(100.0)
    assert bucket_quantile(0.95, bounds, [0, 0, 10], 20) == 500.0  # beyond the last bound: the last bound
    assert bucket_quantile(0.95, bounds, [0, 0, 0], 0) is None


@pytest.mark.django_db
def test_endpoint_series_from_rollups(tenant_a):
    endpoint = tenant_a.endpoint
    replica = Replica.objects.create(endpoint=endpoint, name="r")
    replica_transition(replica=replica, to_state=ReplicaState.STARTING)
    replica_transition(replica=replica, to_state=ReplicaState.READY)
    now = timezone.now()
    two_ago = now - timedelta(minutes=2)
    for i in range(120):  # 2 req/s during one minute, TTFT 150 ms, one in ten failed upstream
        UsageRecordFactory(
            tenant=tenant_a.tenant,
            endpoint=endpoint,
            ttft_ms=150,
            tpot_ms=30,
            mu=2.0,
            status="upstream_error" if i % 10 == 0 else "ok",
            finished_at=two_ago,
        )
    usage_rollup_run(now=now)

    series = endpoint_series(endpoint=endpoint, now=now, minutes=10)
    index = series.minutes.index(two_ago.replace(second=0, microsecond=0).timestamp())
    assert series.requests_per_s[index] == pytest.approx(2.0)
    assert series.errors_per_s[index] == pytest.approx(12 / 60)
    assert series.mu_per_min[index] == pytest.approx(240.0)
    assert 100 < series.ttft_p95_ms[index] <= 200 and TTFT_BOUNDS_MS[1] == 100
    assert series.ttft_p95_ms[index - 1] is None and series.requests_per_s[index - 1] == 0
    # The minute still running is not drawn (its partial rollup would read as a drop), unlike a quiet minute (0).
    assert series.requests_per_s[-1] is None and series.mu_per_min[-1] is None and series.ttft_p95_ms[-1] is None
    assert series.requests_per_s[-2] == 0.0
    assert series.ready_replicas[-1] == 1 and series.ready_replicas[0] == 0


@pytest.mark.django_db
def test_queue_depth_history_is_sampled_per_class_and_charted(client, operator, tenant_a, tenant_b, settings):
    import redis

    from console.live import redis_client
    from console.queue_history import HISTORY_KEY, queue_history, queue_sample
    from console.selectors import DEMAND_KEY

    r = redis.Redis.from_url(settings.REDIS_URL)
    endpoint = tenant_a.endpoint
    demand, history = DEMAND_KEY.format(endpoint_id=endpoint.pk), HISTORY_KEY.format(endpoint_id=endpoint.pk)
    redis_client.cache_clear()
    r.delete(demand, history)
    try:
        base = float(int(timezone.now().timestamp()) - 60)
        r.hset(demand, "p1", json.dumps({"queued_by_class": {"critical": 1, "standard": 4}}))
        r.hset(demand, "p2", json.dumps({"queued_by_class": {"standard": 2, "sheddable": 7}}))
        assert queue_sample(endpoint_ids=[endpoint.pk], now=base) == 1
        r.hset(demand, "p2", json.dumps({"queued_by_class": {}}))
        queue_sample(endpoint_ids=[endpoint.pk], now=base + 5)
        points = queue_history(endpoint.pk, since=base - 1)
        assert points["standard"] == [(base, 6.0), (base + 5, 4.0)]
        assert points["sheddable"] == [(base, 7.0), (base + 5, 0.0)]
        assert queue_history(endpoint.pk, since=base + 1)["critical"] == [(base + 5, 1.0)]

        client.force_login(operator)
        page = client.get(f"/console/endpoints/{endpoint.pk}/").content.decode()
        chart = page.split('aria-label="Queue depth by priority class"')[1].split("</svg>")[0]
        assert chart.count("<polyline") == 3
    finally:
        r.delete(demand, history)
