"""The rollup adds each run's new records to their minute, hour and day rows: the tiers must equal a full recompute
from raw usage over the same records, with late records, re-delivered ones, runs with nothing new and batches that
commit after a run; and the windows the evaluator sums must equal the raw records' sums."""

import itertools
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from billing.ingest import insert_records
from billing.models import ROLLUP_COUNTERS, RollupCursor, UsageDay, UsageHour, UsageMinute, UsageRecord
from billing.rollups import recompute_coarser, recompute_minutes, usage_rollup_run, windows_sums

NOW = datetime(2026, 11, 29, 1, 30, tzinfo=UTC)  # 90 minutes after a day (and hour) boundary
STATUSES = ["ok", "ok", "ok", "shed", "rate_limited", "upstream_error", "timeout"]
_ids = itertools.count()

record_st = st.fixed_dictionaries(
    {
        "who": st.integers(0, 2),
        "minute": st.integers(-200, 0),  # crosses two hour and one day boundary: late records land anywhere
        "second": st.integers(0, 59),
        "status": st.sampled_from(STATUSES),
        "slo_met": st.booleans(),
        "output_tokens": st.integers(0, 800),
        "mu": st.floats(0, 50, allow_nan=False).map(lambda v: round(v, 3)),
        "ttft_ms": st.one_of(st.none(), st.floats(1, 12000)),
        "tpot_ms": st.one_of(st.none(), st.floats(1, 600)),
    }
)


@pytest.fixture
def combos(tenant_a, tenant_b):
    return [
        (tenant_a.endpoint, tenant_a.tenant),
        (tenant_a.endpoint, tenant_b.tenant),
        (tenant_b.endpoint, tenant_b.tenant),
    ]


def _insert(records: list[dict], combos) -> None:
    rows = []
    for r in records:
        endpoint, tenant = combos[r["who"]]
        finished = NOW + timedelta(minutes=r["minute"], seconds=r["second"])
        fields = {k: v for k, v in r.items() if k not in ("who", "minute", "second")}
        rows.append(
            UsageRecord(
                request_id=f"inc-{next(_ids)}",
                endpoint=endpoint,
                tenant=tenant,
                started_at=finished,
                finished_at=finished,
                **fields,
            )
        )
    UsageRecord.objects.bulk_create(rows)


def _tiers() -> dict:
    return {
        model.__name__: {
            (row["endpoint_id"], row["tenant_id"], row["start"]): row
            for row in model.objects.values("endpoint_id", "tenant_id", "start", *ROLLUP_COUNTERS)
        }
        for model in (UsageMinute, UsageHour, UsageDay)
    }


def _recomputed() -> dict:
    """Every tier rebuilt from raw usage, as the rollup did before it added records incrementally."""
    for model in (UsageMinute, UsageHour, UsageDay):
        model.objects.all().delete()
    lo, hi = NOW - timedelta(days=2), NOW + timedelta(days=1)
    recompute_minutes([(lo, hi)])
    recompute_coarser(UsageHour, [(lo, hi)])
    recompute_coarser(UsageDay, [(lo.replace(hour=0, minute=0), hi)])
    return _tiers()


def _assert_tiers_equal(actual: dict, expected: dict) -> None:
    for tier, rows in expected.items():
        assert set(actual[tier]) == set(rows), tier
        for key, row in rows.items():
            for field in ROLLUP_COUNTERS:
                assert actual[tier][key][field] == pytest.approx(row[field], rel=1e-9, abs=1e-6), (tier, key, field)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.lists(record_st, min_size=1, max_size=20), min_size=1, max_size=5))
def test_incremental_rollups_equal_a_full_recompute_of_the_same_records(combos, batches):
    with transaction.atomic():
        for number, batch in enumerate(batches):
            _insert(batch, combos)
            result = usage_rollup_run(now=NOW)
            if number:  # the first run reads from id 0; the later ones only their new records
                assert result.records_scanned == len(batch), number
        assert usage_rollup_run(now=NOW).minute_rows == 0  # nothing new: nothing changes
        added = _tiers()
        _assert_tiers_equal(added, _recomputed())
        transaction.set_rollback(True)


def test_re_delivered_records_are_rolled_up_once(tenant_a):
    when = NOW.timestamp() - 90
    record = {
        "request_id": "redelivered-1",
        "tenant_id": tenant_a.tenant.pk,
        "endpoint_id": tenant_a.endpoint.pk,
        "status": "ok",
        "output_tokens": 5,
        "started_at": when - 1,
        "finished_at": when,
    }
    insert_records([record, dict(record)])
    usage_rollup_run(now=NOW)
    insert_records([dict(record), {**record, "request_id": "redelivered-2"}])  # a spool drained twice
    usage_rollup_run(now=NOW)
    usage_rollup_run(now=NOW)  # the task itself re-delivered
    minute = UsageMinute.objects.get()
    assert (minute.requests, minute.output_tokens) == (2, 10)
    hour = UsageHour.objects.get()
    assert (hour.requests, hour.output_tokens) == (2, 10)
    assert UsageDay.objects.get().requests == 2


