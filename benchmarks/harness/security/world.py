"""What the security cases attack: an operator and two tenants (A, B), each with an admin, a member, API keys of
every scope, its own endpoint with a reservation, a usage record and a webhook; a shared endpoint (no owner, no
reservation on it: every tenant's traffic there is best effort); a third tenant (C) with only an inference key and
no reservation anywhere; and, on first demand, a real proxy process (production settings, its own /metrics token)
in front of one simulated replica per endpoint.

The world is committed to the bench's database (a throwaway one, see ``benchmarks.operations.security``) because
the proxy is another process; names carry a random tag so two worlds never collide.
"""

from __future__ import annotations

import secrets
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field

import httpx
from django.utils import timezone
from rest_framework.test import APIClient

from billing.models import UsageRecord, Webhook
from capacity.runtimes.processes import ProcessGroup, child_django_env, free_port, sim_replica_argv, uvicorn_argv
from capacity.services import simulated_profiles_get_or_create
from endpoints.models import Endpoint, Replica, ReplicaState, Runtime
from gateway.proxy.config import ProxyConfig
from tenants.models import CapacityReservation, Role, Tenant, User
from tenants.services import api_key_create

# Raw keys by what they may do: the proxy ("inference"), read the API, write it, or everything.
KEY_SCOPES = {
    "inference": ["inference"],
    "read": ["read"],
    "write": ["read", "write"],
    "full": ["inference", "read", "write"],
}
# The bench's proxy runs with the shipped best-effort cap whatever the environment says, so cases can count on it.
BEST_EFFORT_MU_PER_MIN = ProxyConfig.best_effort_mu_per_min


@dataclass
class TenantSide:
    tenant: object
    admin: object
    member: object
    keys: dict[str, str]  # label (KEY_SCOPES) → raw key
    key_rows: dict[str, object]
    endpoint: object
    reservation: object
    usage: object
    webhook: object


@dataclass
class KeyOnlyTenant:
    """Tenant C: an inference key and nothing else; with no reservation anywhere, all its traffic is best effort."""

    tenant: object
    key: str


@dataclass
class SecurityWorld:
    tag: str
    operator: object
    a: TenantSide
    b: TenantSide
    shared: object = None  # an endpoint with no owner: every tenant may call it, none has a reservation on it
    c: KeyOnlyTenant | None = None
    metrics_token: str = field(default_factory=lambda: secrets.token_urlsafe(32), repr=False)
    replicas: dict = field(default_factory=dict)  # endpoint id -> its simulated replica's base URL
    procs: ProcessGroup = field(default_factory=ProcessGroup)
    _proxy_base: str | None = None
    _proxy_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)  # cases may call from threads

    # -- the REST API, through Django's test client and the real authentication ---------------------------------
    def api(self, who: object | str | None = None) -> APIClient:
        """A client acting as ``who``: a User (session login), a raw API key (Bearer), or None (anonymous)."""
        client = APIClient()
        if isinstance(who, str):
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {who}")
        elif who is not None:
            client.force_login(who)
        return client

    # -- the proxy ----------------------------------------------------------------------------------------------
    def proxy(self) -> str:
        """Base URL of a running proxy that serves both tenants' endpoints (started on first call)."""
        with self._proxy_lock:
            if self._proxy_base is None:
                self._proxy_base = self._start_proxy()
        return self._proxy_base

    def proxy_post(self, key: str | None, body: dict, *, headers: dict | None = None, path: str = "/v1/completions"):
        h = dict(headers or {})
        if key is not None:
            h["Authorization"] = f"Bearer {key}"
        return httpx.post(self.proxy() + path, json=body, headers=h, timeout=30)

    def completion(self, model: str, **extra) -> dict:
        return {"model": model, "prompt": "security bench says hello", "max_tokens": 4, **extra}

    def received(self, endpoint) -> list[dict]:
        """What the endpoint's replica engine was asked for, oldest first (the simulator's ``/admin/received``:
        request_id, priority, cache_salt and the body's field names of each request it accepted)."""
        self.proxy()
        response = httpx.get(self.replicas[endpoint.pk] + "/admin/received", timeout=10)
        response.raise_for_status()
        return response.json()["received"]

    def _start_proxy(self) -> str:
        endpoints = [self.a.endpoint, self.b.endpoint] + ([self.shared] if self.shared is not None else [])
        for endpoint in endpoints:
            port = free_port()
            self.procs.spawn(sim_replica_argv(port, speed=20.0, served_model_name=endpoint.name), port=port)
            self.replicas[endpoint.pk] = f"http://127.0.0.1:{port}"
            Replica.objects.create(
                endpoint=endpoint,
                name=f"{endpoint.name}-r0",
                url=self.replicas[endpoint.pk],
                state=ReplicaState.READY,
                concurrency_limit=16,
            )
        port = free_port()
        self.procs.spawn(uvicorn_argv("config.asgi:application", port), env=self._proxy_env(), port=port, timeout=60)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:  # serving once its snapshot holds the world and a replica answers
            try:
                response = httpx.post(
                    base + "/v1/completions",
                    json=self.completion(self.a.endpoint.name),
                    headers={"Authorization": f"Bearer {self.a.keys['inference']}"},
                    timeout=10,
                )
                if response.status_code == 200:
                    return base
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the proxy did not serve tenant A's endpoint within 30 s")
            time.sleep(0.2)

    def _proxy_env(self, **overrides: str) -> dict[str, str]:
        return child_django_env(
            "config.settings.production",
            **{
                "DJANGO_SECRET_KEY": secrets.token_urlsafe(48),
                "DJANGO_SECURE_SSL_REDIRECT": "0",
                "INFERCAP_QUIET": "1",
                "INFERCAP_SNAPSHOT_POLL_S": "0.1",
                "INFERCAP_METRICS_TOKEN": self.metrics_token,
                "INFERCAP_PROXY_BEST_EFFORT_MU_PER_MIN": str(BEST_EFFORT_MU_PER_MIN),
                **overrides,
            },
        )

    def other_proxy(self, **env: str) -> tuple[str, subprocess.Popen]:
        """Another proxy process over the same world, its environment overridden by ``env`` (say, no metrics
        token); the caller stops it with ``world.procs.kill(proc)``."""
        port = free_port()
        proc = self.procs.spawn(
            uvicorn_argv("config.asgi:application", port), env=self._proxy_env(**env), port=port, timeout=60
        )
        return f"http://127.0.0.1:{port}", proc

    def close(self) -> None:
        self.procs.kill_all()


