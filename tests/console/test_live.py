"""Live console events over the real Channels stack (session auth, Redis channel layer): each socket hears only
what its user may see, events follow commits, and queue-depth watches respect tenant visibility."""

import json

import pytest
from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.security.websocket import AllowedHostsOriginValidator
from channels.testing.websocket import WebsocketCommunicator  # channels.testing itself needs daphne
from django.conf import settings
from django.db import connections, transaction
from django.test import Client

from billing.models import Alert
from config.routing import websocket_urlpatterns
from console.selectors import DEMAND_KEY
from endpoints.models import Replica, ReplicaState
from endpoints.services import replica_transition
from tests.factories import SLOFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

application = AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))


@pytest.fixture(autouse=True)
async def _close_worker_connections():
    """The consumer's queries run in asgiref's shared sync thread; close its connection so the test DB can go."""
    yield
    await database_sync_to_async(connections.close_all)()


@database_sync_to_async
def _session_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies[settings.SESSION_COOKIE_NAME].value


async def _connect(user=None) -> WebsocketCommunicator:
    headers = [(b"origin", b"http://localhost"), (b"host", b"localhost")]
    if user is not None:
        headers.append((b"cookie", f"{settings.SESSION_COOKIE_NAME}={await _session_cookie(user)}".encode()))
    communicator = WebsocketCommunicator(application, "/ws/console/", headers=headers)
    connected, _ = await communicator.connect(timeout=5)
    assert connected
    hello = await communicator.receive_json_from(timeout=5)
    assert hello["kind"] == "hello"
    return communicator


async def _next_of_kind(communicator, kind: str, timeout: float = 5) -> dict:
    while True:
        event = await communicator.receive_json_from(timeout=timeout)
        if event["kind"] == kind:
            return event["payload"]


@database_sync_to_async
def _start_replica(endpoint, name: str) -> Replica:
    replica = Replica.objects.create(endpoint=endpoint, name=name, state=ReplicaState.PENDING)
    replica_transition(replica=replica, to_state=ReplicaState.STARTING)
    replica_transition(replica=replica, to_state=ReplicaState.READY)
    return replica


async def test_tenant_socket_hears_only_its_own_events(operator, tenant_a, tenant_b):
    socket_a, socket_b, socket_op = (
        await _connect(tenant_a.member),
        await _connect(tenant_b.member),
        await _connect(operator),
    )
    try:
        await _start_replica(tenant_b.endpoint, "b-live")
        states = [(await _next_of_kind(socket_b, "replica"))["state"] for _ in range(3)]
        assert states == ["pending", "starting", "ready"]
        assert (await _next_of_kind(socket_op, "replica"))["endpoint"] == "b-model"

        slo = await database_sync_to_async(SLOFactory)(endpoint=tenant_b.endpoint, name="b-slo")
        await database_sync_to_async(Alert.objects.create)(
            slo=slo, severity="page", state="firing", long_window="1h", short_window="5m", burn_rate_threshold=14.4
        )
        assert (await _next_of_kind(socket_b, "alert"))["slo"] == "b-slo"
        assert await socket_a.receive_nothing(timeout=1.0)  # nothing of tenant B reached tenant A

        await _start_replica(tenant_a.endpoint, "a-live")
        event = await _next_of_kind(socket_a, "replica")
        assert event["endpoint"] == "a-model"
    finally:
        for socket in (socket_a, socket_b, socket_op):
            await socket.disconnect()


async def test_events_follow_commit_not_rollback(tenant_a):
    socket_a = await _connect(tenant_a.admin)
    try:

        @database_sync_to_async
        def rolled_back():
            with pytest.raises(RuntimeError), transaction.atomic():
                Replica.objects.create(endpoint=tenant_a.endpoint, name="ghost")
                raise RuntimeError("abort")

        await rolled_back()
        assert await socket_a.receive_nothing(timeout=0.8)
    finally:
        await socket_a.disconnect()


async def test_anonymous_socket_is_refused():
    communicator = WebsocketCommunicator(application, "/ws/console/", headers=[(b"origin", b"http://localhost")])
    connected, _ = await communicator.connect(timeout=5)
    assert not connected
    await communicator.disconnect()


async def test_queue_watch_limited_to_visible_endpoints(tenant_a, tenant_b):
    import redis.asyncio as aioredis

    redis = aioredis.Redis.from_url(settings.REDIS_URL)
    keys = [DEMAND_KEY.format(endpoint_id=e.pk) for e in (tenant_a.endpoint, tenant_b.endpoint)]
    await redis.hset(keys[0], "proxy-1", json.dumps({"queued_by_class": {"critical": 2, "standard": 5}}))
    await redis.hset(keys[0], "proxy-2", json.dumps({"queued_by_class": {"standard": 1}}))
    await redis.hset(keys[1], "proxy-1", json.dumps({"queued_by_class": {"standard": 99}}))
    socket_a = await _connect(tenant_a.member)
    try:
        await socket_a.send_json_to({"watch": [tenant_a.endpoint.pk, tenant_b.endpoint.pk, "x"]})
        watching = await _next_of_kind(socket_a, "watching")
        assert watching["endpoint_ids"] == [tenant_a.endpoint.pk]
        queue = await _next_of_kind(socket_a, "queue")
        assert queue == {"endpoint_id": tenant_a.endpoint.pk, "queued": {"critical": 2, "standard": 6, "sheddable": 0}}
        await socket_a.send_json_to({"nonsense": True})
        assert (await _next_of_kind(socket_a, "error"))["detail"].startswith("expected")
    finally:
        await socket_a.disconnect()
        await redis.delete(*keys)
        await redis.aclose()
