"""Usage rollups: per-minute aggregates by (endpoint, tenant) of raw usage, then hours and days on top.

Correct for late records and idempotent: each run adds the records inserted since the previous run (by primary key,
which is taken at insert time, so a record spooled for hours still counts as new) to the minute, hour and day rows
they fall in, reading only those records. When the previous run's records changed since (a batch that committed
after it, with lower ids), the run instead recomputes every minute they touch wholesale from the raw rows, then the
hours and days that contain them. A re-run with nothing new changes nothing (docs/algorithms.md, SLOs and burn
rates).
"""

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, models, transaction
from django.db.models import Count, Max, Q, Sum
from django.db.models.functions import Coalesce, TruncDay, TruncHour, TruncMinute
from django.utils import timezone

from billing.models import (
    ROLLUP_COUNTERS,
    TPOT_BOUNDS_MS,
    TTFT_BOUNDS_MS,
    RollupCursor,
    UsageDay,
    UsageHour,
    UsageMinute,
    UsageRecord,
    UsageStatus,
)

logger = logging.getLogger("infercap.billing")

MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
# How long each tier is kept; windows reaching further back are read from the next coarser tier.
MINUTE_ROLLUP_RETENTION = timedelta(days=8)
HOUR_ROLLUP_RETENTION = timedelta(days=120)
# More disjoint ranges than this are merged into one covering range (still exact, just reads more rows).
MAX_RANGES = 64
CURSOR_NAME = "usage"
REREAD_MAX_IDS = 100_000
WINDOW_SUMS_MEM = "64MB"  # work_mem of the window sums' statements


@dataclass(frozen=True)
class RollupResult:
    records_scanned: int
    minutes: int  # distinct touched minutes recomputed
    minute_rows: int
    hour_rows: int
    day_rows: int
    last_id: int


def _raw_aggregates() -> dict[str, models.Aggregate]:
    """One aggregate per rollup counter, in ROLLUP_COUNTERS order (the INSERT relies on that order)."""
    ok = Q(status=UsageStatus.OK)
    good = ok & Q(slo_met=True)

    def count(condition: Q | None = None):
        return Count("id", filter=condition)

    def total(field: str, condition: Q | None = None, zero=0):
        return Coalesce(Sum(field, filter=condition), zero)

    aggregates = {
        "requests": count(),
        "ok": count(ok),
        "good": count(good),
        "upstream_errors": count(Q(status=UsageStatus.UPSTREAM_ERROR)),
        "timeouts": count(Q(status=UsageStatus.TIMEOUT)),
        "client_cancelled": count(Q(status=UsageStatus.CLIENT_CANCELLED)),
        "shed": count(Q(status=UsageStatus.SHED)),
        "rate_limited": count(Q(status=UsageStatus.RATE_LIMITED)),
        "input_tokens": total("input_tokens"),
        "cached_tokens": total("cached_tokens"),
        "output_tokens": total("output_tokens"),
        "good_output_tokens": total("output_tokens", good),
        "mu": total("mu", zero=0.0),
        "ttft_sum_ms": total("ttft_ms", ok, 0.0),
        "tpot_sum_ms": total("tpot_ms", ok, 0.0),
    }
    # A missing latency means it was not measured (no decode step for TPOT): it does not count against the SLI.
    for bound in TTFT_BOUNDS_MS:
        aggregates[f"ttft_le_{bound}"] = count(ok & (Q(ttft_ms__isnull=True) | Q(ttft_ms__lte=bound)))
    for bound in TPOT_BOUNDS_MS:
        aggregates[f"tpot_le_{bound}"] = count(ok & (Q(tpot_ms__isnull=True) | Q(tpot_ms__lte=bound)))
    assert tuple(aggregates) == ROLLUP_COUNTERS
    return {f"agg_{name}": aggregate for name, aggregate in aggregates.items()}


def _summed_aggregates() -> dict[str, models.Aggregate]:
    return {f"agg_{name}": Sum(name) for name in ROLLUP_COUNTERS}


