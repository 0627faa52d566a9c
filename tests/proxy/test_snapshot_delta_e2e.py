"""Key changes through a live proxy process without reading every key again (docs/request-path.md, "The key
table"): a created key serves, a revoked one is refused within a second, a deactivated tenant's keys are refused,
with the proxy's full-read counter unmoved; with Redis unreachable the poll picks the changes up from PostgreSQL."""

import re
import time

import httpx
import pytest
from django.conf import settings

from tenants.services import api_key_create, api_key_revoke, tenant_update
from tests.proxy.conftest import TcpRelay, free_port, spawn_replica, subprocess_database_url, uvicorn_argv
from tests.proxy.helpers import METRICS_AUTH, chat_body, post, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def _loads(base: str) -> dict[str, float]:
    text = httpx.get(base + "/metrics", headers=METRICS_AUTH).text
    return {
        kind: float(n) for kind, n in re.findall(r'infercap_proxy_snapshot_loads_total\{kind="(\w+)"\} (\S+)', text)
    }


def _proxy(procs, redis_url: str, **env) -> str:
    port = free_port()
    procs.spawn(
        uvicorn_argv("config.asgi:application", port),
        env={
            "DJANGO_SETTINGS_MODULE": "config.settings.test",
            "DATABASE_URL": subprocess_database_url(),
            "REDIS_URL": redis_url,
            "INFERCAP_SNAPSHOT_POLL_S": "0.1",
            **env,
        },
        port=port,
    )
    return f"http://127.0.0.1:{port}"


def _refused_within(base: str, raw: str, model: str, seconds: float) -> None:
    started = time.monotonic()
    wait_for(lambda: post(base, raw, chat_body(model, max_tokens=2)).status_code == 401, timeout=3, interval=0.02)
    assert time.monotonic() - started < seconds


def test_key_changes_reach_the_live_proxy_without_reading_every_key(procs, clean_redis, tenant_a, tenant_b):
    spawn_replica(procs, endpoint=tenant_a.endpoint, name="r1")
    base = _proxy(procs, settings.REDIS_URL)
    model = tenant_a.endpoint.name
    assert post(base, tenant_a.raw_key, chat_body(model, max_tokens=2)).status_code == 200
    assert _loads(base).get("all") == 1.0  # the start-up read

    key, raw = api_key_create(tenant=tenant_a.tenant, name="new")
    wait_for(lambda: post(base, raw, chat_body(model, max_tokens=2)).status_code == 200, timeout=3, interval=0.02)
    api_key_revoke(api_key=key)
    _refused_within(base, raw, model, 1.0)
    tenant_update(tenant=tenant_a.tenant, is_active=False)
    _refused_within(base, tenant_a.raw_key, model, 1.0)
    loads = _loads(base)
    assert loads.get("all") == 1.0, "no key change made the proxy read every key again"
    assert loads.get("keys", 0) >= 3


def test_a_change_while_redis_is_unreachable_is_picked_up_by_the_poll(procs, clean_redis, tenant_a):
    spawn_replica(procs, endpoint=tenant_a.endpoint, name="r1")
    port = int(settings.REDIS_URL.rsplit(":", 1)[1].split("/")[0])
    relay = TcpRelay("127.0.0.1", port)
    try:
        database = settings.REDIS_URL.rsplit("/", 1)[1]
        base = _proxy(
            procs, f"redis://127.0.0.1:{relay.port}/{database}", INFERCAP_PROXY_SNAPSHOT_FALLBACK_RELOAD_S="0.5"
        )
        model = tenant_a.endpoint.name
        assert post(base, tenant_a.raw_key, chat_body(model, max_tokens=2)).status_code == 200
        relay.cut()  # the proxy's Redis is away; this process's still takes the (unheard) bumps
        key, raw = api_key_create(tenant=tenant_a.tenant, name="made while Redis was away")
        wait_for(lambda: post(base, raw, chat_body(model, max_tokens=2)).status_code == 200, timeout=10)
        api_key_revoke(api_key=key)
        _refused_within(base, raw, model, 3.0)
        loads = _loads(base)
        assert loads.get("all") == 1.0 and loads.get("check", 0) >= 1
    finally:
        relay.close()
