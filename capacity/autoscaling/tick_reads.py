"""What a horizontal tick reads, for a batch of endpoints at once: a fixed number of SQL queries and two Redis round
trips per batch whatever its size, so a fleet of a thousand endpoints costs the workers a few batches' reads instead
of a thousand endpoints' worth of look-ups (docs/architecture.md#the-horizontal-tick-at-fleet-scale).

Each read answers what ``capacity.autoscaling.ticks`` used to ask per endpoint: the replicas, the scale pin, a
rollout in progress, the owner's quota left, the last applied moves up and down, the predictive floor's per-minute
history, the MU coefficients, and the demand window with this tick's sample appended.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from django.db.models import F, Max, Q, Sum

from billing.models import UsageMinute
from capacity.autoscaling import predictive, store
from capacity.autoscaling.demand import DemandSample, arrivals_since, sum_fresh_reports
from capacity.autoscaling.limits import QuotaLeft
from capacity.models import AutoscalerDecision, ScalePin
from capacity.unit_resolver import coefficients_by_endpoint
from capacity.units import MUCoefficients
from endpoints.models import ROLLOUT_ACTIVE_STATES, Endpoint, Replica, ReplicaState, Rollout
from tenants.quotas import LIVE_STATES, quota_for, replica_gpus_held

HORIZONTAL = AutoscalerDecision.Axis.HORIZONTAL
ACTIVE = (ReplicaState.PENDING, ReplicaState.STARTING, ReplicaState.READY)
DEFAULT_SECONDS_PER_REQUEST = 10.0
PREDICTIVE = predictive.PredictiveConfig()
_SAMPLE_FIELDS = tuple(DemandSample.__dataclass_fields__)
_SAMPLE_KEYS = frozenset(_SAMPLE_FIELDS)
# Counts (requests in flight, queued, arrived) are whole numbers: samples share one float object per value instead of
# each holding its own, about a third of a kept window's memory.
_WHOLE = {float(n): float(n) for n in range(4096)}


@dataclass(frozen=True)
class ReplicaRow:
    """The columns of a replica the horizontal tick decides on."""

    endpoint_id: int
    state: str
    role: str
    is_standby: bool
    terminate_at: datetime | None
    version_id: int | None
    actuator: str
    hardware_profile_id: int | None


@dataclass(frozen=True)
class FloorRows:
    """One endpoint's per-minute request counts: yesterday's (the shape) and the last minutes' (the trend and how
    long a request is in flight)."""

    history: dict[int, float]
    recent: dict[str, float]


class TickReads:
    """Everything the horizontal policy's inputs need for ``endpoints``, read once."""

    def __init__(self, endpoints: list[Endpoint], *, now: float) -> None:
        self.now = now
        ids = [e.pk for e in endpoints]
        self.replicas = _replicas(ids)
        self.pins = {pin.endpoint_id: pin for pin in ScalePin.objects.filter(endpoint_id__in=ids)}
        self.rollouts = set(
            Rollout.objects.filter(endpoint_id__in=ids, state__in=ROLLOUT_ACTIVE_STATES).values_list(
                "endpoint_id", flat=True
            )
        )
        self.last_up = _last_move(ids, Q(desired__gt=F("current")))
        self.last_down = _last_move(ids, Q(desired__lt=F("current")))
        self.floors = floor_rows(ids, now=now)
        self.coefficients = _coefficients(endpoints)
        self.quota_left = _quota_left(endpoints)
        self.windows, self.fresh = _demand_windows(ids, now=now)
        self.proxies_alive = store.proxies_alive() if ids else False

    def serving(self, endpoint: Endpoint) -> list[ReplicaRow]:
        """The endpoint's replicas of the version serving traffic (``services.serving_replicas``)."""
        version = endpoint.current_version_id
        rows = self.replicas.get(endpoint.pk, [])
        return rows if version is None else [r for r in rows if r.version_id in (None, version)]


def _replicas(ids: list[int]) -> dict[int, list[ReplicaRow]]:
    """Every live replica of the endpoints (pending to draining), oldest first."""
    out: dict[int, list[ReplicaRow]] = defaultdict(list)
    rows = (
        Replica.objects.filter(endpoint_id__in=ids, state__in=LIVE_STATES)
        .order_by("created_at")
        .values_list(*ReplicaRow.__dataclass_fields__)
    )
    for row in rows:
        out[row[0]].append(ReplicaRow(*row))
    return out


