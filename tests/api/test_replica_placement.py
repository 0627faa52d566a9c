"""/api/v1/replicas/: a tenant that only reserves on a shared endpoint sees its replicas' state and health, never
where they run (URL, actuator, pod or process names, pids in failure and transition texts); operators and the
owning tenant see everything."""

import pytest
from django.urls import reverse

from endpoints.models import ReplicaState
from endpoints.services import replica_transition
from tests.factories import EndpointFactory, ReplicaFactory, ReservationFactory

pytestmark = pytest.mark.django_db

PLACEMENT = ("10.42.7.19", "infercap-ep-77-5d8f9c-x2x9q", "kubernetes", "pid 31337")


@pytest.fixture
def shared(world):
    endpoint = EndpointFactory(name="shared-70b")  # no owner: the operators'
    ReservationFactory(tenant=world.a.tenant, endpoint=endpoint)
    replica = ReplicaFactory(
        endpoint=endpoint,
        name="infercap-ep-77-5d8f9c-x2x9q",
        url="http://10.42.7.19:8000",
        actuator="kubernetes",
        actuator_ref="infercap-ep-77-5d8f9c-x2x9q",
        state=ReplicaState.STARTING,
    )
    replica_transition(replica=replica, to_state=ReplicaState.FAILED, reason="pid 31337 exited on 10.42.7.19")
    return endpoint, replica


def _rows(response) -> list[dict]:
    assert response.status_code == 200, response.content
    return response.json()["results"]


@pytest.mark.parametrize("who", ["a_member", "a_admin", "a_read_key"])
def test_a_reserving_tenant_sees_health_not_placement(world, shared, who):
    endpoint, replica = shared
    client = world.client(who)
    listed = _rows(client.get(reverse("replica-list"), {"endpoint": endpoint.pk}))
    detail = client.get(reverse("replica-detail", args=[replica.pk]))
    assert detail.status_code == 200
    for row in (*listed, detail.json()):
        assert row["id"] == replica.pk and row["state"] == ReplicaState.FAILED
        assert (row["name"], row["url"], row["actuator"], row["failure_reason"]) == (
            f"replica-{replica.pk}",
            "",
            "",
            "",
        )
    assert [t["to_state"] for t in detail.json()["transitions"]] == [ReplicaState.FAILED]
    for text in PLACEMENT:
        assert text not in listed.__repr__() and text not in detail.content.decode()


def test_the_actuator_filter_is_no_oracle_for_a_shared_endpoint(world, shared):
    endpoint, _ = shared
    mine = ReplicaFactory(endpoint=world.a.endpoint, actuator="kubernetes")
    client = world.client("a_member")
    for actuator in ("kubernetes", "local", "static"):
        rows = _rows(client.get(reverse("replica-list"), {"actuator": actuator, "endpoint": endpoint.pk}))
        assert rows == [], actuator
    own = _rows(client.get(reverse("replica-list"), {"actuator": "kubernetes"}))
    assert [row["id"] for row in own] == [mine.pk]


def test_operators_and_the_owner_see_placement(world, shared):
    endpoint, replica = shared
    row = world.client("operator").get(reverse("replica-detail", args=[replica.pk])).json()
    assert row["url"] == "http://10.42.7.19:8000" and row["actuator"] == "kubernetes"
    assert row["name"] == replica.name and "pid 31337" in row["failure_reason"]
    assert "pid 31337" in row["transitions"][-1]["reason"]
    operator_rows = _rows(world.client("operator").get(reverse("replica-list"), {"actuator": "kubernetes"}))
    assert replica.pk in {r["id"] for r in operator_rows}
    own = ReplicaFactory(endpoint=world.a.endpoint, url="http://10.0.0.5:8000", actuator="local", name="local-1")
    row = world.client("a_member").get(reverse("replica-detail", args=[own.pk])).json()
    assert (row["name"], row["url"], row["actuator"]) == ("local-1", "http://10.0.0.5:8000", "local")


def test_the_list_costs_no_query_per_row(world, shared, django_assert_max_num_queries):
    endpoint, _ = shared
    ReplicaFactory.create_batch(5, endpoint=endpoint)
    client = world.client("a_member")
    with django_assert_max_num_queries(8):
        rows = _rows(client.get(reverse("replica-list"), {"endpoint": endpoint.pk}))
    assert len(rows) == 6 and all(r["url"] == "" for r in rows)
