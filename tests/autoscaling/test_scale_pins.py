"""Manual scaling is a pin: the operator's count starts replicas at once, the autoscaler's real Celery ticks hold it
and say so in their decisions, and it ends when it expires or is released, each step in the decision log."""

import time
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from capacity.autoscaling import services, ticks
from capacity.autoscaling.actuators.local import pid_alive
from capacity.models import AutoscalerDecision, ScalePin
from endpoints.models import Endpoint, ReplicaState
from tenants.models import AuditEntry
from tests.autoscaling.test_ticks import RecordingActuator, report
from tests.conftest import client_for
from tests.proxy.helpers import wait_for
from workers.tasks.autoscaling import horizontal_one

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def actuator(monkeypatch):
    recording = RecordingActuator()
    monkeypatch.setattr(services, "get_actuator", lambda endpoint: recording)
    return recording


@pytest.fixture
def endpoint(tenant_a):
    Endpoint.objects.filter(pk=tenant_a.endpoint.pk).update(
        concurrency_limit=10, min_replicas=1, max_replicas=8, desired_replicas=1
    )
    tenant_a.endpoint.refresh_from_db()
    return tenant_a.endpoint


def _scale(operator, endpoint, desired, **extra):
    url = reverse("endpoint-scale", args=[endpoint.pk])
    return client_for(operator).post(url, {"desired_replicas": desired, **extra}, format="json")


def _tick(endpoint, name):
    decision_id = horizontal_one(endpoint.pk, name)
    return AutoscalerDecision.objects.get(pk=decision_id)


def test_a_scale_starts_replicas_now_and_the_ticks_hold_it(clean_store, actuator, operator, endpoint):
    # Given an autoscaled endpoint with no demand, when an operator scales it to 3
    response = _scale(operator, endpoint, 3, reason="launch day")
    assert response.status_code == 200, response.content
    pin = response.json()["scale_pin"]
    assert pin["replicas"] == 3 and pin["set_by"] == "operator" and pin["reason"] == "launch day"
    until = timezone.datetime.fromisoformat(pin["until"])
    assert timedelta(minutes=59) < until - timezone.now() <= timedelta(minutes=60)
    # Then replicas start at once (the scale's own task), and the scale is in the decision log with what it did
    assert actuator.launched == [(endpoint.pk, 3, False)]
    manual = AutoscalerDecision.objects.get(endpoint=endpoint, tick__startswith="manual-")
    assert (manual.current, manual.desired, manual.applied) == (1, 3, True)
    assert "pinned at 3" in manual.reason and "launch day" in manual.reason
    assert manual.inputs["actions"][0].startswith("launched 3")
    # And the autoscaler's ticks (the beat's Celery task) hold it, saying why, when demand alone would want more
    ref = ticks.mu_capacity_for(endpoint) / 10
    for i in range(3):
        report(clean_store, endpoint, "proxy-1", t=time.time(), in_flight=60, queued=20, in_flight_mu=60 * ref)
        decision = _tick(endpoint, f"h-pin-{i}")
        assert decision.desired == 3 and decision.applied, decision.reason
        assert decision.reason.startswith("pinned at 3 by operator until")
        assert decision.inputs["policy_desired"] > 3 and decision.inputs["pin"]["replicas"] == 3
    endpoint.refresh_from_db()
    assert endpoint.desired_replicas == 3 and len(actuator.launched) == 1


def test_the_pin_expires_and_the_autoscaler_says_so(clean_store, actuator, operator, endpoint):
    _scale(operator, endpoint, 4, pin_minutes=5)
    ScalePin.objects.filter(endpoint=endpoint).update(until=timezone.now() - timedelta(seconds=1))
    decision = _tick(endpoint, "h-after")
    assert "pin at 4 by operator expired" in decision.reason and "pin_expired" in decision.inputs
    assert not ScalePin.objects.filter(endpoint=endpoint).exists()
    assert AuditEntry.objects.filter(action="endpoint.pin_expired", object_id=str(endpoint.pk)).exists()
    # The next tick is the policy's alone.
    assert "pin" not in _tick(endpoint, "h-later").reason


