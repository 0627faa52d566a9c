"""Rollups equal a plain aggregation of the raw usage records, including late records and re-runs."""

import itertools
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from billing.models import ROLLUP_COUNTERS, TPOT_BOUNDS_MS, TTFT_BOUNDS_MS, UsageHour, UsageMinute, UsageRecord
from billing.rollups import range_sums, split_range, usage_retention_cleanup, usage_rollup_run, windows_sums

NOW = datetime(2026, 11, 29, 1, 30, tzinfo=UTC)  # 90 minutes after a day (and hour) boundary
STATUSES = ["ok", "ok", "ok", "shed", "rate_limited", "client_cancelled", "upstream_error", "timeout"]
_ids = itertools.count()

record_st = st.fixed_dictionaries(
    {
        "who": st.integers(0, 2),  # (endpoint, tenant) combination
        "minute": st.integers(-150, 0),
        "second": st.integers(0, 59),
        "status": st.sampled_from(STATUSES),
        "slo_met": st.booleans(),
        "input_tokens": st.integers(0, 4000),
        "cached_tokens": st.integers(0, 1000),
        "output_tokens": st.integers(0, 800),
        "mu": st.floats(0, 50, allow_nan=False).map(lambda v: round(v, 3)),
        "ttft_ms": st.one_of(st.none(), st.sampled_from([50.0, 99.9, 2000.0, 2000.5]), st.floats(1, 12000)),
        "tpot_ms": st.one_of(st.none(), st.sampled_from([5.0, 100.0, 100.01]), st.floats(1, 600)),
    }
)


def _expected(records: list[dict], combos) -> dict:
    """Aggregate in Python, independently of the SQL, keyed by (endpoint, tenant, minute)."""
    out: dict = defaultdict(lambda: dict.fromkeys(ROLLUP_COUNTERS, 0))
    for r in records:
        endpoint, tenant = combos[r["who"]]
        minute = (NOW + timedelta(minutes=r["minute"])).replace(second=0)
        row = out[(endpoint.pk, tenant.pk, minute)]
        ok = r["status"] == "ok"
        good = ok and r["slo_met"]
        row["requests"] += 1
        row["ok"] += ok
        row["good"] += good
        row["upstream_errors"] += r["status"] == "upstream_error"
        row["timeouts"] += r["status"] == "timeout"
        row["client_cancelled"] += r["status"] == "client_cancelled"
        row["shed"] += r["status"] == "shed"
        row["rate_limited"] += r["status"] == "rate_limited"
        for f in ("input_tokens", "cached_tokens", "output_tokens", "mu"):
            row[f] += r[f]
        row["good_output_tokens"] += r["output_tokens"] if good else 0
        if ok:
            row["ttft_sum_ms"] += r["ttft_ms"] or 0
            row["tpot_sum_ms"] += r["tpot_ms"] or 0
            for b in TTFT_BOUNDS_MS:
                row[f"ttft_le_{b}"] += r["ttft_ms"] is None or r["ttft_ms"] <= b
            for b in TPOT_BOUNDS_MS:
                row[f"tpot_le_{b}"] += r["tpot_ms"] is None or r["tpot_ms"] <= b
    return out


def _insert(records: list[dict], combos) -> None:
    rows = []
    for r in records:
        endpoint, tenant = combos[r["who"]]
        finished = NOW + timedelta(minutes=r["minute"], seconds=r["second"])
        fields = {k: v for k, v in r.items() if k not in ("who", "minute", "second")}
        rows.append(
            UsageRecord(
                request_id=f"prop-{next(_ids)}",
                endpoint=endpoint,
                tenant=tenant,
                started_at=finished,
                finished_at=finished,
                **fields,
            )
        )
    UsageRecord.objects.bulk_create(rows)


def _assert_close(actual: dict, expected: dict, label) -> None:
    for field in ROLLUP_COUNTERS:
        assert actual[field] == pytest.approx(expected[field], rel=1e-9, abs=1e-6), (label, field)


