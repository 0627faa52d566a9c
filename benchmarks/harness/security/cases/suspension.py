"""A suspended tenant (``Tenant.is_active`` off) keeps nothing: its people's logins and open sessions (REST API,
console pages, the console's socket), its keys (API and proxy), and its endpoints (the autoscaler scales none up and
drains their replicas, without cutting streams). Operators are never suspended; reactivation gives everything back.
docs/security.md, "Suspended tenants"."""

from __future__ import annotations

import secrets
import time
from dataclasses import replace

from asgiref.sync import async_to_sync
from celery import signature
from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.testing.websocket import WebsocketCommunicator
from django.conf import settings
from django.test import Client

from benchmarks.harness.security.registry import expect, security_case
from benchmarks.harness.security.world import SecurityWorld
from capacity.autoscaling import horizontal, store, ticks
from capacity.autoscaling.demand import DemandSample
from capacity.services import simulated_profiles_get_or_create
from console.routing import websocket_urlpatterns
from endpoints.models import Endpoint, Replica, ReplicaState, Runtime
from tenants.models import ApiKey, AuditEntry, Tenant, User
from tenants.services import tenant_update
from workers.tasks.autoscaling import autoscaled_endpoint_ids


def _suspend(world: SecurityWorld, tenant, *, active: bool = False) -> None:
    tenant_update(tenant=Tenant.objects.get(pk=tenant.pk), actor=world.operator, is_active=active)


def _refused(response) -> bool:
    return response.status_code in (401, 403)


@security_case(
    "suspension.api_sessions_and_keys",
    "a suspended tenant's admin session scales, creates endpoints, mints keys, creates users; its keys read",
)
def api_sessions_and_keys(world: SecurityWorld) -> str:
    admin, member = world.api(world.a.admin), world.api(world.a.member)  # sessions opened before the suspension
    expect(admin.get("/api/v1/me/").status_code == 200, "A's admin session does not work: the case proves nothing")
    before = (Endpoint.objects.count(), ApiKey.objects.count(), User.objects.count())
    endpoint = world.a.endpoint
    _suspend(world, world.a.tenant)
    attempts = {
        "admin scales": admin.post(f"/api/v1/endpoints/{endpoint.pk}/scale/", {"desired_replicas": 3}, format="json"),
        "admin creates an endpoint": admin.post(
            "/api/v1/endpoints/",
            {
                "name": f"{world.tag}-suspended-new",
                "model_profile": endpoint.model_profile_id,
                "hardware_profile": endpoint.hardware_profile_id,
                "runtime": "sim",
            },
            format="json",
        ),  # fmt: skip
        "admin mints a key": admin.post("/api/v1/api-keys/", {"name": "x", "scopes": ["read"]}, format="json"),
        "admin creates a user": admin.post(
            "/api/v1/users/", {"username": f"{world.tag}-sneaky", "password": secrets.token_urlsafe(16)}, format="json"
        ),
        "admin reads": admin.get("/api/v1/endpoints/"),
        "member reads": member.get("/api/v1/usage/"),
        **{
            f"{label} key reads": world.api(world.a.keys[label]).get("/api/v1/endpoints/")
            for label in ("read", "full")
        },
        "write key writes": world.api(world.a.keys["write"]).post(
            "/api/v1/api-keys/", {"name": "y", "scopes": ["read"]}, format="json"
        ),
    }
    through = [f"{label} ({r.status_code})" for label, r in attempts.items() if not _refused(r)]
    expect(not through, "not refused: " + ", ".join(through))
    expect((Endpoint.objects.count(), ApiKey.objects.count(), User.objects.count()) == before, "something was created")
    endpoint.refresh_from_db()
    expect(endpoint.desired_replicas != 3, "the endpoint was scaled")
    operator = world.api(world.operator).get(f"/api/v1/tenants/{world.a.tenant.pk}/")
    expect(operator.status_code == 200, f"the operator was refused too ({operator.status_code})")
    _suspend(world, world.a.tenant, active=True)
    back = [label for label, api in (("admin", admin), ("key", world.api(world.a.keys["read"])))
            if api.get("/api/v1/endpoints/").status_code != 200]  # fmt: skip
    expect(not back, f"reactivation did not restore: {', '.join(back)}")
    return f"{len(attempts)} refused ({sorted({r.status_code for r in attempts.values()})}); reactivation restores"


