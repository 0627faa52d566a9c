"""billing.ingest: idempotent batched inserts, spooling while PostgreSQL is unreachable, draining when it returns."""

import asyncio
import time
import uuid

import pytest
import redis
from django.conf import settings

from billing.ingest import STREAM_KEY, Spool, UsageWriter, insert_records
from billing.models import UsageRecord
from tests.factories import ReplicaFactory
from tests.waiting import wait_for_async

pytestmark = pytest.mark.django_db(transaction=True)


def record(tenant_a, **over) -> dict:
    now = time.time()
    return {
        "request_id": "req-" + uuid.uuid4().hex,
        "tenant_id": tenant_a.tenant.pk,
        "api_key_id": tenant_a.key.pk,
        "endpoint_id": tenant_a.endpoint.pk,
        "replica_id": None,
        "priority": "standard",
        "input_tokens": 10,
        "cached_tokens": 0,
        "output_tokens": 5,
        "mu": 0.1,
        "queue_ms": 0.0,
        "ttft_ms": 12.0,
        "tpot_ms": 3.0,
        "e2e_ms": 30.0,
        "status": "ok",
        "slo_met": True,
        "started_at": now,
        "finished_at": now + 0.03,
        **over,
    }


@pytest.fixture
def spool_redis():
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(STREAM_KEY)
    yield client
    client.delete(STREAM_KEY)
    client.close()


def test_insert_is_idempotent_and_survives_dangling_links(tenant_a):
    recs = [record(tenant_a) for _ in range(3)]
    insert_records(recs)
    assert UsageRecord.objects.count() == 3
    insert_records(recs)  # re-delivery after a crash between insert and spool delete
    assert UsageRecord.objects.count() == 3
    replica = ReplicaFactory(endpoint=tenant_a.endpoint)
    dangling = record(tenant_a, replica_id=replica.pk)
    replica.delete()
    insert_records([dangling, record(tenant_a), recs[0]])
    assert UsageRecord.objects.count() == 5
    stored = UsageRecord.objects.get(request_id=dangling["request_id"])
    assert stored.replica_id is None and stored.tenant_id == tenant_a.tenant.pk
    assert abs(stored.finished_at.timestamp() - dangling["finished_at"]) < 1e-3  # unix seconds → aware datetime


def test_spool_to_redis_stream_then_file_and_drain_all(tenant_a, spool_redis, tmp_path):
    to_redis = [record(tenant_a) for _ in range(4)]
    spool = Spool(redis_url=settings.REDIS_URL, spool_dir=str(tmp_path))
    assert spool.put(to_redis) == "redis"
    # Redis down too (nothing listens on that port): the records go to a local file instead.
    dead = Spool(redis_url="redis://127.0.0.1:1/0", spool_dir=str(tmp_path))
    to_file = [record(tenant_a) for _ in range(3)]
    assert dead.put(to_file) == "file"
    assert list(tmp_path.glob("usage-*.jsonl"))
    assert spool.pending() == 7
    assert spool.drain() == 7
    assert spool.pending() == 0 and not list(tmp_path.iterdir())
    ids = {r["request_id"] for r in to_redis + to_file}
    assert UsageRecord.objects.filter(request_id__in=ids).count() == 7


def test_writer_spools_while_database_is_unreachable_and_drains_after(tenant_a, spool_redis, monkeypatch):
    from django.db import OperationalError

    import billing.ingest as ingest

    real_insert = ingest.insert_records
    down = {"value": True}

    def flaky_insert(records):
        if down["value"]:
            raise OperationalError("connection refused")
        return real_insert(records)

    monkeypatch.setattr(ingest, "insert_records", flaky_insert)

    async def scenario():
        writer = UsageWriter(flush_s=0.05, batch=10)
        writer.start()
        for _ in range(25):
            writer.submit(record(tenant_a))
            await asyncio.sleep(0.005)  # on purpose: the records arrive over several flushes, as traffic does
        await wait_for_async(lambda: writer.spooled_total == 25, timeout=10, message="25 records spooled")
        assert spool_redis.xlen(STREAM_KEY) == 25
        down["value"] = False
        for _ in range(5):
            writer.submit(record(tenant_a))
        # The writer's own loop (not close) drains the spool once PostgreSQL is back.
        await wait_for_async(
            lambda: writer.written == 5 and spool_redis.xlen(STREAM_KEY) == 0, timeout=10, message="spool drained"
        )
        await writer.close()

    asyncio.run(scenario())
    assert UsageRecord.objects.count() == 30
    assert spool_redis.xlen(STREAM_KEY) == 0
    tenant_a.key.refresh_from_db()
    assert tenant_a.key.last_used_at is not None, "written batches mark their keys as used"


@pytest.mark.e2e
@pytest.mark.slow
def test_no_usage_lost_while_postgres_is_stopped_and_restarted_during_traffic(procs, clean_redis, tenant_a):
    from django.db import connection

    from tests.proxy.conftest import TcpRelay, spawn_proxy, spawn_replica, subprocess_database_url
    from tests.proxy.helpers import chat_body, post, wait_for

    spawn_replica(procs, endpoint=tenant_a.endpoint, name="r1", speed=50.0)
    s = connection.settings_dict
    relay = TcpRelay(s["HOST"] or "127.0.0.1", int(s["PORT"] or 5432))
    try:
        db_url = subprocess_database_url().replace(f":{s['PORT'] or 5432}/", f":{relay.port}/")
        base = spawn_proxy(procs, db_url=db_url)
        body = chat_body(tenant_a.endpoint.name, max_tokens=3)
        ids = []
        for i in range(45):
            if i == 10:
                relay.cut()  # PostgreSQL is gone for the proxy: connections reset, new ones refused
            if i == 30:
                time.sleep(0.5)  # on purpose: the outage lasts a while after the last request in it
                relay.restore()
            r = post(base, tenant_a.raw_key, body)
            assert r.status_code == 200, r.text  # the data plane does not depend on the database
            ids.append(r.headers["x-request-id"])
            if 10 <= i < 30:
                time.sleep(0.05)  # on purpose: requests spread over the outage, not one burst
        wait_for(lambda: UsageRecord.objects.filter(request_id__in=ids).count() == 45, timeout=20)
        assert clean_redis.xlen(STREAM_KEY) == 0, "the spool is drained once PostgreSQL is back"
        assert UsageRecord.objects.count() == 45
    finally:
        relay.close()
