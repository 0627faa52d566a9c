"""The endpoint page's adapters per replica and load churn, from the proxies' LoRA reports in Redis
(docs/lora.md#the-console): operators see every name; a tenant on a shared endpoint sees its own and the shared
adapters by name, another tenant's private adapter only as a count."""

import json
import time

import pytest
from django.urls import reverse

from console.adapter_churn import CHURN_WINDOW_MINUTES, LORA_REPORT_KEY, merge_reports
from console.live import redis_client
from endpoints.models import Adapter, ReplicaState
from gateway.proxy.replica_adapters import ReplicaAdapters, lora_report
from tests.adapter_artifacts import LORA_OPTIONS
from tests.factories import EndpointFactory, ReplicaFactory, ReservationFactory

pytestmark = pytest.mark.django_db


def _minute(now: float, ago: int = 0) -> str:
    return str(int(now // 60) - ago)


@pytest.fixture
def shared_lora(tenant_a, tenant_b, clean_redis):
    redis_client.cache_clear()
    endpoint = EndpointFactory(name="shared-lora", launch_options=LORA_OPTIONS)
    for tenant in (tenant_a.tenant, tenant_b.tenant):
        ReservationFactory(tenant=tenant, endpoint=endpoint, mu_per_min=100.0)
    Adapter.objects.create(
        name="a-support-ft", owner_tenant=tenant_a.tenant, endpoint=endpoint, rank=8, artifact_path="a"
    )
    Adapter.objects.create(
        name="b-secret-ft", owner_tenant=tenant_b.tenant, endpoint=endpoint, rank=8, artifact_path="b"
    )
    Adapter.objects.create(name="shared-sql-ft", endpoint=endpoint, rank=8, artifact_path="s")
    r1 = ReplicaFactory(endpoint=endpoint, name="r1", state=ReplicaState.READY)
    r2 = ReplicaFactory(endpoint=endpoint, name="r2", state=ReplicaState.READY)
    now = time.time()
    # Two proxy processes: one holds r1's adapters and made 6 loads there (4 now, 2 a minute ago, 7 outside the
    # window); the other loaded one more on r1 and nothing on r2.
    first = {"t": now, "replicas": {str(r1.pk): {"held": ["a-support-ft", "b-secret-ft", "shared-sql-ft"],
             "loads": {_minute(now): 4, _minute(now, 1): 2, _minute(now, CHURN_WINDOW_MINUTES): 7}}}}  # fmt: skip
    second = {"t": now, "replicas": {str(r1.pk): {"held": ["b-secret-ft"], "loads": {_minute(now): 1}},
              str(r2.pk): {"held": ["b-secret-ft"], "loads": {}}}}  # fmt: skip
    key = LORA_REPORT_KEY.format(endpoint_id=endpoint.pk)
    clean_redis.hset(key, mapping={"proc-1": json.dumps(first), "proc-2": json.dumps(second)})
    return endpoint


def _rows(page: str) -> dict[str, str]:
    rows = {}
    for chunk in page.split('<tr data-replica="')[1:]:
        rows[chunk.split('"', 1)[0]] = chunk.split("</tr>", 1)[0]
    return rows


def test_operator_sees_every_adapter_per_replica_and_its_load_churn(client, operator, shared_lora):
    client.force_login(operator)
    page = client.get(reverse("console:endpoint", args=[shared_lora.pk])).content.decode()
    r1, r2 = (str(r.pk) for r in shared_lora.replicas.order_by("name"))
    rows = _rows(page)
    assert "a-support-ft, b-secret-ft, shared-sql-ft</td>" in rows[r1]
    assert "1.4 <small>(7 in 5 min)</small>" in rows[r1]  # (4 + 2 + 1) / 5 minutes; the 7 older loads are out
    assert "b-secret-ft</td>" in rows[r2] and "0.0 <small>(0 in 5 min)</small>" in rows[r2]


def test_a_tenant_sees_its_own_and_shared_adapter_names_and_others_only_as_a_count(client, tenant_a, shared_lora):
    client.force_login(tenant_a.member)
    page = client.get(reverse("console:endpoint", args=[shared_lora.pk])).content.decode()
    assert "b-secret-ft" not in page
    r1, r2 = (str(r.pk) for r in shared_lora.replicas.order_by("name"))
    rows = _rows(page)
    assert "a-support-ft, shared-sql-ft, 1 other</td>" in rows[r1]
    assert ">1 other</td>" in rows[r2]
    assert "1.4 <small>(7 in 5 min)</small>" in rows[r1]


def test_without_lora_or_without_reports_the_page_says_so(client, operator, shared_lora, tenant_a):
    plain = EndpointFactory(name="plain")
    ReplicaFactory(endpoint=plain, state=ReplicaState.READY)
    client.force_login(operator)
    assert "Loads/min" not in client.get(reverse("console:endpoint", args=[plain.pk])).content.decode()
    extra = ReplicaFactory(endpoint=shared_lora, name="r3", state=ReplicaState.READY)
    rows = _rows(client.get(reverse("console:endpoint", args=[shared_lora.pk])).content.decode())
    assert "no report" in rows[str(extra.pk)]


def test_stale_reports_drop_held_adapters_but_keep_their_loads():
    now = 1_000_000.0
    stale = {"t": now - 120, "replicas": {"7": {"held": ["x"], "loads": {_minute(now, 1): 3}}}}
    fresh = {"t": now, "replicas": {"7": {"held": ["y"], "loads": {}}}}
    merged = merge_reports([json.dumps(stale), json.dumps(fresh), "not json"], now_s=now)
    assert merged == {"7": ({"y"}, 3)}


def test_the_proxys_report_counts_loads_per_minute_and_forgets_old_minutes():
    adapters = ReplicaAdapters()
    adapters.last_used["a"] = 1.0
    for at in (60.0, 61.0, 125.0, 60.0 * 30):
        adapters.note_load(at)
    report = lora_report({"12": adapters}, 60.0 * 30)
    assert report["replicas"]["12"] == {"held": ["a"], "loads": {"30": 1}}  # minutes 1 and 2 left the window
    adapters = ReplicaAdapters()
    adapters.note_load(60.0)
    adapters.note_load(61.0)
    assert lora_report({"3": adapters}, 61.0)["replicas"]["3"]["loads"] == {"1": 2}


def test_every_proxy_process_publishes_its_lora_report_beside_its_demand():
    import asyncio
    from types import SimpleNamespace

    from gateway.proxy.state import ProxyState

    written: dict = {}

    class Pipeline:
        def hset(self, key, field, value):
            written.setdefault(key, {})[field] = json.loads(value)

        def expire(self, key, ttl):
            pass

        async def execute(self):
            pass

    held = ReplicaAdapters()
    held.last_used["lora-t1-7-0a1b2c3d4e5f"] = 1.0  # replicas hold adapters under their engine names
    held.note_load(time.time())
    proxy = ProxyState.__new__(ProxyState)  # only what the publishing loop reads
    names = {"lora-t1-7-0a1b2c3d4e5f": "a-support-ft"}
    proxy.runtimes = {
        1: SimpleNamespace(adapters={"5": held}, demand=lambda: {"queued": 0}, engine_adapter_names=lambda: names),
        2: SimpleNamespace(adapters={}, demand=lambda: {"queued": 0}, engine_adapter_names=dict),  # no LoRA
    }
    proxy.redis = SimpleNamespace(pipeline=lambda transaction=False: Pipeline())
    proxy.config, proxy.process_id = SimpleNamespace(demand_interval_s=0.01), "proc-1"

    async def one_cycle():
        task = asyncio.create_task(proxy._publish_demand())
        await asyncio.sleep(0.05)
        task.cancel()

    asyncio.run(one_cycle())
    assert set(written) == {"infercap:demand:1", "infercap:demand:2", LORA_REPORT_KEY.format(endpoint_id=1)}
    report = written[LORA_REPORT_KEY.format(endpoint_id=1)]["proc-1"]
    assert report["replicas"]["5"]["held"] == ["a-support-ft"] and sum(report["replicas"]["5"]["loads"].values()) == 1