def world_create() -> SecurityWorld:
    """Seed (and commit) the world; the caller runs on a database it may write to."""
    tag = f"sec-{uuid.uuid4().hex[:6]}"
    operator = User.objects.create_user(username=f"{tag}-operator", password=secrets.token_urlsafe(16))
    operator.role = Role.OPERATOR
    operator.save(update_fields=["role"])
    return SecurityWorld(
        tag=tag,
        operator=operator,
        a=_tenant_side(tag, "a"),
        b=_tenant_side(tag, "b"),
        shared=_shared_endpoint(tag),
        c=_key_only_tenant(tag, "c"),
    )


def _shared_endpoint(tag: str):
    hardware, model = simulated_profiles_get_or_create()
    return Endpoint.objects.create(
        name=f"{tag}-shared-model",
        owner_tenant=None,
        model_profile=model,
        hardware_profile=hardware,
        runtime=Runtime.SIM,
        concurrency_limit=16,
        concurrency_max=16,
    )


def _key_only_tenant(tag: str, letter: str) -> KeyOnlyTenant:
    name = f"{tag}-{letter}"
    tenant = Tenant.objects.create(name=f"Security {name}", slug=name)
    _, key = api_key_create(tenant=tenant, name=f"{name} inference", scopes=KEY_SCOPES["inference"])
    return KeyOnlyTenant(tenant=tenant, key=key)


def _tenant_side(tag: str, letter: str) -> TenantSide:
    name = f"{tag}-{letter}"
    tenant = Tenant.objects.create(name=f"Security {name}", slug=name)
    admin = User.objects.create_user(
        username=f"{name}-admin", password=secrets.token_urlsafe(16), tenant=tenant, role=Role.TENANT_ADMIN
    )
    member = User.objects.create_user(
        username=f"{name}-member", password=secrets.token_urlsafe(16), tenant=tenant, role=Role.TENANT_MEMBER
    )
    keys, key_rows = {}, {}
    for label, scopes in KEY_SCOPES.items():
        key_rows[label], keys[label] = api_key_create(tenant=tenant, name=f"{name} {label}", scopes=scopes)
    hardware, model = simulated_profiles_get_or_create()
    endpoint = Endpoint.objects.create(
        name=f"{name}-model",
        owner_tenant=tenant,
        model_profile=model,
        hardware_profile=hardware,
        runtime=Runtime.SIM,
        concurrency_limit=16,
        concurrency_max=16,
    )
    reservation = CapacityReservation.objects.create(tenant=tenant, endpoint=endpoint, mu_per_min=1e6)
    now = timezone.now()
    usage = UsageRecord.objects.create(
        request_id=f"{name}-usage-1", tenant=tenant, endpoint=endpoint, status="ok", started_at=now, finished_at=now
    )
    webhook = Webhook.objects.create(name=f"{name} pager", url=f"https://{name}.hooks.example/alerts", tenant=tenant)
    return TenantSide(
        tenant=tenant,
        admin=admin,
        member=member,
        keys=keys,
        key_rows=key_rows,
        endpoint=endpoint,
        reservation=reservation,
        usage=usage,
        webhook=webhook,
    )