def _last_move(ids: list[int], direction: Q) -> dict[int, float]:
    """Each endpoint's newest applied horizontal move in ``direction`` (on PostgreSQL a walk of the partial indexes
    ``decision_last_up`` and ``decision_last_down``, which hold only the moves)."""
    rows = (
        AutoscalerDecision.objects.filter(direction, endpoint_id__in=ids, axis=HORIZONTAL, applied=True)
        .order_by()
        .values("endpoint_id")
        .annotate(last=Max("at"))
        .values_list("endpoint_id", "last")
    )
    return {endpoint_id: at.timestamp() for endpoint_id, at in rows}


def floor_rows(ids: list[int], *, now: float) -> dict[int, FloorRows]:
    """The predictive floor's per-minute rollups for every endpoint, both windows in one query."""
    cfg = PREDICTIVE
    at = datetime.fromtimestamp(now, tz=UTC)
    yesterday_end = cfg.period_s - cfg.lead_s - cfg.lookahead_margin_s - cfg.bucket_s
    old = (at - timedelta(seconds=cfg.period_s + cfg.trend_window_s), at - timedelta(seconds=yesterday_end))
    recent_start = at - timedelta(seconds=cfg.trend_window_s + cfg.bucket_s)
    rows = (
        UsageMinute.objects.filter(
            Q(start__gte=old[0], start__lt=old[1]) | Q(start__gte=recent_start, start__lt=at), endpoint_id__in=ids
        )
        .values("endpoint_id", "start")
        .annotate(
            n=Sum("requests"), ok=Sum("ok"), ttft=Sum("ttft_sum_ms"), tpot=Sum("tpot_sum_ms"), out=Sum("output_tokens")
        )
    )
    floors: dict[int, FloorRows] = {}
    for row in rows:
        floor = floors.setdefault(row["endpoint_id"], FloorRows({}, {"ok": 0, "ttft": 0.0, "tpot": 0.0, "out": 0}))
        start = row["start"]
        floor.history[predictive.bucket_of(start.timestamp(), cfg)] = (row["n"] or 0) / cfg.bucket_s
        if recent_start <= start < at:
            for key in floor.recent:
                floor.recent[key] += row[key] or 0
    return floors


def predicted_floor(rows: FloorRows | None, *, concurrency_limit: int, now: float) -> tuple[int, dict]:
    """The predictive floor from an endpoint's rollups (``_floor_rows``); Little's law sizes it with the mean time a
    request is in flight (mean TTFT plus mean output × mean TPOT), 10 s before any request finished."""
    rows = rows or FloorRows({}, {"ok": 0})
    recent, seconds = rows.recent, DEFAULT_SECONDS_PER_REQUEST
    if recent["ok"]:
        seconds = (recent["ttft"] + recent["tpot"] * recent["out"] / recent["ok"]) / recent["ok"] / 1000.0
        seconds = max(seconds, 0.1)
    floor, detail = predictive.predicted_floor(
        rows.history,
        now=now,
        target_concurrency=float(max(1, concurrency_limit)),
        seconds_per_request=seconds,
        cfg=PREDICTIVE,
    )
    return floor, {**detail, "seconds_per_request": round(seconds, 3)}


def _coefficients(endpoints: list[Endpoint]) -> dict[int, MUCoefficients | None]:
    try:
        return coefficients_by_endpoint(endpoints)
    except (ValueError, AttributeError, KeyError):
        return {}  # each endpoint then scales on requests (``ticks.mu_capacity_for`` says why in the log)


