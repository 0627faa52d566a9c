"""``bench slo``: burn-rate evaluation of 1,000 SLOs over 3-day windows with millions of usage rows in PostgreSQL.

Generates the usage server-side (``generate_series``), rolls it up, then times full evaluation ticks. Everything
runs in one transaction that is rolled back at the end, so the database is left as it was, however many rows.
Options (``--opt k=v``): rows, slos, endpoints, tenants, ticks, rerun=1 (time an idempotent re-run; always in quick).
"""

import statistics
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from billing.alerts import slo_evaluate_all
from billing.models import SLO, Alert, UsageMinute, UsageRecord
from billing.rollups import usage_rollup_run
from capacity.models import HardwareProfile, ModelProfile
from endpoints.models import Endpoint
from tenants.models import Tenant

FULL_ROWS = 10_000_000
QUICK_ROWS = 100_000
CHUNK_ROWS = 1_000_000
SMOKE = {"rows": "2000", "slos": "20", "endpoints": "5", "tenants": "3"}  # --smoke
KINDS = ("availability", "ttft", "tpot", "goodput")
OBJECTIVES = (0.99, 0.995, 0.999, 0.9995)
TTFT_THRESHOLDS_MS = (1000, 2000, 3000)
TPOT_THRESHOLDS_MS = (75, 100, 150)

# The columns GENERATE_SQL fills itself; every other column gets its field's default (``_default_columns``), so a
# column added later with no database default does not break the insert.
GENERATED_COLUMNS = frozenset(
    "request_id tenant_id endpoint_id priority input_tokens cached_tokens output_tokens mu queue_ms ttft_ms tpot_ms "
    "e2e_ms status slo_met started_at finished_at created_at degradation adapter adapter_load_mu "
    "platform_prompt_tokens".split()
)
# Server-side generation: 3 days of traffic over (endpoint, tenant) pairs, ids rising with time as in production
# (a few seconds of jitter), late records at random over the last hours. Endpoints 0, 10, 20, … have a 20 %
# error burst in the last 20 minutes (pages); endpoints 5, 15, … burn slowly at 0.3 % for 3 days (tickets).
IN_ORDER = "%(now)s - interval '3 days' * (1 - g::float8 / {rows}) - random() * interval '30 seconds'"
LATE = "%(now)s - random() * interval '3 hours'"
GENERATE_SQL = """
INSERT INTO billing_usagerecord (
    request_id, tenant_id, endpoint_id, priority, input_tokens, cached_tokens, output_tokens, mu,
    queue_ms, ttft_ms, tpot_ms, e2e_ms, status, slo_met, started_at, finished_at, created_at,
    degradation, adapter, adapter_load_mu, platform_prompt_tokens{extra_columns}
)
SELECT
    %(prefix)s || lpad(g::text, 10, '0'), (%(tenant_ids)s::bigint[])[1 + g %% %(pairs)s %% %(n_tenants)s],
    (%(endpoint_ids)s::bigint[])[1 + g %% %(pairs)s %% %(n_endpoints)s], 'standard',
    500, 100, 200, 2.4, 1.0, x.ttft, x.tpot, x.ttft + 199 * x.tpot, x.status,
    x.status = 'ok' AND x.ttft <= 2000 AND x.tpot <= 100, x.ts - interval '10 seconds', x.ts, x.ts,
    '', '', 0.0, 0{extra_values}
FROM generate_series(%(first)s, %(last)s) AS g
CROSS JOIN LATERAL (
    SELECT ts, ttft, tpot,
        CASE
            WHEN r < (CASE WHEN g %% %(pairs)s %% %(n_endpoints)s %% 10 = 0 AND ts > %(now)s - interval '20 minutes'
                           THEN 0.2
                           WHEN g %% %(pairs)s %% %(n_endpoints)s %% 10 = 5 THEN 0.003
                           ELSE 0.0003 END) THEN 'upstream_error'
            WHEN r > 0.9995 THEN 'rate_limited'
            ELSE 'ok'
        END AS status
    FROM (SELECT {finished_at} AS ts, random() AS r,
                 150 + 900 * power(random(), 8) AS ttft, 20 + 90 * power(random(), 10) AS tpot
          WHERE g IS NOT NULL) AS draw
) AS x
"""