@security_case(
    "suspension.console_logins_and_pages",
    "a suspended tenant's admin logs in to the console, or keeps using a session opened before",
)
def console_logins_and_pages(world: SecurityWorld) -> str:
    password = secrets.token_urlsafe(16)
    admin = User.objects.get(pk=world.a.admin.pk)
    admin.set_password(password)
    admin.save(update_fields=["password"])
    held = Client()
    held.force_login(admin)
    expect(held.get("/console/tenant/").status_code == 200, "A's console page does not open: the case proves nothing")
    _suspend(world, world.a.tenant)
    pages = {
        path: held.get(path).status_code for path in ("/console/tenant/", "/console/tenant/keys/", "/console/slos/")
    }
    expect(all(status == 302 for status in pages.values()), f"the held session still reads pages: {pages}")
    fresh = Client()
    fresh.post("/accounts/login/", {"username": admin.username, "password": password})
    expect("_auth_user_id" not in fresh.session, "a suspended tenant's admin logged in with the right password")
    expect(fresh.get("/console/tenant/").status_code == 302, "the new login opens the console")
    operator = Client()
    operator.force_login(world.operator)
    expect(operator.get("/console/tenants/").status_code == 200, "the operator's console is refused too")
    _suspend(world, world.a.tenant, active=True)
    again = Client()
    again.post("/accounts/login/", {"username": admin.username, "password": password})
    expect(again.get("/console/tenant/").status_code == 200, "reactivated, the admin cannot log in again")
    return f"held session redirected to login {pages}; login refused; operator unaffected; reactivation restores"


# -- the console's socket (the consumer reads the database from another thread: committed, restored after) --------
_SOCKETS = AuthMiddlewareStack(URLRouter(websocket_urlpatterns))


def _socket(world: SecurityWorld, user) -> WebsocketCommunicator:
    client = Client()
    client.force_login(user)
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    return WebsocketCommunicator(_SOCKETS, "/ws/console/", headers=[(b"cookie", cookie.encode())])


async def _until_closed(socket: WebsocketCommunicator, timeout_s: float = 5.0) -> int | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            output = await socket.receive_output(timeout=max(0.1, deadline - time.monotonic()))
        except Exception:  # noqa: BLE001 - nothing came (or the consumer failed waiting): it was not closed
            return None
        if output["type"] == "websocket.close":
            return output.get("code")
    return None


@security_case(
    "suspension.console_socket",
    "a suspended tenant's open console socket keeps hearing events, and a new one opens",
    needs_proxy=True,  # not the proxy: committed writes, since the consumer reads from its own thread
)
def console_socket(world: SecurityWorld) -> str:
    desired = Endpoint.objects.get(pk=world.a.endpoint.pk).desired_replicas
    try:
        return async_to_sync(_console_socket)(world)
    finally:
        _suspend(world, world.a.tenant, active=True)
        Endpoint.objects.filter(pk=world.a.endpoint.pk).update(desired_replicas=desired)


async def _console_socket(world: SecurityWorld) -> str:
    opened = database_sync_to_async(_socket)
    held, operator = await opened(world, world.a.member), await opened(world, world.operator)
    try:
        for socket in (held, operator):
            connected, _ = await socket.connect(timeout=5)
            expect(connected, "a socket did not even open: the case proves nothing")
            await socket.receive_json_from(timeout=5)  # hello
        await database_sync_to_async(_suspend)(world, world.a.tenant)
        code = await _until_closed(held)
        expect(code is not None, "A's open socket was not closed on suspension")
        later = await opened(world, world.a.member)
        connected, refused = await later.connect(timeout=5)
        expect(not connected, "a suspended tenant's member opened a new socket")
        expect(await operator.receive_nothing(timeout=0.5), "the operator's socket was disturbed")
        await database_sync_to_async(_suspend)(world, world.a.tenant, active=True)
        back = await opened(world, world.a.member)
        connected, _ = await back.connect(timeout=5)
        expect(connected, "reactivated, A's member cannot open a socket")
        await back.disconnect()
        return f"open socket closed ({code}), new one refused ({refused}), operator's kept; reactivation restores"
    finally:
        await operator.disconnect()


# -- the proxy: keys come from its snapshot, reloaded when a tenant changes ---------------------------------------
def _proxy_status(world: SecurityWorld, key: str, model: str) -> int:
    return world.proxy_post(key, world.completion(model)).status_code


def _proxy_until(world: SecurityWorld, key: str, model: str, wanted: int, timeout_s: float = 10.0) -> int:
    deadline = time.monotonic() + timeout_s
    status = _proxy_status(world, key, model)
    while status != wanted and time.monotonic() < deadline:
        time.sleep(0.2)
        status = _proxy_status(world, key, model)
    return status


@security_case(
    "suspension.proxy_keys",
    "a suspended tenant's inference key keeps sending completions through the proxy",
    needs_proxy=True,
)
def proxy_keys(world: SecurityWorld) -> str:
    key, model = world.a.keys["inference"], world.a.endpoint.name
    expect(_proxy_status(world, key, model) == 200, "A's key is not served before: the case proves nothing")
    desired = Endpoint.objects.get(pk=world.a.endpoint.pk).desired_replicas
    try:
        _suspend(world, world.a.tenant)
        status = _proxy_until(world, key, model, 401)
        expect(status == 401, f"a suspended tenant's key still answered {status} after 10 s")
        other = _proxy_status(world, world.b.keys["inference"], world.b.endpoint.name)
        expect(other == 200, f"tenant B's key answered {other} meanwhile")
    finally:
        _suspend(world, world.a.tenant, active=True)
        Endpoint.objects.filter(pk=world.a.endpoint.pk).update(desired_replicas=desired)
    back = _proxy_until(world, key, model, 200)
    expect(back == 200, f"reactivated, A's key answered {back}")
    return "401 within the snapshot's reload, B unaffected; 200 again after reactivation"


