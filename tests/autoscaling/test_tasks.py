"""The beat loops: scheduled every 5 s and 30 s, fanning out one tick per autoscaled endpoint."""

import pytest

from capacity.autoscaling import services
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
