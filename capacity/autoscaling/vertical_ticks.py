"""The vertical tick (per-replica concurrency) for a batch of endpoints: a fixed number of SQL statements and Redis
round trips per batch whatever its size, every ready replica's ``/metrics`` scraped concurrently by the worker's one
HTTP client (``replica_scrapes``), the pure policy (``vertical``) per endpoint, the decisions written in one insert
(docs/algorithms.md#the-vertical-tick-at-fleet-scale).

Per replica, the TTFT and TPOT histograms are diffed against the previous tick's snapshot (``store.HIST_KEY``), so
the p95s cover the last cycle only. The policy's streaks (consecutive overloaded or healthy cycles) are kept in Redis
beside them (``STREAK_KEY``); an endpoint without one there (a new endpoint, Redis emptied) reads them from its last
vertical decision, as the tick always stored them there too.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import logging
import struct
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import NamedTuple

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import BooleanField, ExpressionWrapper, Max, Q
from django.utils import timezone
from psycopg.types.json import Jsonb

from capacity.autoscaling import replica_metrics, replica_scrapes, store, vertical
from capacity.autoscaling.services import ACTIVE
from capacity.models import AutoscalerDecision
from endpoints.models import Endpoint, Replica, ReplicaState

log = logging.getLogger(__name__)

VERTICAL = AutoscalerDecision.Axis.VERTICAL
STREAK_KEY = "infercap:autoscale:vertical-streak:{endpoint_id}"
STREAK_TTL_S = 86_400  # longer than any pause of the beat; past it the last decision answers
HIST_TTL_S = 3600
# Replicas read an endpoint (INFERCAP["AUTOSCALE_VERTICAL_SAMPLE"]; 0: all): see vertical.sample_replicas and
# docs/algorithms.md#the-vertical-tick-at-fleet-scale for the cost and what the sample changes.
SAMPLE = 3
# A snapshot older than two and a half cycles (workers.tasks.autoscaling.VERTICAL_S, 30 s) is not the replica's
# previous cycle: it left the sample and came back, or the tick stopped for a while.
SNAPSHOT_FRESH_S = 75.0
YOUNG_S = 45.0  # ready for less than a cycle and a half: a replica's first read counts its histograms whole
# What the tick reads of an endpoint, and what saving a new limit sends to post_save's listeners (the console's
# event: name, desired replicas, owner): the whole row, launch options and all, cost a third of the per-endpoint time.
_ENDPOINT_FIELDS = (
    "name", "owner_tenant_id", "desired_replicas", "concurrency_limit", "concurrency_min", "concurrency_max",
    "ttft_slo_ms", "tpot_slo_ms", "updated_at",
)  # fmt: skip
_HEAD = struct.Struct("<dHH")  # a snapshot's time and its two histograms' bucket counts


def vertical_tick(*, endpoint_id: int, tick: str) -> AutoscalerDecision | None:
    """One endpoint's vertical tick (a batch of one); None when another worker owns this tick or Redis (lock,
    histogram snapshots) cannot be reached."""
    return vertical_ticks(endpoint_ids=[endpoint_id], tick=tick).get(endpoint_id)


def vertical_ticks(*, endpoint_ids, tick: str, sample: int | None = None) -> dict[int, AutoscalerDecision | None]:
    """Adjust the concurrency limit of each endpoint of the batch. Endpoints another worker holds, already decided
    for this tick, or whose decision failed (logged) are left out; one endpoint's failure leaves the others theirs.
    ``sample``: replicas read an endpoint (None: ``AUTOSCALE_VERTICAL_SAMPLE``; 0: all)."""
    ids = list(dict.fromkeys(endpoint_ids))
    try:
        with _collector_paused():
            return _vertical_ticks(ids, tick=tick, sample=_sample_size() if sample is None else max(0, sample))
    except store.RedisError as exc:
        log.warning("autoscaler: vertical tick %s for %d endpoints skipped: Redis: %s", tick, len(ids), exc)
        return {}


@contextlib.contextmanager
def _collector_paused():
    """Python's cyclic garbage collector held off for one batch. A batch keeps its scrapes, histograms and rows
    alive until it ends, so the collector's passes during it found nothing to free, yet each older-generation pass
    walked the worker's whole heap (Django and every module): a fifth to a quarter of the tick's CPU at 1,000
    endpoints (docs/algorithms.md#the-vertical-tick-at-fleet-scale). What the batch leaves in cycles is collected
    after it."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@dataclass
class _Plan:
    endpoint: Endpoint
    decision: vertical.VerticalDecision
    record: dict


def _vertical_ticks(ids: list[int], *, tick: str, sample: int) -> dict[int, AutoscalerDecision | None]:
    with store.TickLocks(axis=VERTICAL, endpoint_ids=ids) as locks:
        if not locks.held:
            return {}
        decided = AutoscalerDecision.objects.filter(endpoint_id__in=locks.held, axis=VERTICAL, tick=tick)
        todo = set(locks.held) - set(decided.values_list("endpoint_id", flat=True))
        endpoints = list(Endpoint.objects.filter(pk__in=todo).only(*_ENDPOINT_FIELDS).order_by("pk"))
        scrapes = _scrapes(_sample(_ready_replicas([e.pk for e in endpoints]), sample))
        streaks = _streaks([e.pk for e in endpoints])
        plans = []
        for endpoint in endpoints:
            try:
                inputs = vertical_inputs(endpoint, scrapes=scrapes.get(endpoint.pk, []), state=streaks[endpoint.pk])
                plans.append(_plan(endpoint, inputs))
            except Exception:
                # One endpoint's bad row or signal must not cost the batch's others their tick.
                log.exception("autoscaler: vertical tick %s for endpoint %s failed", tick, endpoint.pk)
        rows = _store_plans(plans, tick=tick)
        try:
            _save_streaks({p.endpoint.pk: p.decision.state for p in plans if rows.get(p.endpoint.pk) is not None})
        except store.RedisError as exc:
            # The decisions are stored: apply them. The streaks Redis still holds are one tick old, which at worst
            # delays the next move by a tick.
            log.warning("autoscaler: vertical tick %s: streaks not saved: Redis: %s", tick, exc)
        applied = []
        for plan in plans:
            row = rows.get(plan.endpoint.pk)
            if row is None or row.applied:
                continue
            try:
                _apply(plan)
                applied.append(row.pk)
                row.applied = True
            except Exception:
                log.exception("autoscaler: applying vertical tick %s to endpoint %s failed", tick, plan.endpoint.pk)
        if applied:
            AutoscalerDecision.objects.filter(pk__in=applied).update(applied=True)
        return rows


def _plan(endpoint: Endpoint, inputs: vertical.VerticalInputs) -> _Plan:
    decision = vertical.decide(inputs)
    record = {
        **decision.inputs,
        "overload_streak": decision.state.overload_streak,
        "healthy_streak": decision.state.healthy_streak,
    }
    return _Plan(endpoint, decision, record)


@dataclass(frozen=True)
class ReplicaScrape:
    """One ready replica's scrape this tick: the gauges, and the TTFT and TPOT counts since its previous scrape."""

    running: float
    waiting: float
    kv_usage: float
    ttft: dict[float, float]
    tpot: dict[float, float]


class _Ready(NamedTuple):
    pk: int
    endpoint_id: int
    url: str
    role: str
    young: bool  # ready for less than a cycle: its counts since it started are about one cycle's


def _ready_replicas(endpoint_ids: list[int]) -> list[_Ready]:
    """Every ready serving replica of the endpoints, in each endpoint's replica order. Whether it is young is
    compared in the query: 10,000 timestamps read into Python cost the tick 30-80 ms."""
    if not endpoint_ids:
        return []
    since = timezone.now() - timedelta(seconds=YOUNG_S)
    rows = (
        Replica.objects.filter(endpoint_id__in=endpoint_ids, state=ReplicaState.READY, is_standby=False)
        .annotate(young=ExpressionWrapper(Q(state_changed_at__gte=since), output_field=BooleanField()))
        .order_by("endpoint_id", "name")
        .values_list("pk", "endpoint_id", "url", "role", "young")
    )
    return [_Ready._make(row) for row in rows]


def _sample_size() -> int:
    return max(0, int(getattr(settings, "INFERCAP", {}).get("AUTOSCALE_VERTICAL_SAMPLE", SAMPLE)))


def _sample(replicas: list[_Ready], size: int) -> list[_Ready]:
    """The replicas this tick reads: ``vertical.sample_replicas`` of each endpoint's replicas of each role (a
    disaggregated endpoint's prefill replicas run no decode, so a sample of them alone would say nothing of TPOT)."""
    groups: dict[tuple[int, str], list[_Ready]] = {}
    for row in replicas:
        groups.setdefault((row.endpoint_id, row.role), []).append(row)
    read = []
    for rows in groups.values():
        keep = set(vertical.sample_replicas([r.pk for r in rows], size))
        read.extend(r for r in rows if r.pk in keep)
    return read


def _scrapes(replicas: list[_Ready]) -> dict[int, list[ReplicaScrape]]:
    """Each endpoint's replicas that answered, scraped concurrently, diffed against their previous snapshots; the
    new snapshots stored. Two Redis round trips for the batch. A replica without a snapshot younger than
    ``SNAPSHOT_FRESH_S`` gives its histograms only if it is young (its counts since it started are this cycle's);
    any other (new to the sample, back in it after a while, an endpoint read whole again after its sample, a
    snapshot lost) gives its gauges only this cycle."""
    reachable = [r for r in replicas if r.url]
    texts = replica_scrapes.fetch_many([r.url for r in reachable], decode=False)
    c = store.client()
    # One MGET: a command per key costs the client about 10 µs to pack and parse, an argument under 1
    before = c.mget([store.HIST_KEY.format(replica_id=r.pk) for r in reachable]) if reachable else []
    snapshots = {}
    now = time.time()
    out: dict[int, list[ReplicaScrape]] = {}
    for (replica_id, endpoint_id, _, _, young), text, raw in zip(reachable, texts, before, strict=True):
        if text is None:
            continue  # did not answer: skipped this cycle, its snapshot kept for the next
        scrape = replica_metrics.parse(text)
        at, before_ttft, before_tpot = _unpack(raw)
        now_ttft, now_tpot = scrape.buckets(replica_metrics.TTFT), scrape.buckets(replica_metrics.TPOT)
        counted = (at is None and young) or (at is not None and 0 <= now - at <= SNAPSHOT_FRESH_S)
        out.setdefault(endpoint_id, []).append(
            ReplicaScrape(
                running=scrape.running,
                waiting=scrape.waiting,
                kv_usage=scrape.kv_usage,
                ttft=replica_metrics.diff(now_ttft, before_ttft) if counted else {},
                tpot=replica_metrics.diff(now_tpot, before_tpot) if counted else {},
            )
        )
        try:
            snapshot = _pack(now, now_ttft, now_tpot)
        except struct.error:  # more than 65,535 bounds: not vLLM's exposition; no snapshot, so never counted
            log.warning("autoscaler: replica %s: histograms too large to keep", replica_id)
            continue
        snapshots[store.HIST_KEY.format(replica_id=replica_id)] = snapshot
    store.set_many(snapshots, ttl_s=HIST_TTL_S)
    return out


def vertical_inputs(
    endpoint: Endpoint, *, scrapes: list[ReplicaScrape], state: vertical.VerticalState
) -> vertical.VerticalInputs:
    """The policy's inputs from the endpoint's row and its replicas' scrapes this tick (pure)."""
    seen = len(scrapes)
    kv = [s.kv_usage for s in scrapes]
    p95_ttft = replica_metrics.quantile(replica_metrics.merge(s.ttft for s in scrapes))
    p95_tpot = replica_metrics.quantile(replica_metrics.merge(s.tpot for s in scrapes))
    return vertical.VerticalInputs(
        current_limit=endpoint.concurrency_limit,
        # Bounds a SQL update can leave inverted or at 0 (the model's validators only run on full_clean): decide()
        # refuses them, which crashed the tick every 30 s; the maximum wins
        min_limit=max(1, min(endpoint.concurrency_min, endpoint.concurrency_max)),
        max_limit=max(1, endpoint.concurrency_max),
        ttft_slo_ms=endpoint.ttft_slo_ms,
        tpot_slo_ms=endpoint.tpot_slo_ms,
        ttft_p95_ms=None if p95_ttft is None else p95_ttft * 1000,
        tpot_p95_ms=None if p95_tpot is None else p95_tpot * 1000,
        kv_usage=max(kv) if kv else None,
        waiting_per_replica=sum(s.waiting for s in scrapes) / seen if seen else None,
        busy_fraction=sum(s.running for s in scrapes) / (seen * max(1, endpoint.concurrency_limit)) if seen else None,
        state=state,
    )


def _streaks(endpoint_ids: list[int]) -> dict[int, vertical.VerticalState]:
    """Each endpoint's streaks: from Redis in one round trip; those missing there from their last vertical
    decision (two queries, only when some are missing)."""
    if not endpoint_ids:
        return {}
    stored = store.client().mget([STREAK_KEY.format(endpoint_id=endpoint_id) for endpoint_id in endpoint_ids])
    out, missing = {}, []
    for endpoint_id, raw in zip(endpoint_ids, stored, strict=True):
        state = _state(_loads(raw))
        if state is None:
            missing.append(endpoint_id)
        else:
            out[endpoint_id] = state
    if missing:
        last = (
            AutoscalerDecision.objects.filter(endpoint_id__in=missing, axis=VERTICAL)
            .order_by()
            .values("endpoint_id")
            .annotate(last=Max("id"))
            .values_list("last", flat=True)
        )
        rows = AutoscalerDecision.objects.filter(pk__in=list(last)).values_list("endpoint_id", "inputs")
        stored = {endpoint_id: inputs or {} for endpoint_id, inputs in rows}
        for endpoint_id in missing:
            out[endpoint_id] = _state(stored.get(endpoint_id, {})) or vertical.VerticalState()
    return out


def _state(record: dict) -> vertical.VerticalState | None:
    try:
        return vertical.VerticalState(
            overload_streak=int(record["overload_streak"]), healthy_streak=int(record["healthy_streak"])
        )
    except (KeyError, TypeError, ValueError):
        return None


def _save_streaks(states: dict[int, vertical.VerticalState]) -> None:
    if not states:
        return
    values = {
        STREAK_KEY.format(endpoint_id=endpoint_id): json.dumps(
            {"overload_streak": state.overload_streak, "healthy_streak": state.healthy_streak}
        )
        for endpoint_id, state in states.items()
    }
    store.set_many(values, ttl_s=STREAK_TTL_S)


def _store_plans(plans: list[_Plan], *, tick: str) -> dict[int, AutoscalerDecision | None]:
    """Every plan's decision in one insert, a hold stored applied (nothing to change). Should another worker have
    stored one meanwhile (the unique tick constraint), each is stored alone and that endpoint skipped."""
    rows = [
        AutoscalerDecision(
            endpoint=p.endpoint,
            axis=VERTICAL,
            tick=tick,
            current=p.decision.current,
            desired=p.decision.desired,
            reason=p.decision.reason[:255],
            inputs=p.record,
            applied=p.decision.desired == p.endpoint.concurrency_limit,
        )
        for p in plans
    ]
    try:
        with transaction.atomic():
            _insert(rows)
        return {row.endpoint_id: row for row in rows}
    except IntegrityError:
        stored = {}
        for row in rows:
            try:
                with transaction.atomic():
                    row.save(force_insert=True)
                stored[row.endpoint_id] = row
            except IntegrityError:
                log.info("autoscaler: vertical decision for endpoint %s tick %s already stored", row.endpoint_id, tick)
                stored[row.endpoint_id] = None
        return stored


_COLUMNS = ("id", "endpoint_id", "at", "axis", "current", "desired", "reason", "inputs", "applied", "tick")


def _insert(rows: list[AutoscalerDecision]) -> None:
    """The rows in one insert, their ids set. On PostgreSQL the ids are drawn from the table's sequence in one query
    and the rows sent by ``COPY``, whose rows psycopg formats in C: ``bulk_create`` quoted every value in Python,
    40-50 ms a tick at 1,000 endpoints (docs/algorithms.md#the-vertical-tick-at-fleet-scale)."""
    if not rows:
        return
    if connection.vendor != "postgresql":
        AutoscalerDecision.objects.bulk_create(rows)
        return
    table = AutoscalerDecision._meta.db_table
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT nextval(pg_get_serial_sequence(%s, 'id')) FROM generate_series(1, %s)", [table, len(rows)]
        )
        ids = [pk for (pk,) in cursor.fetchall()]
        statement = f"COPY {quote(table)} ({', '.join(map(quote, _COLUMNS))}) FROM STDIN"
        with connection.wrap_database_errors, cursor.cursor.copy(statement) as copy:
            for pk, row in zip(ids, rows, strict=True):
                copy.write_row(
                    (pk, row.endpoint_id, row.at, row.axis, row.current, row.desired, row.reason, Jsonb(row.inputs),
                     row.applied, row.tick)
                )  # fmt: skip
    for pk, row in zip(ids, rows, strict=True):
        row.pk = pk
        row._state.adding, row._state.db = False, connection.alias