def test_release_ends_the_pin_at_once(clean_store, actuator, operator, endpoint):
    _scale(operator, endpoint, 2)
    released = client_for(operator).delete(reverse("endpoint-scale", args=[endpoint.pk]))
    assert released.status_code == 200 and released.json()["scale_pin"] is None
    step = AutoscalerDecision.objects.get(endpoint=endpoint, tick__startswith="unpin-")
    assert "released by operator" in step.reason
    assert "pinned" not in _tick(endpoint, "h-free").reason
    assert AuditEntry.objects.filter(action="endpoint.unpin").count() == 1


def test_pin_length_is_bounded_and_autoscale_off_needs_no_pin(clean_store, actuator, operator, endpoint):
    assert _scale(operator, endpoint, 2, pin_minutes=0).status_code == 400
    assert _scale(operator, endpoint, 2, pin_minutes=7 * 24 * 60 + 1).status_code == 400
    Endpoint.objects.filter(pk=endpoint.pk).update(launch_options={"autoscale": False})
    response = _scale(operator, endpoint, 2)
    assert response.status_code == 200 and response.json()["scale_pin"] is None
    manual = AutoscalerDecision.objects.get(endpoint=endpoint, tick__startswith="manual-")
    assert "autoscaling off" in manual.reason
    assert actuator.launched == [(endpoint.pk, 2, False)]  # started now, though no tick runs this endpoint


def test_a_scale_during_a_tick_is_not_undone(clean_store, actuator, operator, endpoint, monkeypatch):
    # A tick that read no pin, then an operator scale lands before it writes: the tick keeps the operator's count.
    real = ticks.horizontal.decide

    def decide_then_scale(inputs):
        decision = real(inputs)
        Endpoint.objects.filter(pk=endpoint.pk).update(desired_replicas=5)
        ScalePin.objects.create(endpoint=endpoint, replicas=5, until=timezone.now() + timedelta(hours=1))
        return decision

    monkeypatch.setattr(ticks.horizontal, "decide", decide_then_scale)
    decision = _tick(endpoint, "h-race")
    endpoint.refresh_from_db()
    assert endpoint.desired_replicas == 5 and "an operator scaled meanwhile" in decision.reason


def test_console_shows_the_pin_and_releases_it(client, clean_store, actuator, operator, endpoint):
    _scale(operator, endpoint, 3, reason="launch day")
    client.force_login(operator)
    page = client.get(reverse("console:endpoint", args=[endpoint.pk])).content.decode()
    assert "Pinned at 3 replicas" in page and "launch day" in page and "Release the pin now" in page
    assert "operator scale by operator: pinned at 3" in page  # the decision log lists the scale itself
    client.post(reverse("console:endpoint-unpin", args=[endpoint.pk]))
    assert not ScalePin.objects.filter(endpoint=endpoint).exists()


@pytest.mark.e2e
def test_local_replicas_start_for_a_pin_and_stay(procs, clean_store, reap_local_replicas, operator, tenant_a):
    # Real simulated replica processes on the local actuator: the scale starts them, the ticks keep them.
    Endpoint.objects.filter(pk=tenant_a.endpoint.pk).update(
        launch_options={"actuator": "local", "profile": "tiny"}, min_replicas=0, max_replicas=4, desired_replicas=0
    )
    endpoint = Endpoint.objects.get(pk=tenant_a.endpoint.pk)
    assert _scale(operator, endpoint, 2).status_code == 200
    started = time.time()

    def ready():
        _tick(endpoint, f"h-e2e-{time.time():.3f}")
        return endpoint.replicas.filter(state=ReplicaState.READY, is_standby=False).count() == 2

    wait_for(ready, 60, interval=0.5)
    replicas = list(endpoint.replicas.filter(state=ReplicaState.READY))
    assert all(pid_alive(int(r.actuator_ref)) for r in replicas), time.time() - started
    for i in range(2):
        assert _tick(endpoint, f"h-e2e-hold-{i}").desired == 2
    assert endpoint.replicas.filter(state=ReplicaState.READY).count() == 2