def run(*, quick: bool, plot: str | None, live: bool = False, progress=print, **options) -> dict:
    if connection.vendor != "postgresql":
        raise RuntimeError("bench slo needs PostgreSQL (it generates rows with generate_series)")
    rows = int(options.get("rows", QUICK_ROWS if quick else FULL_ROWS))
    n_slos = int(options.get("slos", 1000))
    n_endpoints = int(options.get("endpoints", 50))
    n_tenants = int(options.get("tenants", 20))
    ticks = int(options.get("ticks", 3))
    with transaction.atomic():
        figures = _run(rows, n_slos, n_endpoints, n_tenants, ticks, plot, progress, quick=quick, options=options)
        transaction.set_rollback(True)  # leave the database as it was
    progress("rolled back the generated data")
    return figures


@dataclass
class _World:
    """The bench's endpoints and tenants, and the clock every generated row and tick is placed against."""

    now: datetime
    stamp: int
    endpoints: list
    tenants: list

    @property
    def pairs(self) -> int:
        """(endpoint, tenant) pairs the generator cycles through: each g maps to (g mod E, g mod T)."""
        n_endpoints, n_tenants = len(self.endpoints), len(self.tenants)
        return n_endpoints * n_tenants // _gcd(n_endpoints, n_tenants)


def _run(
    rows: int, n_slos: int, n_endpoints: int, n_tenants: int, ticks: int, plot, progress, *, quick, options
) -> dict:
    world = _make_world(n_endpoints, n_tenants)
    progress(f"generating {rows:,} usage rows over 3 days on {world.pairs} (endpoint, tenant) pairs")
    generate_s = _generate(world, rows, progress)
    rollups = _roll_up(world, rows, progress, rerun=bool(quick or options.get("rerun")))
    slos = _make_slos(n_slos, world.endpoints, world.tenants, world.pairs)
    progress(f"{len(slos)} SLOs; evaluating {ticks} ticks")
    tick_seconds = []
    for tick in range(ticks):
        result = slo_evaluate_all(now=world.now + timedelta(seconds=30 + 60 * tick))
        tick_seconds.append(result.seconds)
        progress(f"  tick {tick + 1}: {result.seconds:.2f} s (opened {result.opened}, fired {result.fired})")
    scaling = _scaling(slos, world.now, progress) if plot else []
    if plot:
        _write_svg(plot, scaling)
        progress(f"wrote {plot}")
    bench_alerts = Alert.objects.filter(slo__in=slos)
    rollup_s = rollups.pop("rollup_s")
    return {
        "slos": len(slos),
        "usage_rows": UsageRecord.objects.filter(endpoint__in=world.endpoints).count(),
        "eval_seconds": round(tick_seconds[0], 3),
        "eval_seconds_steady": round(statistics.median(tick_seconds[1:] or tick_seconds), 3),
        "eval_tick_budget_used": round(max(tick_seconds) / 60, 4),
        "rollup_seconds_per_million": round(rollup_s / (rows / 1e6), 2),
        "rollup_seconds": round(rollup_s, 2),
        **rollups,
        "generate_seconds": round(generate_s, 1),
        "minute_rows": UsageMinute.objects.filter(endpoint__in=world.endpoints).count(),
        "alerts_firing": bench_alerts.filter(state="firing").count(),
        "alerts_pending": bench_alerts.filter(state="pending").count(),
        "pages_firing": bench_alerts.filter(state="firing", severity="page").count(),
        "tickets_firing": bench_alerts.filter(state="firing", severity="ticket").count(),
        "scaling": scaling,
    }