def _upsert(target: type[models.Model], source: models.QuerySet) -> int:
    """INSERT INTO target SELECT … (the grouped source) ON CONFLICT (endpoint, tenant, start) DO UPDATE."""
    source = source.order_by()
    columns = list(source.query.values_select) + list(source.query.annotation_select)
    expected = ["endpoint_id", "tenant_id", "bucket", *(f"agg_{name}" for name in ROLLUP_COUNTERS)]
    if columns != expected:  # the compiled SELECT's column order is what the INSERT maps by position
        raise RuntimeError(f"unexpected rollup column order {columns}")
    select_sql, params = source.query.sql_with_params()
    quote = connection.ops.quote_name
    table = quote(target._meta.db_table)
    names = ["endpoint_id", "tenant_id", "start", *ROLLUP_COUNTERS]
    updates = ", ".join(f"{quote(n)} = EXCLUDED.{quote(n)}" for n in ROLLUP_COUNTERS)
    sql = (
        f"INSERT INTO {table} ({', '.join(quote(n) for n in names)}) {select_sql} "
        f"ON CONFLICT ({quote('endpoint_id')}, {quote('tenant_id')}, {quote('start')}) DO UPDATE SET {updates}"
    )
    if connection.vendor == "postgresql":
        # Re-runs recompute rows that mostly did not change: skipping those writes skips their dead tuples too.
        current = ", ".join(f"{table}.{quote(n)}" for n in ROLLUP_COUNTERS)
        excluded = ", ".join(f"EXCLUDED.{quote(n)}" for n in ROLLUP_COUNTERS)
        sql += f" WHERE ({current}) IS DISTINCT FROM ({excluded})"
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return max(cursor.rowcount, 0)


def _merge_ranges(starts: Iterable[datetime], step: timedelta) -> list[tuple[datetime, datetime]]:
    """Contiguous [lo, hi) ranges covering the given bucket starts; at most MAX_RANGES of them."""
    ranges: list[list[datetime]] = []
    for start in sorted(set(starts)):
        if ranges and start <= ranges[-1][1]:
            ranges[-1][1] = max(ranges[-1][1], start + step)
        else:
            ranges.append([start, start + step])
    if len(ranges) > MAX_RANGES:
        return [(ranges[0][0], ranges[-1][1])]
    return [(lo, hi) for lo, hi in ranges]


def _ranges_q(field: str, ranges: list[tuple[datetime, datetime]]) -> Q:
    condition = Q(pk__in=[])
    for lo, hi in ranges:
        condition |= Q(**{f"{field}__gte": lo, f"{field}__lt": hi})
    return condition


def _truncate(moment: datetime, step: timedelta) -> datetime:
    if step == MINUTE:
        return moment.replace(second=0, microsecond=0)
    if step == HOUR:
        return moment.replace(minute=0, second=0, microsecond=0)
    return moment.replace(hour=0, minute=0, second=0, microsecond=0)


def recompute_minutes(ranges: list[tuple[datetime, datetime]], *, max_id: int | None = None) -> int:
    """Recompute every (endpoint, tenant) minute row inside the given minute-aligned ranges from raw usage (the
    records up to ``max_id``, when given)."""
    if not ranges:
        return 0
    records = UsageRecord.objects.all() if max_id is None else UsageRecord.objects.filter(id__lte=max_id)
    source = (
        records.filter(_ranges_q("finished_at", ranges), endpoint__isnull=False)
        .annotate(bucket=TruncMinute("finished_at"))
        .values("endpoint_id", "tenant_id", "bucket")
        .annotate(**_raw_aggregates())
    )
    return _upsert(UsageMinute, source)


def recompute_coarser(target: type[models.Model], ranges: list[tuple[datetime, datetime]]) -> int:
    """Recompute hour rows from minute rows (or day rows from hour rows) inside the given aligned ranges."""
    if not ranges:
        return 0
    finer, trunc = (UsageMinute, TruncHour) if target is UsageHour else (UsageHour, TruncDay)
    source = (
        finer.objects.filter(_ranges_q("start", ranges))
        .annotate(bucket=trunc("start"))
        .values("endpoint_id", "tenant_id", "bucket")
        .annotate(**_summed_aggregates())
    )
    return _upsert(target, source)


