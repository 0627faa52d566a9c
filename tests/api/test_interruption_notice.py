"""POST /api/v1/replicas/{id}/interruption-notice/: the cloud takes a replica's instance in ``notice_s`` seconds
(a spot interruption). Operators only (and the node agent holding an operator's credentials); field errors for bad
input; the replica shows when it is taken, and drains at once when that is within 30 s."""

import pytest
from django.urls import reverse

from capacity.autoscaling import services
from endpoints.models import ReplicaState
from tests.factories import ReplicaFactory

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_wake(monkeypatch):
    monkeypatch.setattr(services, "_wake_autoscaler", lambda endpoint_id, tick: None)


def notice(world, replica, who="operator", **body):
    url = reverse("replica-interruption-notice", args=[replica.pk])
    return world.client(who).post(url, body, format="json")


def test_an_operator_s_notice_shows_when_the_replica_is_taken_and_a_short_one_drains_it(world):
    replica = ReplicaFactory(endpoint=world.a.endpoint, actuator="static")
    response = notice(world, replica, notice_s=30)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["state"] == ReplicaState.DRAINING and body["terminate_at"]
    assert body["transitions"][-1]["reason"].startswith("interruption notice: taken at")
    # No body: AWS's two minutes. A longer notice than 30 s: it serves on (not counted as capacity, replaced at
    # once) and the reconcile loop drains it 30 s before it is taken.
    other = ReplicaFactory(endpoint=world.a.endpoint, actuator="static")
    later = notice(world, other).json()
    assert later["state"] == ReplicaState.READY and later["terminate_at"]


@pytest.mark.parametrize(("who", "status"), [("a_admin", 403), ("a_write_key", 403), ("b_admin", 404)])
def test_tenants_cannot_take_a_replica(world, who, status):
    replica = ReplicaFactory(endpoint=world.a.endpoint, actuator="static")
    assert notice(world, replica, who=who, notice_s=30).status_code == status
    replica.refresh_from_db()
    assert replica.state == ReplicaState.READY and replica.terminate_at is None


@pytest.mark.parametrize(
    ("body", "field"),
    [({"notice_s": -1}, "notice_s"), ({"notice_s": 10_000}, "notice_s"), ({"notice_s": "soon"}, "notice_s")],
)
def test_bad_notices_are_field_errors(world, body, field):
    replica = ReplicaFactory(endpoint=world.a.endpoint, actuator="static")
    response = notice(world, replica, **body)
    assert response.status_code == 400 and field in response.json(), response.content


def test_a_stopped_replica_has_nothing_to_take(world):
    replica = ReplicaFactory(endpoint=world.a.endpoint, actuator="static", state=ReplicaState.STOPPED)
    response = notice(world, replica, notice_s=30)
    assert response.status_code == 400 and "replica" in response.json(), response.content