def _quota_left(endpoints: list[Endpoint]) -> dict[int, QuotaLeft]:
    """What each owned endpoint's tenant may still start, its own non-draining serving replicas left out (the
    decision counts those itself): ``services.quota_left(exclude_own_serving=True)`` for every endpoint at once."""
    owned = [e for e in endpoints if e.owner_tenant_id is not None]
    if not owned:
        return {}
    rows = Replica.objects.filter(
        endpoint__owner_tenant_id__in={e.owner_tenant_id for e in owned}, state__in=LIVE_STATES
    ).values_list("endpoint__owner_tenant_id", "endpoint_id", "is_standby", "state", replica_gpus_held())
    totals: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0])
    own: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for tenant_id, endpoint_id, is_standby, state, per_replica in rows:
        gpus = max(1, per_replica or 1)
        totals[tenant_id][1 if is_standby else 0] += 1
        totals[tenant_id][2] += gpus
        if not is_standby and state != ReplicaState.DRAINING:
            own[endpoint_id][0] += 1
            own[endpoint_id][1] += gpus
    left = {}
    for endpoint in owned:
        quota = quota_for(endpoint.owner_tenant)
        serving, standby, gpus = totals[endpoint.owner_tenant_id]
        mine = own.get(endpoint.pk, [0, 0])
        left[endpoint.pk] = QuotaLeft(
            serving=quota.max_replicas - (serving - mine[0]),
            standby=quota.max_warm_pool - standby,
            gpus=quota.max_gpus - (gpus - mine[1]),
        )
    return left


# Each worker process keeps the demand windows it read last (endpoint → the raw bytes of the window's newest sample
# and the window parsed): a later tick reads only the tail pushed since, found by that newest sample. A window holds
# up to ``store.SAMPLES_KEPT`` samples; read and parsed whole on every tick, it cost a tick most of its time.
_WINDOWS: dict[int, tuple[bytes, list[DemandSample]]] = {}
ARRIVALS_SEEN_TTL_S = 600  # the sampler's counters of a stopped beat outlive no restart of it
_TAIL_SLACK = 8  # samples beyond the sampler's one a second (ticks, wake-ups) a tail read allows for


def forget_windows() -> None:
    """Drop this process's copies of the demand windows (the next tick reads each whole)."""
    _WINDOWS.clear()


def _demand_windows(ids: list[int], *, now: float) -> tuple[dict[int, list[DemandSample]], dict[int, int]]:
    """This tick's demand sample of every endpoint appended to its window, and the windows read back (oldest first)
    with how many proxy reports were fresh for each sample."""
    tails = {endpoint_id: _tail_length(endpoint_id, now) for endpoint_id in ids}
    fresh, stored = _append(ids, now=now, tails=tails)
    windows, gaps = {}, []
    for i, endpoint_id in enumerate(ids):
        window = _merge(endpoint_id, stored[3 * i + 2], tails[endpoint_id])
        if window is None:
            gaps.append(endpoint_id)
        else:
            windows[endpoint_id] = window
    if gaps:  # more was pushed than the tail allowed for (or this process never read them): read them whole
        pipe = store.client().pipeline(transaction=False)
        for endpoint_id in gaps:
            pipe.lrange(store.SAMPLES_KEY.format(endpoint_id=endpoint_id), 0, -1)
        for endpoint_id, raws in zip(gaps, pipe.execute(), strict=True):
            windows[endpoint_id] = _merge(endpoint_id, raws, None)
    return windows, fresh


def _tail_length(endpoint_id: int, now: float) -> int:
    cached = _WINDOWS.get(endpoint_id)
    if cached is None or not cached[1]:
        return store.SAMPLES_KEPT
    behind = max(0.0, now - cached[1][-1].t)
    return min(store.SAMPLES_KEPT, int(behind * 1.5) + _TAIL_SLACK)


def _merge(endpoint_id: int, tail: list, asked: int | None) -> list[DemandSample] | None:
    """The window from its ``tail`` (the last ``asked`` samples; None: the whole list) and this process's copy;
    None when the tail does not reach back to the copy's newest sample."""
    tail = [_bytes(raw) for raw in tail]
    cached = _WINDOWS.get(endpoint_id)
    if asked is None or len(tail) < asked or asked >= store.SAMPLES_KEPT:
        window = parse_window(tail)  # the tail is the whole list
    elif cached is None:
        return None
    else:
        newest, known = cached
        try:
            at = len(tail) - 1 - tail[::-1].index(newest)
        except ValueError:
            return None
        window = (known + parse_window(tail[at + 1 :]))[-store.SAMPLES_KEPT :]
    if tail:
        _WINDOWS[endpoint_id] = (tail[-1], window)
    return window


def append_samples(ids: list[int], *, now: float) -> dict[int, int]:
    """The demand sampler's second (``ticks.sample_demand`` for many endpoints): each endpoint's proxies' fresh
    reports summed into one sample and appended to its window, in two round trips to Redis for the batch. Returns
    how many reports were fresh per endpoint."""
    return _append(ids, now=now, tails=None)[0]