def usage_rollup_run(*, now: datetime | None = None) -> RollupResult:
    """Roll up the usage records inserted since the previous run: their sums are added to the minute, hour and day
    rows they fall in, so a run reads only its new records. A run that finds the previous run's records changed
    (a batch that committed after it, with lower ids) recomputes the minutes those records touch from raw usage
    instead, as every run did before (docs/algorithms.md, SLOs and burn rates)."""
    now = now or timezone.now()
    with transaction.atomic():
        if connection.vendor == "postgresql":
            # A backfill groups millions of rows by minute: let the hash aggregate stay in memory.
            with connection.cursor() as db:
                db.execute("SET LOCAL work_mem = '256MB'")
        cursor, _ = RollupCursor.objects.get_or_create(name=CURSOR_NAME)
        # Serializes concurrent runs (a beat tick overlapping a slow previous tick).
        cursor = RollupCursor.objects.select_for_update().get(pk=cursor.pk)
        upper = max(UsageRecord.objects.aggregate(top=Max("id"))["top"] or 0, cursor.last_id)
        # The previous run's ids sit just below its cursor; after a big backfill only the last REREAD_MAX_IDS of
        # them are checked (and, when changed, read again).
        reread_from = max(cursor.previous_id, cursor.last_id - REREAD_MAX_IDS)
        checked_from = max(cursor.last_id, upper - REREAD_MAX_IDS)  # this run's ids that the next run checks
        # Adding is PostgreSQL's (a temporary table, date_trunc); embedded SQLite recomputes every run.
        if connection.vendor == "postgresql" and _ids_sum(reread_from, cursor.last_id) == cursor.ids_sum:
            ids_sum, counts = _add_new(cursor.last_id, upper, checked_from, now)
            scanned = upper - cursor.last_id
        else:
            # Summed before the recompute: a record committing in between makes the next run recompute again.
            ids_sum = _ids_sum(checked_from, upper)
            counts = _recompute_touched(reread_from, upper, now)
            scanned = upper - reread_from
        RollupCursor.objects.filter(pk=cursor.pk).update(
            previous_id=max(cursor.last_id, cursor.previous_id), last_id=upper, ids_sum=ids_sum, updated_at=now
        )
    result = RollupResult(records_scanned=max(0, scanned), last_id=upper, **counts)
    logger.info("usage rollup: %s", result)
    return result


def _ids_sum(after: int, upto: int) -> int:
    """The sum of the usage ids in (after, upto] (every record's, with or without an endpoint)."""
    if upto <= after:
        return 0
    with connection.cursor() as db:
        db.execute("SELECT coalesce(sum(id), 0) FROM billing_usagerecord WHERE id > %s AND id <= %s", [after, upto])
        return int(db.fetchone()[0])


def _horizons(now: datetime) -> tuple[datetime, datetime]:
    """Minutes older than raw retention may have lost rows already (recomputing them would undercount), and a
    coarser row follows its finer rows only while all of them are still kept: the oldest minute a run changes, and
    the oldest hour whose hour and day rows it changes."""
    return _truncate(now - timedelta(days=usage_retention_days()), MINUTE), now - MINUTE_ROLLUP_RETENTION


def _recompute_touched(after: int, upto: int, now: datetime) -> dict[str, int]:
    """Recompute every minute touched by the records with ids in (after, upto] from raw usage (records up to
    ``upto`` only: later ones are the next run's to add), then the hours and days containing them."""
    raw_horizon, hour_horizon = _horizons(now)
    fresh = UsageRecord.objects.filter(id__gt=after, id__lte=upto, endpoint__isnull=False)
    touched = list(
        fresh.annotate(bucket=TruncMinute("finished_at")).values_list("bucket", flat=True).distinct().order_by()
    )
    touched = [m for m in touched if m >= raw_horizon]
    minute_rows = recompute_minutes(_merge_ranges(touched, MINUTE), max_id=upto)
    hours = {_truncate(m, HOUR) for m in touched}
    hour_rows = recompute_coarser(UsageHour, _merge_ranges((h for h in hours if h >= hour_horizon), HOUR))
    days = {_truncate(m, DAY) for m in touched}
    day_ranges = _merge_ranges((d for d in days if d >= now - HOUR_ROLLUP_RETENTION), DAY)
    day_rows = recompute_coarser(UsageDay, day_ranges)
    return {"minutes": len(touched), "minute_rows": minute_rows, "hour_rows": hour_rows, "day_rows": day_rows}