def _apply(plan: _Plan) -> None:
    endpoint, desired = plan.endpoint, plan.decision.desired
    with transaction.atomic():
        endpoint.concurrency_limit = desired
        endpoint.save(update_fields=["concurrency_limit", "updated_at"])  # bumps the proxies' snapshot
        endpoint.replicas.filter(state__in=ACTIVE).update(concurrency_limit=desired)


def _loads(raw) -> dict:
    try:
        value = json.loads(raw) if raw else {}
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _pack(now: float, ttft: dict[float, float], tpot: dict[float, float]) -> bytes:
    """A replica's snapshot: when, then each histogram's (bound, cumulative count) pairs as doubles (infinity
    included). Packed rather than JSON: 2 µs against 40 a replica each way, a tenth of the tick at 10,000 replicas."""
    values = [*itertools.chain.from_iterable(ttft.items()), *itertools.chain.from_iterable(tpot.items())]
    return _HEAD.pack(now, len(ttft), len(tpot)) + struct.pack(f"<{len(values)}d", *values)


def _unpack(raw) -> tuple[float | None, dict[float, float] | None, dict[float, float] | None]:
    """(when, TTFT, TPOT) of a stored snapshot; (None, None, None) for none, or one that is not ours (a value of
    another shape, or an earlier release's JSON): the replica then gives its gauges only that cycle."""
    try:
        at, n_ttft, n_tpot = _HEAD.unpack_from(raw)
        pairs = 2 * (n_ttft + n_tpot)
        if len(raw) != _HEAD.size + 8 * pairs:
            return None, None, None
        values = struct.unpack_from(f"<{pairs}d", raw, _HEAD.size)
    except (struct.error, TypeError):
        return None, None, None
    split = 2 * n_ttft  # the pairs are whole (the length is checked above)
    ttft = dict(zip(values[0:split:2], values[1:split:2], strict=True))
    return at, ttft, dict(zip(values[split::2], values[split + 1 :: 2], strict=True))
