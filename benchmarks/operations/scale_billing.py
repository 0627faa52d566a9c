"""``bench scale``'s billing loops, one size at a time: the burn-rate and rollup tick over a history of usage rows,
usage ingestion through the proxy's ``UsageWriter``, and the month's cost report and statements of many tenants.

Each size but ingestion runs in a transaction rolled back after it, so sizes never see each other's rows; the
ingestion writer inserts on its own thread and connection, so its rows are committed and deleted after.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import replace
from datetime import timedelta

from django.db import connection, transaction
from django.utils import timezone

from benchmarks.billing import slo as slo_bench
from benchmarks.operations.scale_rows import analyze, cpu_seconds, insert_series, timed, timed_cpu
from billing.alerts import slo_evaluate_all
from billing.cost import cost_lines
from billing.ingest import UsageWriter
from billing.models import UsageDay, UsageHour, UsageRecord
from billing.rollups import usage_rollup_run
from billing.statements import statement_for
from capacity.models import HardwareProfile, ModelProfile
from endpoints.models import Endpoint, Replica, ReplicaState
from tenants.models import ApiKey, Tenant

# The burn-rate tick's rows per SLO: the goal's 100 M rows for 10,000 SLOs, and 100 in quick (10,000 SLOs at 1 M).
ROWS_PER_SLO = {"full": 10_000, "quick": 100}
SLOS_PER_ENDPOINT = 10
BURN_TENANTS = 20
NEW_ROWS_EVERY = "%(now)s - random() * interval '60 seconds'"  # one minute of new traffic before each tick


def burn_tick(slos: int, *, rows_per_slo: int, progress) -> dict:
    """Seconds of one steady tick (roll up the last minute's rows, then evaluate every SLO) over ``slos`` SLOs and
    ``slos × rows_per_slo`` usage rows of 3 days; the backfill rollup and the first tick beside it."""
    rows = slos * rows_per_slo
    with transaction.atomic():
        world = slo_bench._make_world(max(2, slos // SLOS_PER_ENDPOINT), BURN_TENANTS)
        generate_s = slo_bench._generate(world, rows, lambda message: None)
        backfill_s, _ = timed(usage_rollup_run, now=world.now)
        analyze(UsageRecord)
        slo_bench._make_slos(slos, world.endpoints, world.tenants, world.pairs)
        per_minute = max(10, rows // (3 * 24 * 60))
        ticks = []
        for tick in range(3):  # the first settles the alerts the history opens; the later ones are steady
            now = world.now + timedelta(minutes=tick + 1)
            with connection.cursor() as cursor:
                slo_bench._insert(
                    cursor,
                    replace(world, now=now),
                    finished_at=NEW_ROWS_EVERY,
                    prefix=f"bench-scale-{world.stamp}-t{tick}-",
                    first=1,
                    last=per_minute,
                )
            rollup_s, rollup_cpu, _ = timed_cpu(usage_rollup_run, now=now)
            _, evaluate_cpu, evaluated = timed_cpu(slo_evaluate_all, now=now + timedelta(seconds=5))
            ticks.append((rollup_s + evaluated.seconds, rollup_s, evaluated.seconds, rollup_cpu + evaluate_cpu))
        transaction.set_rollback(True)
    steady = min(ticks[1:])
    progress(
        f"  burn tick: {slos:,} SLOs over {rows:,} rows: {steady[0]:.2f} s a tick (rollup {steady[1]:.2f} s, "
        f"evaluation {steady[2]:.2f} s); backfill {backfill_s:.1f} s, generation {generate_s:.1f} s"
    )
    return {
        "seconds": steady[0],
        "cpu_s": round(steady[3], 3),
        "rows": rows,
        "rollup_s": round(steady[1], 3),
        "evaluate_s": round(steady[2], 3),
        "first_tick_s": round(ticks[0][0], 3),
        "backfill_s": round(backfill_s, 2),
    }


# -- ingestion -------------------------------------------------------------------------------------------------
DUPLICATE_EVERY = 100  # one record in a hundred is delivered twice, as a spool drained after a crash re-delivers
SUBMIT_CHUNK = 1000


def ingestion(records: int, *, progress) -> dict:
    """``records`` usage records submitted to a ``UsageWriter`` as fast as the event loop allows (plus 1 %
    re-delivered), until the writer has flushed the last; then counted in PostgreSQL."""
    tenant, endpoint, key = _ingest_world()
    prefix = f"scale-ingest-{uuid.uuid4().hex[:8]}-"
    try:
        elapsed, written, cpu_s = asyncio.run(_ingest(records, prefix, tenant.pk, endpoint.pk, key.pk))
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*), count(DISTINCT request_id), coalesce(sum(output_tokens), 0) "
                "FROM billing_usagerecord WHERE request_id LIKE %s",
                [prefix + "%"],
            )
            stored, distinct, tokens = cursor.fetchone()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM billing_usagerecord WHERE request_id LIKE %s", [prefix + "%"])
        Endpoint.objects.filter(pk=endpoint.pk).delete()
        tenant.delete()
    lost, duplicated = records - distinct, stored - distinct
    rate = records / elapsed
    progress(
        f"  ingestion: {records:,} records in {elapsed:.2f} s ({rate:,.0f}/s; {records / cpu_s:,.0f} per CPU-second "
        f"of this process and its PostgreSQL backends); lost {lost}, duplicated {duplicated}, output tokens "
        f"{'match' if tokens == records * 7 else 'DIFFER'}"
    )
    return {
        "seconds": elapsed,
        "cpu_s": round(cpu_s, 3),
        "records_per_s": round(rate),
        "records_per_cpu_s": round(records / cpu_s),
        "lost": lost,
        "duplicated": duplicated,
        "tokens_match": tokens == records * 7,
        "records_written": written,
    }


def _ingest_world():
    tenant = Tenant.objects.create(
        name=f"scale ingest {uuid.uuid4().hex[:6]}", slug=f"scale-ingest-{uuid.uuid4().hex[:8]}"
    )
    hardware, model = _profiles()
    endpoint = Endpoint.objects.create(
        name=f"scale-ingest-{uuid.uuid4().hex[:8]}", model_profile=model, hardware_profile=hardware
    )
    key = ApiKey.objects.create(tenant=tenant, name="scale", prefix=uuid.uuid4().hex[:12], key_hash=uuid.uuid4().hex)
    return tenant, endpoint, key


async def _ingest(
    records: int, prefix: str, tenant_id: int, endpoint_id: int, key_id: int
) -> tuple[float, int, float]:
    """Seconds until the last record is stored, records written, CPU seconds (this process and its backends)."""
    database = connection.settings_dict["NAME"]
    cpu_before = cpu_seconds(database)
    writer = UsageWriter()
    writer.start()
    started = time.perf_counter()
    for first in range(0, records, SUBMIT_CHUNK):
        now = time.time()
        for i in range(first, min(records, first + SUBMIT_CHUNK)):
            record = _record(prefix, i, now, tenant_id, endpoint_id, key_id)
            writer.submit(record)
            if i % DUPLICATE_EVERY == 0:
                writer.submit(dict(record))
        await asyncio.sleep(0)  # the proxy's loop serves requests between records: the writer's flush runs too
    await writer.flush()  # after any flush in progress (one writer thread): every record is stored
    elapsed = time.perf_counter() - started
    cpu_s = cpu_seconds(database) - cpu_before  # before close() ends the writer's backend
    await writer.close()
    return elapsed, writer.written, cpu_s


def _record(prefix: str, i: int, now: float, tenant_id: int, endpoint_id: int, key_id: int) -> dict:
    """A record shaped as the proxy's ``usage_record``."""
    return {
        "request_id": f"{prefix}{i}",
        "tenant_id": tenant_id,
        "api_key_id": key_id,
        "endpoint_id": endpoint_id,
        "replica_id": None,
        "priority": "standard",
        "input_tokens": 500,
        "cached_tokens": 100,
        "output_tokens": 7,
        "mu": 1.234567,
        "queue_ms": 1.5,
        "ttft_ms": 180.25,
        "tpot_ms": 22.5,
        "e2e_ms": 315.0,
        "status": "ok",
        "slo_met": True,
        "degradation": "",
        "adapter": "",
        "adapter_load_mu": 0.0,
        "platform_prompt_tokens": 0,
        "requested_endpoint_id": endpoint_id,
        "started_at": now - 0.3,
        "finished_at": now,
    }


# -- cost reports and statements -------------------------------------------------------------------------------
ENDPOINTS_PER_TENANT = 3  # each tenant uses three endpoints; ten tenants share each endpoint
TENANTS_PER_ENDPOINT = 10
REPLICAS_PER_ENDPOINT = 2


def cost_reports(tenants: int, *, progress) -> dict:
    """The month's cost report (every endpoint and tenant line) and one statement per tenant, over 30 days of hour
    and day rollups; seconds of both together."""
    with transaction.atomic():
        end = timezone.now().replace(hour=0, minute=0, second=0, microsecond=0)
        start = end - timedelta(days=30)
        tenant_rows, endpoint_ids = _cost_world(tenants, start)
        report_s, report_cpu, lines = timed_cpu(
            cost_lines, start=start, end=end, now=timezone.now(), split_usage_by_record=False
        )
        statements_s, statements_cpu, billed = timed_cpu(
            lambda: sum(1 for t in tenant_rows if statement_for(tenant=t, start=start, end=end).lines)
        )
        transaction.set_rollback(True)
    progress(
        f"  cost: {tenants:,} tenants on {len(endpoint_ids):,} endpoints: report {report_s:.2f} s ({len(lines):,} "
        f"lines), statements {statements_s:.2f} s ({billed:,} with lines)"
    )
    return {
        "seconds": report_s + statements_s,
        "cpu_s": round(report_cpu + statements_cpu, 3),
        "report_s": round(report_s, 3),
        "statements_s": round(statements_s, 3),
        "lines": len(lines),
    }


def _cost_world(tenants: int, start) -> tuple[list[Tenant], list[int]]:
    hardware, model = _profiles()
    stamp = uuid.uuid4().hex[:8]
    n_endpoints = max(ENDPOINTS_PER_TENANT, tenants * ENDPOINTS_PER_TENANT // TENANTS_PER_ENDPOINT)
    tenant_rows = Tenant.objects.bulk_create(
        Tenant(name=f"scale cost {stamp} {i}", slug=f"scale-cost-{stamp}-{i}") for i in range(tenants)
    )
    endpoints = Endpoint.objects.bulk_create(
        Endpoint(name=f"scale-cost-{stamp}-{i}", model_profile=model, hardware_profile=hardware)
        for i in range(n_endpoints)
    )
    Replica.objects.bulk_create(
        Replica(endpoint=e, name=f"r{j}", url=f"http://10.0.0.{j}:8000", state=ReplicaState.READY)
        for e in endpoints
        for j in range(REPLICAS_PER_ENDPOINT)
    )
    Replica.objects.filter(endpoint__in=endpoints).update(state_changed_at=start - timedelta(days=1))
    # Pair p = 3i + k (k < 3) is tenant i on endpoint p mod E: each tenant on three endpoints, a row per hour and day.
    params = {
        "tenants": [t.pk for t in tenant_rows],
        "endpoints": [e.pk for e in endpoints],
        "n_t": tenants,
        "n_e": n_endpoints,
        "per": ENDPOINTS_PER_TENANT,
        "start": start,
    }
    pair = "(g - 1) %% (%(n_t)s * %(per)s)"
    for model_, step, buckets in ((UsageHour, "1 hour", 30 * 24), (UsageDay, "1 day", 30)):
        insert_series(
            model_,
            tenants * ENDPOINTS_PER_TENANT * buckets,
            {
                "tenant_id": f"(%(tenants)s::bigint[])[1 + {pair} / %(per)s]",
                "endpoint_id": f"(%(endpoints)s::bigint[])[1 + {pair} %% %(n_e)s]",
                "start": f"%(start)s + interval '{step}' * ((g - 1) / (%(n_t)s * %(per)s))",
                "requests": "100",
                "ok": "99",
                "good": "98",
                "input_tokens": "50000",
                "output_tokens": "20000",
                "good_output_tokens": "19600",
                "mu": "240.0",
            },
            params,
        )
    analyze(UsageHour, UsageDay)
    return tenant_rows, [e.pk for e in endpoints]


def _profiles() -> tuple[HardwareProfile, ModelProfile]:
    hardware, _ = HardwareProfile.objects.get_or_create(
        name="bench-scale-hw",
        defaults={"gpu_type": "H100", "gpu_memory_gb": 80, "memory_bandwidth_gbps": 3350, "usd_per_gpu_hour": 3.0},
    )
    model, _ = ModelProfile.objects.get_or_create(
        name="bench-scale-model",
        defaults={"parameters_b": 13, "n_layers": 40, "n_kv_heads": 8, "d_head": 128, "weights_gb": 26},
    )
    return hardware, model
