"""The console's endpoint page and live events follow the replicas API's rule: a tenant that only reserves on a
shared endpoint sees its replicas' state and health under neutral names (``replica-<id>``), never their addresses,
actuator, pod or process names, failure texts or the endpoint's placement launch options; operators and the owning
tenant see everything."""

import pytest
from channels.db import database_sync_to_async
from django.urls import reverse

from endpoints.models import ReplicaState
from endpoints.services import replica_transition
from tests.console.test_live import _close_worker_connections, _connect, _next_of_kind  # noqa: F401  (fixture)
from tests.factories import EndpointFactory, ReplicaFactory, ReservationFactory

POD = "infercap-ep-77-5d8f9c-x2x9q"
# Texts that a timestamp or an id on the page cannot contain by chance.
PLACEMENT = (POD, "10.42.7.19", "pid 31337", "kubernetes", "gpu-pool-7", "cpus 41,43,47")


def _shared_endpoint(*, owner=None, reserving):
    endpoint = EndpointFactory(
        name="shared-70b",
        owner_tenant=owner,
        launch_options={"namespace": "gpu-pool-7", "cpuset": "cpus 41,43,47", "max_model_len": 8192},
    )
    ReservationFactory(tenant=reserving, endpoint=endpoint)
    return endpoint


def _placed_replica(endpoint):
    replica = ReplicaFactory(
        endpoint=endpoint,
        name=POD,
        url="http://10.42.7.19:8000",
        actuator="kubernetes",
        actuator_ref=POD,
        state=ReplicaState.STARTING,
    )
    replica_transition(replica=replica, to_state=ReplicaState.FAILED, reason="pid 31337 exited on 10.42.7.19")
    replica.refresh_from_db()
    assert "pid 31337" in replica.failure_reason  # the health column would show it: what there is to hide
    return replica


def _shown(replica) -> str:
    return f"replica-{replica.pk}<"  # the neutral name as a cell's text ("replica-1" is in "replica-12")


def _page(client, user, endpoint, **query) -> str:
    client.force_login(user)
    response = client.get(reverse("console:endpoint", args=[endpoint.pk]), query)
    assert response.status_code == 200
    return response.content.decode()


@pytest.mark.django_db
def test_a_reserving_tenant_sees_state_under_a_neutral_name(client, tenant_a, tenant_b):
    shared = _shared_endpoint(reserving=tenant_a.tenant)
    replica = _placed_replica(shared)
    other = ReplicaFactory(endpoint=shared, name="aaa-first-by-name", url="http://10.42.7.20:8000")
    for user in (tenant_a.member, tenant_a.admin):
        page = _page(client, user, shared, stopped="1")
        assert _shown(replica) in page and _shown(other) in page
        assert "Failed" in page  # the state stays
        assert not [text for text in PLACEMENT if text in page], user
        assert "aaa-first-by-name" not in page and "10.42.7.20" not in page
        # Rows in id order: an order by the hidden names would still rank them.
        assert page.index(_shown(replica)) < page.index(_shown(other))


@pytest.mark.django_db
def test_operators_and_the_owner_see_placement(client, operator, tenant_a, tenant_b):
    shared = _shared_endpoint(owner=tenant_b.tenant, reserving=tenant_a.tenant)
    replica = _placed_replica(shared)
    for user in (operator, tenant_b.member):
        page = _page(client, user, shared)
        assert POD in page and "kubernetes" in page and "pid 31337" in page
        assert _shown(replica) not in page
    reserving = _page(client, tenant_a.member, shared)
    assert _shown(replica) in reserving and not [text for text in PLACEMENT if text in reserving]


@database_sync_to_async
def _fail_a_replica(endpoint):
    return _placed_replica(endpoint).pk


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_live_replica_events_name_the_replica_only_to_operators_and_the_owner(operator, tenant_a, tenant_b):
    shared = await database_sync_to_async(_shared_endpoint)(owner=tenant_b.tenant, reserving=tenant_a.tenant)
    sockets = {"reserving": await _connect(tenant_a.member), "owner": await _connect(tenant_b.member)}
    sockets["operator"] = await _connect(operator)
    try:
        replica_id = await _fail_a_replica(shared)
        heard = {who: [await _next_of_kind(s, "replica") for _ in range(2)] for who, s in sockets.items()}
        for who, events in heard.items():
            assert [e["state"] for e in events] == ["starting", "failed"], who
            assert {e["replica_id"] for e in events} == {replica_id}
            assert await sockets[who].receive_nothing(timeout=0.5), f"{who} heard a replica event twice"
        assert {e["replica"] for e in heard["reserving"]} == {f"replica-{replica_id}"}
        assert not [text for text in PLACEMENT if text in repr(heard["reserving"])]
        assert {e["replica"] for e in heard["owner"] + heard["operator"]} == {POD}
    finally:
        for socket in sockets.values():
            await socket.disconnect()