DELTA_TABLE = "billing_rollup_delta"


def _add_new(after: int, upto: int, checked_from: int, now: datetime) -> tuple[int, dict[str, int]]:
    """Add the records with ids in (after, upto] to their minute, hour and day rows. One statement groups them by
    (endpoint, tenant, minute) into a temporary table and sums the ids after ``checked_from`` from the same
    snapshot, so the sum covers exactly the records added. Returns that sum and the run's counts."""
    raw_horizon, hour_horizon = _horizons(now)
    source = (
        UsageRecord.objects.filter(id__gt=after, id__lte=upto)
        .annotate(bucket=TruncMinute("finished_at"))
        .values("endpoint_id", "tenant_id", "bucket")
        .annotate(**_raw_aggregates(), agg_ids=Coalesce(Sum("id", filter=Q(id__gt=checked_from)), 0))
        .order_by()
    )
    select_sql, params = source.query.sql_with_params()
    zone = timezone.get_current_timezone_name()
    kept = "endpoint_id IS NOT NULL AND bucket >= %s"
    with connection.cursor() as db:
        db.execute(f"DROP TABLE IF EXISTS pg_temp.{DELTA_TABLE}")
        db.execute(f"CREATE TEMP TABLE {DELTA_TABLE} ON COMMIT DROP AS {select_sql}", params)
        db.execute(
            f"SELECT coalesce(sum(agg_ids), 0), count(DISTINCT bucket) FILTER (WHERE {kept}) FROM {DELTA_TABLE}",
            [raw_horizon],
        )
        ids_sum, minutes = db.fetchone()
        rows = {}
        for target, bucket in ((UsageMinute, "bucket"), (UsageHour, "hour"), (UsageDay, "day")):
            trunc = (
                "bucket" if bucket == "bucket" else f"date_trunc('{bucket}', bucket AT TIME ZONE %s) AT TIME ZONE %s"
            )
            trunc_params = [] if bucket == "bucket" else [zone, zone]
            where, where_params = kept, [raw_horizon]
            if target is not UsageMinute:
                where += " AND date_trunc('hour', bucket AT TIME ZONE %s) AT TIME ZONE %s >= %s"
                where_params += [zone, zone, hour_horizon]
            rows[target] = _add_to(target, trunc, trunc_params, where, where_params, db)
        db.execute(f"DROP TABLE pg_temp.{DELTA_TABLE}")
    counts = {"minute_rows": rows[UsageMinute], "hour_rows": rows[UsageHour], "day_rows": rows[UsageDay]}
    return int(ids_sum), {"minutes": minutes, **counts}


def _add_to(target: type[models.Model], trunc: str, trunc_params: list, where: str, where_params: list, db) -> int:
    """INSERT the delta table's sums, grouped by ``trunc`` of its minute, into ``target``, adding them to the
    rows already there."""
    quote = connection.ops.quote_name
    table = quote(target._meta.db_table)
    names = ["endpoint_id", "tenant_id", "start", *ROLLUP_COUNTERS]
    sums = ", ".join(f"SUM({quote('agg_' + n)})" for n in ROLLUP_COUNTERS)
    adds = ", ".join(f"{quote(n)} = {table}.{quote(n)} + EXCLUDED.{quote(n)}" for n in ROLLUP_COUNTERS)
    db.execute(
        f"INSERT INTO {table} ({', '.join(quote(n) for n in names)}) "
        f"SELECT endpoint_id, tenant_id, {trunc}, {sums} FROM {DELTA_TABLE} WHERE {where} GROUP BY 1, 2, 3 "
        f"ON CONFLICT ({quote('endpoint_id')}, {quote('tenant_id')}, {quote('start')}) DO UPDATE SET {adds}",
        trunc_params + where_params,
    )
    return max(db.rowcount, 0)


def usage_retention_days() -> int:
    return int(getattr(settings, "INFERCAP", {}).get("USAGE_RETENTION_DAYS", 30))