def _make_world(n_endpoints: int, n_tenants: int) -> _World:
    now = timezone.now()
    stamp = int(time.time())
    hardware, _ = HardwareProfile.objects.get_or_create(
        name="bench-slo-hw",
        defaults={"gpu_type": "H100", "gpu_memory_gb": 80, "memory_bandwidth_gbps": 3350, "usd_per_gpu_hour": 3.0},
    )
    model, _ = ModelProfile.objects.get_or_create(
        name="bench-slo-model",
        defaults={"parameters_b": 13, "n_layers": 40, "n_kv_heads": 8, "d_head": 128, "weights_gb": 26},
    )
    endpoints = Endpoint.objects.bulk_create(
        Endpoint(name=f"bench-slo-{stamp}-{i}", model_profile=model, hardware_profile=hardware)
        for i in range(n_endpoints)
    )
    tenants = Tenant.objects.bulk_create(
        Tenant(name=f"bench slo {stamp} {i}", slug=f"bench-slo-{stamp}-{i}") for i in range(n_tenants)
    )
    return _World(now=now, stamp=stamp, endpoints=endpoints, tenants=tenants)


def _insert(cursor, world: _World, *, finished_at: str, prefix: str, first: int, last: int) -> None:
    """Rows ``first``..``last`` of GENERATE_SQL, finishing at ``finished_at`` (IN_ORDER or LATE)."""
    extra = _default_columns()
    cursor.execute(
        GENERATE_SQL.format(
            finished_at=finished_at,
            extra_columns="".join(f", {column}" for column, _, _ in extra),
            extra_values="".join(f", %(default_{column})s::{db_type}" for column, db_type, _ in extra),
        ),
        {
            **{f"default_{column}": value for column, _, value in extra},
            "prefix": prefix,
            "tenant_ids": [t.pk for t in world.tenants],
            "endpoint_ids": [e.pk for e in world.endpoints],
            "pairs": world.pairs,
            "n_tenants": len(world.tenants),
            "n_endpoints": len(world.endpoints),
            "first": first,
            "last": last,
            "now": world.now,
        },
    )


def _default_columns() -> list[tuple[str, str, object]]:
    """(column, SQL type, default) of every usage column GENERATE_SQL does not fill itself."""
    return [
        (f.column, f.db_type(connection), f.get_default())
        for f in UsageRecord._meta.concrete_fields
        if not f.primary_key and f.column not in GENERATED_COLUMNS
    ]


GENERATOR_SEED = 0.42


def _generate(world: _World, rows: int, progress) -> float:
    """3 days of usage rows, in chunks; seconds taken."""
    started = time.perf_counter()
    fk_checks_skipped = _skip_fk_triggers()
    with connection.cursor() as cursor:
        cursor.execute("SELECT setseed(%s)", [GENERATOR_SEED])  # the same rows every run (random() is seeded)
        for first in range(1, rows + 1, CHUNK_ROWS):
            last = min(rows, first + CHUNK_ROWS - 1)
            finished_at = IN_ORDER.format(rows=rows)
            _insert(cursor, world, finished_at=finished_at, prefix=f"bench-slo-{world.stamp}-", first=first, last=last)
            progress(f"  {last:,} rows ({time.perf_counter() - started:.0f} s)")
        if fk_checks_skipped:
            cursor.execute("SET LOCAL session_replication_role = origin")
        cursor.execute("ANALYZE billing_usagerecord")
    return time.perf_counter() - started