def _record(tenant_a, pk: int, minutes_ago: float) -> UsageRecord:
    when = NOW - timedelta(minutes=minutes_ago)
    return UsageRecord(
        id=pk,
        request_id=f"late-{pk}",
        tenant=tenant_a.tenant,
        endpoint=tenant_a.endpoint,
        status="ok",
        started_at=when,
        finished_at=when,
        mu=1.0,
    )


def test_a_late_commit_is_recomputed_once_then_runs_add_again(tenant_a):
    UsageRecord.objects.bulk_create([_record(tenant_a, 2_000_001, 5), _record(tenant_a, 2_000_003, 3)])
    assert usage_rollup_run(now=NOW).records_scanned == 2_000_003
    UsageRecord.objects.bulk_create([_record(tenant_a, 2_000_002, 5)])  # its id taken before the run
    recompute = usage_rollup_run(now=NOW)
    assert recompute.records_scanned > 1  # the previous run's ids read again
    assert UsageMinute.objects.get(start=(NOW - timedelta(minutes=5)).replace(second=0)).requests == 2
    UsageRecord.objects.bulk_create([_record(tenant_a, 2_000_004, 5)])
    assert usage_rollup_run(now=NOW).records_scanned == 1  # steady again: only the new record
    assert UsageMinute.objects.get(start=(NOW - timedelta(minutes=5)).replace(second=0)).requests == 3
    assert UsageHour.objects.get().requests == 4
    assert UsageDay.objects.get().requests == 4


def test_a_cursor_from_before_the_ids_sum_recomputes_once(tenant_a):
    """An upgraded deployment's cursor has no sum of its last ids: the first run recomputes, as runs used to."""
    UsageRecord.objects.bulk_create([_record(tenant_a, 3_000_001, 4)])
    usage_rollup_run(now=NOW)
    RollupCursor.objects.update(ids_sum=0)
    UsageMinute.objects.update(requests=99)  # wrong until recomputed from raw usage
    usage_rollup_run(now=NOW)
    assert UsageMinute.objects.get().requests == 1


def test_records_past_the_minute_tier_reach_only_the_tiers_a_recompute_would(tenant_a):
    """A record finished 10 days ago (raw usage is kept 30, minute rows 8) gets its minute row only; one past raw
    retention gets none: the same as recomputing from raw usage."""
    UsageRecord.objects.bulk_create(
        [_record(tenant_a, 4_000_001, 10 * 24 * 60), _record(tenant_a, 4_000_002, 31 * 24 * 60)]
    )
    usage_rollup_run(now=NOW)
    assert list(UsageMinute.objects.values_list("requests", flat=True)) == [1]
    assert not UsageHour.objects.exists() and not UsageDay.objects.exists()


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    records=st.lists(record_st, min_size=1, max_size=40),
    windows=st.lists(st.tuples(st.integers(-240, 0), st.integers(1, 240)), min_size=1, max_size=6),
)
def test_window_sums_equal_the_raw_records_sums(combos, records, windows):
    """Many overlapping windows summed at once (each tier grouped by the segments between the windows' edges)
    equal each window's own sum of the raw records, read back from the minute, hour and day tiers."""
    with transaction.atomic():
        _insert(records, combos)
        usage_rollup_run(now=NOW)
        end = NOW.replace(second=0) + timedelta(minutes=1)
        ranges = {
            f"w{i}": (end + timedelta(minutes=a), end + timedelta(minutes=a + n)) for i, (a, n) in enumerate(windows)
        }
        fields = ("requests", "good", "mu", "ttft_le_1000")
        together = windows_sums(ranges, fields=fields, now=NOW)
        for label, (lo, hi) in ranges.items():
            expected: dict = defaultdict(lambda: dict.fromkeys(fields, 0.0))
            for row in UsageRecord.objects.filter(finished_at__gte=lo, finished_at__lt=hi).values(
                "endpoint_id", "tenant_id", "status", "slo_met", "mu", "ttft_ms"
            ):
                sums = expected[(row["endpoint_id"], row["tenant_id"])]
                ok = row["status"] == "ok"
                sums["requests"] += 1
                sums["good"] += ok and row["slo_met"]
                sums["mu"] += row["mu"]
                sums["ttft_le_1000"] += ok and (row["ttft_ms"] is None or row["ttft_ms"] <= 1000)
            assert set(together[label]) == set(expected), label
            for key, sums in expected.items():
                assert together[label][key] == pytest.approx(sums), (label, key)
        transaction.set_rollback(True)