# -- the autoscaler -------------------------------------------------------------------------------------------------
def _replica(endpoint, name: str, state: str, *, standby: bool = False) -> Replica:
    return Replica.objects.create(
        endpoint=endpoint, name=name, state=state, is_standby=standby, actuator="local", concurrency_limit=16
    )


def _decided(endpoint, *, demand: float) -> horizontal.HorizontalDecision:
    inputs = ticks.horizontal_inputs(Endpoint.objects.select_related("owner_tenant").get(pk=endpoint.pk),
                                           now=time.time())  # fmt: skip
    now = inputs.now
    busy = [
        DemandSample(t=now - s, in_flight=demand, queued=demand, in_flight_mu=demand * 50, queued_mu=demand * 50)
        for s in (0.0, 1.0, 2.0)
    ]
    return horizontal.decide(replace(inputs, samples=busy, demand_reported=True))


@security_case(
    "suspension.autoscaler_and_replicas",
    "a suspended tenant's endpoints keep scaling up on demand and their replicas keep running",
)
def autoscaler_and_replicas(world: SecurityWorld) -> str:
    hardware, model = simulated_profiles_get_or_create()
    endpoint = Endpoint.objects.create(
        name=f"{world.tag}-a-manual", owner_tenant=world.a.tenant, model_profile=model, hardware_profile=hardware,
        runtime=Runtime.SIM, min_replicas=2, max_replicas=8, desired_replicas=2, warm_pool_size=1,
        launch_options={"autoscale": False, "actuator": "local"}, concurrency_limit=4,
    )  # fmt: skip
    serving = [_replica(endpoint, f"{world.tag}-r{i}", ReplicaState.READY) for i in range(2)]
    standby = _replica(endpoint, f"{world.tag}-standby", ReplicaState.READY, standby=True)
    booting = _replica(endpoint, f"{world.tag}-booting", ReplicaState.STARTING)
    try:
        before = _decided(endpoint, demand=40.0)
        expect(before.desired > 2, f"demand did not scale up before: the case proves nothing ({before.reason})")
        _suspend(world, world.a.tenant)
        held = _decided(endpoint, demand=40.0)
        expect(held.desired == 0, f"a suspended tenant's endpoint decided {held.desired} replicas ({held.reason})")
        expect(endpoint.pk in autoscaled_endpoint_ids(), "the ticks skip the suspended endpoint (autoscale off)")
        signature("tenants.suspension_apply", args=[world.a.tenant.pk]).apply()  # what the commit enqueues
        states = {r.name: Replica.objects.get(pk=r.pk).state for r in (*serving, standby, booting)}
        drained = [r.name for r in (*serving, standby) if states[r.name] == ReplicaState.DRAINING]
        expect(len(drained) == 3, f"ready replicas were not drained (stopped mid-stream or left serving): {states}")
        expect(states[booting.name] == ReplicaState.STOPPED, f"a booting replica was left to start: {states}")
        expect(Replica.objects.filter(endpoint=endpoint).count() == 4, "something was launched")
        audited = AuditEntry.objects.filter(action="tenant.suspend_drain", tenant=world.a.tenant).exists()
        expect(audited, "the drain left no audit entry")
        _suspend(world, world.a.tenant, active=True)
        after = _decided(endpoint, demand=40.0)
        expect(after.desired >= 2, f"reactivated, the endpoint decided {after.desired} replicas ({after.reason})")
    finally:  # the decisions appended demand samples: leave no key behind for a rolled-back id
        store.client().delete(store.SAMPLES_KEY.format(endpoint_id=endpoint.pk))
    return (
        f"demand decided {before.desired} replicas, suspended {held.desired} ({held.reason}); 3 ready replicas "
        f"draining, the booting one stopped, nothing launched, audited; reactivated {after.desired}"
    )


@security_case(
    "suspension.operators_unaffected",
    "an operator linked to a tenant is suspended with it, or shared endpoints stop scaling",
)
def operators_unaffected(world: SecurityWorld) -> str:
    linked = User.objects.get(pk=world.operator.pk)
    linked.tenant = world.a.tenant  # a data slip: operators belong to no tenant, but the flag must not reach them
    linked.save(update_fields=["tenant"])
    _suspend(world, world.a.tenant)
    api = world.api(linked)
    expect(api.get("/api/v1/tenants/").status_code == 200, "an operator linked to a suspended tenant is refused")
    try:
        shared = _decided(world.shared, demand=40.0)
    finally:
        store.client().delete(store.SAMPLES_KEY.format(endpoint_id=world.shared.pk))
    expect(shared.desired > 0, f"the shared endpoint decided {shared.desired} ({shared.reason})")
    return f"operator's API works; the shared endpoint still scales to {shared.desired}"