def _roll_up(world: _World, rows: int, progress, *, rerun: bool) -> dict:
    """The first rollup (``rollup_s``), an idempotent re-run (with ``rerun``), then 1 % late rows rolled up."""
    started = time.perf_counter()
    rollup = usage_rollup_run(now=world.now)
    rollup_s = time.perf_counter() - started
    progress(f"rolled up {rows:,} rows into {rollup.minute_rows:,} minute rows in {rollup_s:.1f} s")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE billing_usageminute; ANALYZE billing_usagehour; ANALYZE billing_usageday")
    rerun_s = None
    if rerun:
        # A re-run with nothing new (it re-reads the previous run's ids, for transactions that committed late).
        started = time.perf_counter()
        usage_rollup_run(now=world.now)
        rerun_s = round(time.perf_counter() - started, 2)
    # Late records: 1 % more rows finishing over the last 3 hours, rolled up incrementally.
    late = max(1, rows // 100)
    with connection.cursor() as cursor:
        _insert(cursor, world, finished_at=LATE, prefix=f"bench-slo-{world.stamp}-late-", first=1, last=late)
    started = time.perf_counter()
    usage_rollup_run(now=world.now)
    return {
        "rollup_s": rollup_s,
        "rollup_rerun_seconds": rerun_s,
        "late_rows": late,
        "late_rollup_seconds": round(time.perf_counter() - started, 2),
    }


def _skip_fk_triggers() -> bool:
    """Generated rows reference rows made just above, so per-row foreign-key triggers only cost time (they double
    the insert rate's cost). Needs a superuser; without one the checks simply stay on."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL session_replication_role = replica")
        return True
    except DatabaseError:
        return False


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def _make_slos(n: int, endpoints, tenants, pairs: int) -> list[SLO]:
    slos = []
    for i in range(n):
        pair = i % pairs
        endpoint = endpoints[pair % len(endpoints)]
        kind = KINDS[i % len(KINDS)]
        slos.append(
            SLO(
                name=f"bench-{i}-{kind}",
                endpoint=endpoint,
                sli=kind,
                tenant=tenants[pair % len(tenants)] if i % 2 else None,
                objective=OBJECTIVES[(i // 4) % len(OBJECTIVES)],
                ttft_ms=TTFT_THRESHOLDS_MS[i % 3] if kind in ("ttft", "goodput") and i % 5 == 0 else None,
                tpot_ms=TPOT_THRESHOLDS_MS[i % 3] if kind in ("tpot", "goodput") and i % 5 == 0 else None,
            )
        )
    return SLO.objects.bulk_create(slos)


def _scaling(slos: list[SLO], now, progress) -> list[dict]:
    """Evaluation seconds against the number of enabled SLOs (the rest disabled), for the plot."""
    points = []
    ids = [s.pk for s in slos]
    for count in sorted({max(1, len(ids) // 8), len(ids) // 4, len(ids) // 2, len(ids)}):
        SLO.objects.filter(pk__in=ids[:count]).update(enabled=True)
        SLO.objects.filter(pk__in=ids[count:]).update(enabled=False)
        # The first tick after a change settles alerts (one save each); the second is the steady cost.
        slo_evaluate_all(now=now + timedelta(minutes=10))
        seconds = slo_evaluate_all(now=now + timedelta(minutes=10)).seconds
        points.append({"slos": count, "eval_seconds": round(seconds, 3)})
        progress(f"  {count} SLOs: {seconds:.2f} s")
    return points


def _write_svg(path: str, points: list[dict]) -> None:
    width, height, pad = 520, 320, 50
    max_x = max(p["slos"] for p in points) or 1
    max_y = max(max(p["eval_seconds"] for p in points), 1e-3) * 1.2

    def xy(p):
        return pad + (width - 2 * pad) * p["slos"] / max_x, height - pad - (height - 2 * pad) * p[
            "eval_seconds"
        ] / max_y

    path_d = " ".join(f"{'M' if i == 0 else 'L'}{x:.1f},{y:.1f}" for i, (x, y) in enumerate(map(xy, points)))
    dots = "".join(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3"/>' for x, y in map(xy, points))
    labels = "".join(
        f'<text x="{x:.1f}" y="{y - 8:.1f}" font-size="11" text-anchor="middle">{p["eval_seconds"]:.2f}s</text>'
        for p, (x, y) in zip(points, map(xy, points), strict=True)
    )
    svg = f"""<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif">
<rect width="100%" height="100%" fill="white"/>
<text x="{width / 2}" y="24" text-anchor="middle" font-size="14">Burn-rate evaluation tick vs enabled SLOs</text>
<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" stroke="black"/>
<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="black"/>
<text x="{width / 2}" y="{height - 12}" text-anchor="middle" font-size="12">SLOs (max {max_x})</text>
<text x="14" y="{height / 2}" font-size="12" transform="rotate(-90 14 {height / 2})" text-anchor="middle">seconds</text>
<path d="{path_d}" fill="none" stroke="#2563eb" stroke-width="2"/>{dots}{labels}
</svg>
"""
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(svg)