def _append(ids: list[int], *, now: float, tails: dict[int, int] | None) -> tuple[dict[int, int], list]:
    """Append each endpoint's sample; with ``tails`` (a tick), read back that many of its newest samples. Without
    (the sampler, the arrivals' one writer), the sample carries the arrivals since the sampler's previous one."""
    if not ids:
        return {}, []
    c = store.client()
    reads, stride = c.pipeline(transaction=False), 2 if tails is not None else 3
    for endpoint_id in ids:
        reads.hgetall(store.DEMAND_KEY.format(endpoint_id=endpoint_id))
        reads.get(store.WAKE_KEY.format(endpoint_id=endpoint_id))
        if tails is None:
            reads.hgetall(store.ARRIVALS_SEEN_KEY.format(endpoint_id=endpoint_id))
    replies = reads.execute()
    writes = c.pipeline(transaction=False)
    fresh = {}
    for i, endpoint_id in enumerate(ids):
        reports, woken = _reports(replies[stride * i]), replies[stride * i + 1]
        sample, fresh[endpoint_id] = sum_fresh_reports(reports.values(), now=now)
        if woken is not None and sample.requests == 0:
            sample = replace(sample, queued=1)  # the activator saw a request waiting for a first replica
        if tails is None:
            arrivals, arrivals_mu, keep = arrivals_since(reports, _reports(replies[stride * i + 2]), now=now)
            sample = replace(sample, arrivals=arrivals, arrivals_mu=arrivals_mu)
            _keep_seen(writes, store.ARRIVALS_SEEN_KEY.format(endpoint_id=endpoint_id), keep)
        key = store.SAMPLES_KEY.format(endpoint_id=endpoint_id)
        writes.rpush(key, json.dumps(sample.as_dict()))
        writes.ltrim(key, -store.SAMPLES_KEPT, -1)
        if tails is not None:
            writes.lrange(key, -tails[endpoint_id], -1)
    return fresh, writes.execute()


def _keep_seen(pipe, key: str, keep: dict[str, list[float]]) -> None:
    pipe.delete(key)
    for process, figures in keep.items():
        pipe.hset(key, process, json.dumps(figures))
    pipe.expire(key, ARRIVALS_SEEN_TTL_S)


def _reports(raw: dict) -> dict:
    """A Redis hash of JSON values by field (a proxy process's report, or its counters last seen), the unreadable
    ones left out."""
    reports = {}
    for field, value in (raw or {}).items():
        try:
            report = json.loads(value)
        except (TypeError, ValueError):
            continue
        reports[field.decode() if isinstance(field, bytes) else str(field)] = report
    return reports


def parse_window(raws: list) -> list[DemandSample]:
    """Stored samples, oldest first; a corrupt one is skipped, not a crashed tick. One ``json.loads`` for the whole
    window (a window holds up to ``store.SAMPLES_KEPT`` samples: parsed one by one they cost a tick most of its
    time)."""
    try:
        parsed = json.loads(b"[" + b",".join(_bytes(raw) for raw in raws) + b"]")
    except (TypeError, ValueError):
        parsed = []
        for raw in raws:
            try:
                parsed.append(json.loads(raw))
            except (TypeError, ValueError):
                continue
    return [sample for s in parsed if (sample := _sample(s)) is not None]


def _sample(s) -> DemandSample | None:
    """One stored sample, or None for a corrupt one (not a dict, no finite ``t``, a value that is not a number)."""
    if type(s) is not dict or "t" not in s:
        return None
    try:
        if s.keys() <= _SAMPLE_KEYS and all(type(v) is float or type(v) is int for v in s.values()):
            # as the tick and the sampler store them: json.dumps of the sample's fields
            sample = DemandSample(**{k: _WHOLE.get(v, v) for k, v in s.items()})
        else:
            sample = DemandSample(*(_WHOLE.get(v, v) for v in (float(s.get(k, 0.0)) for k in _SAMPLE_FIELDS)))
    except (TypeError, ValueError):
        return None
    return sample if math.isfinite(sample.t) else None


def _bytes(raw) -> bytes:
    return raw if isinstance(raw, bytes) else str(raw).encode()