def _check(records: list[dict], combos) -> None:
    expected = _expected(records, combos)
    actual = {(m.endpoint_id, m.tenant_id, m.start): m for m in UsageMinute.objects.all()}
    assert set(actual) == set(expected)
    for key, row in expected.items():
        _assert_close({f: getattr(actual[key], f) for f in ROLLUP_COUNTERS}, row, key)
    # Hours are the sums of their minutes.
    hours: dict = defaultdict(lambda: dict.fromkeys(ROLLUP_COUNTERS, 0))
    for (e, t, minute), row in expected.items():
        for f in ROLLUP_COUNTERS:
            hours[(e, t, minute.replace(minute=0))][f] += row[f]
    actual_hours = {(h.endpoint_id, h.tenant_id, h.start): h for h in UsageHour.objects.all()}
    assert set(actual_hours) == set(hours)
    for key, row in hours.items():
        _assert_close({f: getattr(actual_hours[key], f) for f in ROLLUP_COUNTERS}, row, key)
    # An arbitrary range read across tiers equals the raw sum over that range.
    lo, hi = NOW - timedelta(minutes=137), NOW + timedelta(minutes=1)
    window: dict = defaultdict(lambda: dict.fromkeys(ROLLUP_COUNTERS, 0))
    for (e, t, minute), row in expected.items():
        if lo <= minute < hi:
            for f in ROLLUP_COUNTERS:
                window[(e, t)][f] += row[f]
    sums = range_sums(start=lo, end=hi, now=NOW)
    assert set(sums) == set(window)
    for key, row in window.items():
        _assert_close(sums[key], row, key)
    # Overlapping windows read together equal each read alone.
    ranges = {
        "5m": (NOW - timedelta(minutes=4), hi),
        "2h": (NOW - timedelta(minutes=119), hi),
        "all": (NOW - timedelta(minutes=151), hi),
    }
    together = windows_sums(ranges, now=NOW, fields=("requests", "mu", "ttft_le_1000"))
    for label, (start, end) in ranges.items():
        alone = range_sums(start=start, end=end, now=NOW, fields=("requests", "mu", "ttft_le_1000"))
        assert set(together[label]) == set(alone), label
        for key, row in alone.items():
            assert together[label][key] == pytest.approx(row), (label, key)


@pytest.fixture
def combos(tenant_a, tenant_b):
    return [
        (tenant_a.endpoint, tenant_a.tenant),
        (tenant_a.endpoint, tenant_b.tenant),
        (tenant_b.endpoint, tenant_b.tenant),
    ]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=st.lists(record_st, max_size=40), late=st.lists(record_st, max_size=25))
def test_rollups_equal_raw_aggregation_with_late_records_and_reruns(combos, first, late):
    with transaction.atomic():
        _insert(first, combos)
        usage_rollup_run(now=NOW)
        # Late records land in minutes that were already rolled up.
        _insert(late, combos)
        usage_rollup_run(now=NOW)
        _check(first + late, combos)
        usage_rollup_run(now=NOW)  # a re-run with nothing new changes nothing
        usage_rollup_run(now=NOW)
        _check(first + late, combos)
        transaction.set_rollback(True)


def test_records_without_endpoint_are_not_rolled_up(tenant_a):
    UsageRecord.objects.create(
        request_id="no-endpoint", tenant=tenant_a.tenant, endpoint=None, status="ok", started_at=NOW, finished_at=NOW
    )
    usage_rollup_run(now=NOW)
    assert not UsageMinute.objects.exists()


def test_split_range_covers_the_range_exactly_once():
    start, end = datetime(2026, 11, 20, 22, 17, tzinfo=UTC), datetime(2026, 11, 23, 5, 43, tzinfo=UTC)
    pieces = split_range(start, end, now=end)
    assert [p[0].__name__ for p in pieces] == ["UsageMinute", "UsageHour", "UsageDay", "UsageHour", "UsageMinute"]
    assert pieces[0][1] == start and pieces[-1][2] == end
    assert all(a[2] == b[1] for a, b in itertools.pairwise(pieces))


def test_retention_deletes_only_old_rolled_up_records(tenant_a):
    old = NOW - timedelta(days=31)
    for i, when in enumerate([old, old, NOW]):
        UsageRecord.objects.create(
            request_id=f"ret-{i}",
            tenant=tenant_a.tenant,
            endpoint=tenant_a.endpoint,
            status="ok",
            started_at=when,
            finished_at=when,
        )
    assert usage_retention_cleanup(now=NOW) == 0  # nothing rolled up yet: keep everything
    usage_rollup_run(now=NOW)
    usage_rollup_run(now=NOW)
    assert usage_retention_cleanup(now=NOW, batch_size=1) == 2
    assert list(UsageRecord.objects.values_list("request_id", flat=True)) == ["ret-2"]


def test_a_batch_committed_after_a_run_with_lower_ids_is_still_rolled_up(tenant_a):
    """Ids are taken at insert but become visible at commit: the next run re-reads the previous run's ids."""

    def record(pk: int, minute: int) -> UsageRecord:
        when = NOW - timedelta(minutes=minute)
        return UsageRecord(
            id=pk,
            request_id=f"inflight-{pk}",
            tenant=tenant_a.tenant,
            endpoint=tenant_a.endpoint,
            status="ok",
            started_at=when,
            finished_at=when,
            mu=1.0,
        )

    UsageRecord.objects.bulk_create([record(1_000_001, 5), record(1_000_003, 3)])
    usage_rollup_run(now=NOW)
    UsageRecord.objects.bulk_create([record(1_000_002, 5)])  # allocated before the run, committed after it
    usage_rollup_run(now=NOW)
    minute = (NOW - timedelta(minutes=5)).replace(second=0)
    assert UsageMinute.objects.get(start=minute).requests == 2