def usage_retention_cleanup(*, now: datetime | None = None, batch_size: int = 10_000, max_batches: int = 100) -> int:
    """Delete raw usage records older than the retention (only rolled-up ones) and expired rollup rows, in batches.

    Batches keep each DELETE's locks and WAL small so the proxy's inserts are never blocked for long.
    """
    now = now or timezone.now()
    cursor = RollupCursor.objects.filter(name=CURSOR_NAME).first()
    rolled_up_id = cursor.previous_id if cursor else 0
    cutoff = now - timedelta(days=usage_retention_days())
    deleted = 0
    expired = UsageRecord.objects.filter(finished_at__lt=cutoff, id__lte=rolled_up_id)
    for _ in range(max_batches):
        ids = list(expired.order_by("id").values_list("id", flat=True)[:batch_size])
        if not ids:
            break
        deleted += UsageRecord.objects.filter(id__in=ids).delete()[0]
    UsageMinute.objects.filter(start__lt=now - MINUTE_ROLLUP_RETENTION).delete()
    UsageHour.objects.filter(start__lt=now - HOUR_ROLLUP_RETENTION).delete()
    return deleted


# ---------------------------------------------------------------------------------------------------------------
# Reading rollups over arbitrary ranges: whole days from the day tier, whole hours from the hour tier, the ragged
# edges from the minute tier.


def split_range(
    start: datetime, end: datetime, *, now: datetime
) -> list[tuple[type[models.Model], datetime, datetime]]:
    """Cover [start, end) with (tier, lo, hi) pieces. Starts older than a tier's retention snap to the next tier."""
    if start < now - MINUTE_ROLLUP_RETENTION + HOUR:
        start = _ceil(start, HOUR)
    if start < now - HOUR_ROLLUP_RETENTION + DAY:
        start = _ceil(start, DAY)
    start, end = _truncate(start, MINUTE), _ceil(end, MINUTE)
    if start >= end:
        return []
    h0, h1 = _ceil(start, HOUR), _truncate(end, HOUR)
    if h0 >= h1:
        return [(UsageMinute, start, end)]
    pieces: list[tuple[type[models.Model], datetime, datetime]] = []
    if start < h0:
        pieces.append((UsageMinute, start, h0))
    d0, d1 = _ceil(h0, DAY), _truncate(h1, DAY)
    if d0 < d1:
        if h0 < d0:
            pieces.append((UsageHour, h0, d0))
        pieces.append((UsageDay, d0, d1))
        if d1 < h1:
            pieces.append((UsageHour, d1, h1))
    else:
        pieces.append((UsageHour, h0, h1))
    if h1 < end:
        pieces.append((UsageMinute, h1, end))
    return pieces


def _ceil(moment: datetime, step: timedelta) -> datetime:
    floor = _truncate(moment, step)
    return floor if floor == moment else floor + step


Key = tuple[int, int]  # (endpoint_id, tenant_id)


def range_sums(
    *,
    start: datetime,
    end: datetime,
    fields: Iterable[str] = ROLLUP_COUNTERS,
    now: datetime | None = None,
    endpoint_ids: Iterable[int] | None = None,
    tenant_ids: Iterable[int] | None = None,
) -> dict[Key, dict[str, float]]:
    """Summed rollup counters per (endpoint, tenant) over [start, end)."""
    return windows_sums(
        {"range": (start, end)}, fields=fields, now=now, endpoint_ids=endpoint_ids, tenant_ids=tenant_ids
    )["range"]


