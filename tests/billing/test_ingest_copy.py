"""billing.ingest on PostgreSQL: a batch is COPied into a per-session staging table and inserted from there with
``ON CONFLICT DO NOTHING``. Records given by column or field name, duplicates inside one batch and across batches,
a dangling link and a caller's own transaction must all store each request exactly once (a dangling link is found
at commit, as the foreign keys are deferred: in the writer thread, which commits each batch)."""

import asyncio
import time
import uuid

import pytest
from django.db import connection, transaction

from billing.ingest import STAGING_TABLE, KeyTouches, UsageWriter, insert_records
from billing.models import UsageRecord
from tenants.models import ApiKey
from tests.factories import ReplicaFactory

pytestmark = pytest.mark.django_db(transaction=True)


def record(tenant_a, **over) -> dict:
    now = time.time()
    return {
        "request_id": "copy-" + uuid.uuid4().hex,
        "tenant_id": tenant_a.tenant.pk,
        "endpoint_id": tenant_a.endpoint.pk,
        "status": "ok",
        "input_tokens": 7,
        "output_tokens": 3,
        "started_at": now,
        "finished_at": now + 0.5,
        **over,
    }


def test_a_batch_with_duplicates_stores_each_request_once_with_the_fields_defaults(tenant_a):
    by_field = record(tenant_a, tenant=tenant_a.tenant, endpoint=tenant_a.endpoint)
    del by_field["tenant_id"], by_field["endpoint_id"]
    batch = [record(tenant_a) for _ in range(50)] + [by_field]
    insert_records(batch + batch[:10])  # re-delivered inside the same batch
    insert_records(batch[5:20])  # and in a later one
    assert UsageRecord.objects.count() == 51
    stored = UsageRecord.objects.get(request_id=by_field["request_id"])
    assert (stored.tenant_id, stored.endpoint_id) == (tenant_a.tenant.pk, tenant_a.endpoint.pk)
    assert stored.degradation == "" and stored.priority == "standard" and stored.created_at is not None
    assert abs(stored.finished_at.timestamp() - by_field["finished_at"]) < 1e-3


def test_batches_inside_a_callers_transaction_each_leave_the_staging_table_empty(tenant_a):
    first, second = [record(tenant_a) for _ in range(5)], [record(tenant_a) for _ in range(3)]
    with transaction.atomic():
        insert_records(first)
        insert_records(second + first[:2])
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT count(*) FROM {STAGING_TABLE}")
            assert cursor.fetchone()[0] == 0
    assert UsageRecord.objects.count() == 8


def test_a_dangling_link_falls_back_to_one_record_at_a_time(tenant_a):
    replica = ReplicaFactory(endpoint=tenant_a.endpoint)
    gone = replica.pk
    replica.delete()
    dangling = record(tenant_a, replica_id=gone)
    insert_records([dangling, record(tenant_a), record(tenant_a)])
    assert UsageRecord.objects.count() == 3
    assert UsageRecord.objects.get(request_id=dangling["request_id"]).replica_id is None


def test_a_record_naming_an_unknown_field_is_refused_as_before(tenant_a):
    with pytest.raises(TypeError):
        insert_records([record(tenant_a, no_such_field=1)])
    assert not UsageRecord.objects.exists()


def test_close_right_after_a_full_batch_returns_and_stores_it(tenant_a):
    # A full batch wakes the writer as close() cancels it: the cancel alone could be swallowed and close() hang.
    records = [record(tenant_a) for _ in range(12)]

    async def submit_then_close():
        writer = UsageWriter(batch=5, redis_url="")
        writer.start()
        for item in records:
            writer.submit(item)
        await asyncio.sleep(0)
        started = time.perf_counter()
        await asyncio.wait_for(writer.close(), timeout=10)
        return writer.written, time.perf_counter() - started

    written, close_s = asyncio.run(submit_then_close())
    assert written == 12 and close_s < 5
    assert UsageRecord.objects.filter(request_id__in=[r["request_id"] for r in records]).count() == 12


def test_a_keys_last_used_at_is_written_at_most_once_per_interval(db, tenant_a):
    """Every flush wrote an UPDATE of its keys' ``last_used_at``; now a key is touched when it was not within
    ``every_s`` on this writer's clock, and a batch of keys that were all touched sends nothing."""
    now = [100.0]
    touches = KeyTouches(every_s=30.0, clock=lambda: now[0])
    batch = [{"api_key_id": tenant_a.key.pk}, {"api_key_id": None}]
    touches.touch(batch)
    first = ApiKey.objects.get(pk=tenant_a.key.pk).last_used_at
    assert first is not None and touches.updates == 1
    now[0] += 29.0
    touches.touch(batch)
    assert touches.updates == 1, "touched 29 s ago: no UPDATE"
    now[0] += 1.0
    touches.touch(batch)
    assert touches.updates == 2 and ApiKey.objects.get(pk=tenant_a.key.pk).last_used_at > first
