"""The beat loops: scheduled every 5 s and 30 s, fanning out one tick per autoscaled endpoint."""

import pytest

from capacity.autoscaling import services, ticks
from capacity.models import AutoscalerDecision
from endpoints.models import Endpoint
from tests.autoscaling.test_ticks import RecordingActuator
from workers.schedule import beat_schedule
from workers.tasks import autoscaling as tasks

pytestmark = pytest.mark.django_db


def test_beat_schedule_has_both_loops():
    schedule = beat_schedule()
    assert schedule["autoscale-horizontal"]["task"] == "autoscale.horizontal_all"
    assert schedule["autoscale-horizontal"]["schedule"] == 5.0
    assert schedule["autoscale-vertical"]["task"] == "autoscale.vertical_all"
    assert schedule["autoscale-vertical"]["schedule"] == 30.0
    assert schedule["autoscale-sample-demand"]["schedule"] == 1.0


def test_sampler_keeps_one_sample_per_second_for_the_decision(clean_store, tenant_a, monkeypatch):
    import json
    import time

    from capacity.autoscaling import store

    Endpoint.objects.filter(pk=tenant_a.endpoint.pk).update(launch_options={"actuator": "local"}, concurrency_limit=10)
    key = store.DEMAND_KEY.format(endpoint_id=tenant_a.endpoint.pk)
    # A 3-second burst that is over by the time the 5 s tick runs still drives the decision (max of the last 20 s).
    for in_flight in (5, 60, 5):
        clean_store.hset(key, "proxy-1", json.dumps({"t": time.time(), "in_flight": in_flight}))
        assert tasks.sample_demand() == 1
    monkeypatch.setattr(services, "get_actuator", lambda endpoint: RecordingActuator())
    decision = ticks.horizontal_tick(endpoint_id=tenant_a.endpoint.pk, tick="h-s")
    assert decision.inputs["samples_up"] == 4 and decision.inputs["up_need"] == pytest.approx(60 / 7, abs=1e-3)


def test_fan_out_skips_static_and_opted_out_endpoints(clean_store, tenant_a, tenant_b, monkeypatch):
    monkeypatch.setattr(services, "get_actuator", lambda endpoint: RecordingActuator())
    Endpoint.objects.filter(pk=tenant_b.endpoint.pk).update(launch_options={"actuator": "static"})
    Endpoint.objects.filter(pk=tenant_a.endpoint.pk).update(launch_options={"actuator": "local"})
    assert tasks.autoscaled_endpoint_ids() == [tenant_a.endpoint.pk]
    # Eager in tests: the fan-out runs the per-endpoint tick in place, and a second fan-out in the same 5 s slot
    # finds the decision already taken.
    assert tasks.horizontal_all() == 1
    tasks.horizontal_all()
    decisions = AutoscalerDecision.objects.filter(axis="horizontal")
    assert [d.endpoint_id for d in decisions] in ([tenant_a.endpoint.pk], [tenant_a.endpoint.pk] * 2)
    assert decisions.values("tick").distinct().count() == decisions.count()
    Endpoint.objects.filter(pk=tenant_a.endpoint.pk).update(launch_options={"actuator": "local", "autoscale": False})
    assert tasks.autoscaled_endpoint_ids() == []


def test_retention_keeps_recent_decisions_and_the_last_applied_one(tenant_a):
    from datetime import timedelta

    from django.utils import timezone

    old = timezone.now() - timedelta(days=20)

    def make(tick, at, applied=True, axis="horizontal"):
        row = AutoscalerDecision.objects.create(
            endpoint=tenant_a.endpoint, axis=axis, current=1, desired=2, reason="r", tick=tick, applied=applied
        )
        AutoscalerDecision.objects.filter(pk=row.pk).update(at=at)
        return row

    stale = [make(f"h-old-{i}", old) for i in range(3)]
    last_vertical = make("v-old", old, axis="vertical")
    fresh = make("h-new", timezone.now())
    assert tasks.decisions_retention() == 3
    remaining = set(AutoscalerDecision.objects.values_list("pk", flat=True))
    assert remaining == {fresh.pk, last_vertical.pk} and not {s.pk for s in stale} & remaining


def test_sampler_and_ticks_survive_redis_down(clean_store, tenant_a, monkeypatch):
    import redis

    from capacity.autoscaling import store

    Endpoint.objects.filter(pk=tenant_a.endpoint.pk).update(launch_options={"actuator": "local"})
    unreachable = redis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.2, socket_timeout=0.2)
    monkeypatch.setattr(store, "client", lambda: unreachable)
    assert tasks.sample_demand() == 0  # raised ConnectionError every second
    assert tasks.horizontal_one(tenant_a.endpoint.pk, "h-redis-down") is None
    assert tasks.vertical_one(tenant_a.endpoint.pk, "v-redis-down") is None


def test_vertical_tick_with_inverted_bounds_in_the_database(clean_store, tenant_a):
    # concurrency_min above concurrency_max (a SQL update skips the validators): decide() raised every 30 s
    Endpoint.objects.filter(pk=tenant_a.endpoint.pk).update(
        concurrency_min=64, concurrency_max=16, concurrency_limit=32
    )
    decision = ticks.vertical_tick(endpoint_id=tenant_a.endpoint.pk, tick="v-inverted")
    assert decision is not None and decision.desired == 16 and decision.reason.startswith("clamped into bounds")