def windows_sums(
    windows: dict[str, tuple[datetime, datetime]],
    *,
    fields: Iterable[str] = ROLLUP_COUNTERS,
    now: datetime | None = None,
    endpoint_ids: Iterable[int] | None = None,
    tenant_ids: Iterable[int] | None = None,
) -> dict[str, dict[Key, dict[str, float]]]:
    """Summed counters per (endpoint, tenant) for several (possibly overlapping) windows at once.

    One statement per tier, whatever the number of windows: the rows of every window's pieces (index range scans)
    are summed once per (endpoint, tenant, segment), where the segments are the disjoint spans between the pieces'
    edges, and each window's sums add up the segments it covers (``SUM(…) FILTER``) over those few grouped rows, so
    the per-row work is one sum per field however many windows overlap (docs/algorithms.md, SLOs and burn rates).
    """
    now = now or timezone.now()
    fields = [f for f in fields if f in ROLLUP_COUNTERS]  # names are interpolated into SQL: only known columns
    pieces_by_tier: dict[type[models.Model], dict[str, list[tuple[datetime, datetime]]]] = {}
    for label, (start, end) in windows.items():
        for tier, lo, hi in split_range(start, end, now=now):
            pieces_by_tier.setdefault(tier, {}).setdefault(label, []).append((lo, hi))
    filters = [(column, None if ids is None else [int(i) for i in ids]) for column, ids in
               (("endpoint_id", endpoint_ids), ("tenant_id", tenant_ids))]  # fmt: skip
    result: dict[str, dict[Key, dict[str, float]]] = {label: {} for label in windows}
    if any(ids == [] for _, ids in filters):
        return result
    for tier, by_label in pieces_by_tier.items():
        tier_labels = list(by_label)
        width = len(fields)
        for row in _tier_window_rows(tier, by_label, fields, filters):
            key = (row[0], row[1])
            for index, label in enumerate(tier_labels):
                values = row[2 + index * width : 2 + (index + 1) * width]
                if all(v is None for v in values):
                    continue
                bucket = result[label].setdefault(key, dict.fromkeys(fields, 0.0))
                for field, value in zip(fields, values, strict=True):
                    if value is not None:
                        bucket[field] += float(value)
    return result


def _tier_window_rows(
    tier: type[models.Model],
    by_label: dict[str, list[tuple[datetime, datetime]]],
    fields: list[str],
    filters: list[tuple[str, list[int] | None]],
) -> list[tuple]:
    """(endpoint_id, tenant_id, then each label's sums in ``by_label`` order) from one tier.

    The inner query groups by segment: segment i is [edges[i-1], edges[i]), and every piece is a run of whole
    segments because its ends are edges.
    """
    quote = connection.ops.quote_name
    edges = sorted({moment for pieces in by_label.values() for piece in pieces for moment in piece})
    segments_of = {
        label: [i for i in range(1, len(edges)) if any(lo <= edges[i - 1] and edges[i] <= hi for lo, hi in pieces)]
        for label, pieces in by_label.items()
    }
    start = quote("start")
    segment = f"CASE {' '.join(f'WHEN {start} < %s THEN {i}' for i in range(1, len(edges)))} END"
    all_pieces = sorted({piece for pieces in by_label.values() for piece in pieces})
    where = " OR ".join(f"({start} >= %s AND {start} < %s)" for _ in all_pieces)
    where_params: list = [moment for piece in all_pieces for moment in piece]
    for column, ids in filters:
        if ids is not None:
            where = f"({where}) AND {quote(column)} IN ({', '.join(['%s'] * len(ids))})"
            where_params += ids
    inner = ", ".join(f"CAST(SUM({quote(field)}) AS DOUBLE PRECISION) AS {quote(field)}" for field in fields)
    outer = [
        f"SUM({quote(field)}) FILTER (WHERE segment IN ({', '.join(str(i) for i in segments_of[label])}))"
        for label in by_label
        for field in fields
    ]
    sql = (
        f"SELECT {quote('endpoint_id')}, {quote('tenant_id')}, {', '.join(outer)} FROM ("
        f"SELECT {quote('endpoint_id')}, {quote('tenant_id')}, {segment} AS segment, {inner} "
        f"FROM {quote(tier._meta.db_table)} WHERE {where} GROUP BY 1, 2, 3"
        f") AS segments GROUP BY 1, 2"
    )
    params = [*edges[1:], *where_params]
    if connection.vendor != "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall()
    with transaction.atomic(), connection.cursor() as cursor:
        # Many aggregates over a few hundred thousand rows: compiling the statement (JIT) cost more than it saved,
        # and the grouped segments fit in memory. The caller's settings are put back after.
        cursor.execute("SELECT current_setting('jit'), current_setting('work_mem')")
        jit, work_mem = cursor.fetchone()
        cursor.execute("SELECT set_config('jit', 'off', true), set_config('work_mem', %s, true)", [WINDOW_SUMS_MEM])
        cursor.execute(sql, params)
        rows = cursor.fetchall()
        cursor.execute("SELECT set_config('jit', %s, true), set_config('work_mem', %s, true)", [jit, work_mem])
        return rows
