"""The burn-rate evaluator: every SLO's burn rate per window from the rollups, its budget, and its stateful alerts.

One tick reads a handful of grouped queries over the rollup tiers (never raw usage), whatever the number of SLOs,
then walks each SLO's four window pairs through pending → firing → resolved. Alerts are saved one by one so the
console's ``post_save`` listener sees each change; notifications are queued once per alert event.
"""

import json
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from celery import signature
from django.db import IntegrityError, connection, transaction
from django.db.models.signals import post_save
from django.utils import timezone

from billing.models import SLO, Alert, AlertNotification, SLOStatus, Webhook
from billing.rollups import windows_sums
from billing.slo import (
    ALERT_FOR_S,
    TPOT_BOUNDS_MS,
    TTFT_BOUNDS_MS,
    WINDOW_PAIRS,
    WINDOWS_S,
    SliSpec,
    alert_step,
    budget_remaining,
    burn_rate,
    exhaustion_at,
    pair_condition,
    sli_counts,
)
from endpoints.models import Endpoint
from tenants.services import audit_log

logger = logging.getLogger("infercap.billing")

# The rollup counters an SLI can need; evaluation sums only these.
SLI_FIELDS: tuple[str, ...] = (
    "requests",
    "ok",
    "good",
    "rate_limited",
    "client_cancelled",
    *(f"ttft_le_{b}" for b in TTFT_BOUNDS_MS),
    *(f"tpot_le_{b}" for b in TPOT_BOUNDS_MS),
)
# The window the projected exhaustion time is extrapolated from.
PROJECTION_WINDOW = "1h"


@dataclass(frozen=True)
class EvaluationResult:
    slos: int
    opened: int
    fired: int
    resolved: int
    seconds: float
    skipped: bool = False


def slo_spec(slo: SLO) -> SliSpec:
    """The SLO's effective thresholds: its own, else its endpoint's."""
    endpoint = slo.endpoint
    return SliSpec(
        kind=slo.sli,
        objective=slo.objective,
        ttft_ms=slo.ttft_ms or endpoint.ttft_slo_ms,
        tpot_ms=slo.tpot_ms or endpoint.tpot_slo_ms,
        thresholds_are_endpoint_defaults=(slo.ttft_ms in (None, endpoint.ttft_slo_ms))
        and (slo.tpot_ms in (None, endpoint.tpot_slo_ms)),
    )


class _WindowTotals:
    """Rollup sums of one range, per (endpoint, tenant) and per endpoint (every tenant together)."""

    def __init__(self, per_pair: dict[tuple[int, int], dict[str, float]]):
        self.per_pair = per_pair
        self.per_endpoint: dict[int, dict[str, float]] = defaultdict(lambda: dict.fromkeys(SLI_FIELDS, 0))
        for (endpoint_id, _tenant_id), sums in per_pair.items():
            row = self.per_endpoint[endpoint_id]
            for name in SLI_FIELDS:
                row[name] += sums[name]

    def for_slo(self, slo: SLO) -> dict[str, float]:
        if slo.tenant_id:
            return self.per_pair.get((slo.endpoint_id, slo.tenant_id), {})
        return self.per_endpoint.get(slo.endpoint_id, {})


def _evaluation_end(now: datetime) -> datetime:
    # Windows end after the current (partial) minute so a burn shows up within the minute it starts.
    return now.replace(second=0, microsecond=0) + timedelta(minutes=1)


EVALUATION_LOCK = 7_240_001  # pg advisory lock key: one evaluation at a time across workers


def slo_evaluate_all(*, now: datetime | None = None) -> EvaluationResult:
    """One evaluation tick over every enabled SLO; a tick that finds another one running skips (returns skipped)."""
    started = time.perf_counter()
    now = now or timezone.now()
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [EVALUATION_LOCK])
                if not cursor.fetchone()[0]:
                    return EvaluationResult(0, 0, 0, 0, time.perf_counter() - started, skipped=True)
        counts = _evaluate(now)
    result = EvaluationResult(seconds=time.perf_counter() - started, **counts)
    logger.info("burn-rate evaluation: %s", result)
    return result


@dataclass
class _AlertChanges:
    created: list[Alert] = field(default_factory=list)
    transitioned: list[Alert] = field(default_factory=list)  # existing alerts whose state changed
    burning: list[Alert] = field(default_factory=list)  # existing alerts with new burn rates only
    events: list[tuple[Alert, str]] = field(default_factory=list)  # (alert, "firing" | "resolved") to notify


def _enabled_slos() -> list[SLO]:
    """Enabled SLOs with their endpoints, each endpoint built once (not once per SLO, as a join would)."""
    slos = list(SLO.objects.filter(enabled=True))
    endpoints = Endpoint.objects.in_bulk({slo.endpoint_id for slo in slos})
    slos = [slo for slo in slos if slo.endpoint_id in endpoints]  # an endpoint deleted in between takes its SLOs
    for slo in slos:
        slo.endpoint = endpoints[slo.endpoint_id]
    return slos


def _evaluate(now: datetime) -> dict[str, int]:
    end = _evaluation_end(now)
    slos = _enabled_slos()
    if not slos:
        changes = _AlertChanges()
        _resolve_orphans(changes, now)
        _apply(changes, now)
        return {"slos": 0, "opened": 0, "fired": 0, "resolved": len(changes.transitioned)}
    period_days = {slo.period_days for slo in slos}
    ranges = {label: (end - timedelta(seconds=seconds), end) for label, seconds in WINDOWS_S.items()}
    ranges |= {f"period-{days}d": (end - timedelta(days=days), end) for days in period_days}
    sums = windows_sums(ranges, fields=SLI_FIELDS, now=now)
    windows = {label: _WindowTotals(sums[label]) for label in WINDOWS_S}
    periods = {days: _WindowTotals(sums[f"period-{days}d"]) for days in period_days}
    open_alerts = {
        (a.slo_id, a.long_window, a.short_window): a
        for a in Alert.objects.filter(slo__enabled=True).exclude(state=Alert.State.RESOLVED)
    }
    statuses = []
    changes = _AlertChanges()
    figures: dict[tuple, tuple] = {}  # SLOs of one (endpoint, tenant) with the same SLI and period: computed once
    for slo in slos:
        spec = slo_spec(slo)
        signature = (slo.endpoint_id, slo.tenant_id, spec, slo.period_days)
        if signature not in figures:
            figures[signature] = _slo_figures(slo, spec, windows, periods[slo.period_days], now)
        burns, window_counts, period_good, period_valid, remaining, exhausts = figures[signature]
        statuses.append((slo.pk, now, burns, window_counts, period_good, period_valid, remaining, exhausts))
        for pair in WINDOW_PAIRS:
            alert = open_alerts.get((slo.id, pair.long_window, pair.short_window))
            _advance_alert(slo, pair, alert, burns, now, changes)
    _write_statuses(statuses)
    _resolve_orphans(changes, now)
    _apply(changes, now)
    fired = sum(1 for _, event in changes.events if event == "firing")
    return {
        "slos": len(slos),
        "opened": sum(1 for a in changes.created if a.state == Alert.State.PENDING),
        "fired": fired,
        "resolved": sum(1 for a in changes.transitioned if a.state == Alert.State.RESOLVED),
    }


def _slo_figures(slo: SLO, spec: SliSpec, windows: dict[str, _WindowTotals], period: _WindowTotals, now) -> tuple:
    """(burn rates, [good, valid] per window, period good and valid, budget remaining, projected exhaustion)."""
    burns: dict[str, float] = {}
    window_counts: dict[str, list[float]] = {}
    for label, totals in windows.items():
        good, valid = sli_counts(spec, totals.for_slo(slo))
        burns[label] = round(burn_rate(good, valid, spec.objective), 6)
        window_counts[label] = [good, valid]
    period_good, period_valid = sli_counts(spec, period.for_slo(slo))
    remaining = budget_remaining(period_good, period_valid, spec.objective)
    exhausts = exhaustion_at(
        remaining=remaining, burn=burns[PROJECTION_WINDOW], period_s=slo.period_days * 86400, now=now
    )
    return burns, window_counts, period_good, period_valid, remaining, exhausts


STATUS_COLUMNS = (
    "slo_id", "evaluated_at", "burn_rates", "window_counts", "period_good", "period_valid", "budget_remaining",
    "exhausts_at",
)  # fmt: skip
STATUS_STAGING = "billing_slostatus_staging"


def _write_statuses(statuses: list[tuple]) -> None:
    """Upsert every SLO's status (rows in STATUS_COLUMNS order). On PostgreSQL the rows are COPied into a staging
    table and upserted from it in one statement: at 10,000 SLOs, ``bulk_create(update_conflicts=True)`` spent about
    half the tick building model instances and quoting JSON arrays client-side."""
    if connection.vendor != "postgresql":
        SLOStatus.objects.bulk_create(
            [SLOStatus(**dict(zip(STATUS_COLUMNS, row, strict=True))) for row in statuses],
            update_conflicts=True,
            unique_fields=["slo"],
            update_fields=list(STATUS_COLUMNS[1:]),
            batch_size=500,
        )
        return
    names = ", ".join(STATUS_COLUMNS)
    updates = ", ".join(f"{name} = EXCLUDED.{name}" for name in STATUS_COLUMNS[1:])
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TEMP TABLE IF NOT EXISTS {STATUS_STAGING} ON COMMIT DELETE ROWS AS "
            f"SELECT {names} FROM billing_slostatus WITH NO DATA"
        )
        with cursor.cursor.copy(f"COPY {STATUS_STAGING} ({names}) FROM STDIN") as copy:
            for slo_id, at, burns, counts, good, valid, remaining, exhausts in statuses:
                copy.write_row((slo_id, at, json.dumps(burns), json.dumps(counts), good, valid, remaining, exhausts))
        cursor.execute(
            f"INSERT INTO billing_slostatus ({names}) SELECT {names} FROM {STATUS_STAGING} "
            f"ON CONFLICT (slo_id) DO UPDATE SET {updates}"
        )
        cursor.execute(f"DELETE FROM {STATUS_STAGING}")


def _advance_alert(slo: SLO, pair, alert: Alert | None, burns: dict[str, float], now: datetime, changes) -> None:
    """One state-machine step of the (SLO, pair) alert, recorded in ``changes`` (written in bulk afterwards)."""
    step = alert_step(
        state=alert.state if alert else None,
        condition=pair_condition(burns, pair),
        pending_since=alert.started_at if alert else None,
        now=now,
        for_s=ALERT_FOR_S[pair.severity],
    )
    long_burn, short_burn = burns[pair.long_window], burns[pair.short_window]
    if alert is None:
        if step.state is None:
            return
        alert = Alert(
            slo=slo, severity=pair.severity, state=step.state, long_window=pair.long_window,
            short_window=pair.short_window, burn_rate_threshold=pair.burn_rate, burn_rate_long=long_burn,
            burn_rate_short=short_burn, started_at=now, fired_at=now if step.state == Alert.State.FIRING else None,
        )  # fmt: skip
        changes.created.append(alert)
    else:
        alert.slo = slo
        moved = (alert.burn_rate_long, alert.burn_rate_short) != (long_burn, short_burn)
        alert.burn_rate_long, alert.burn_rate_short = long_burn, short_burn
        if step.state == alert.state:
            if moved:
                changes.burning.append(alert)
            return
        alert.state = step.state
        if step.state == Alert.State.FIRING:
            alert.fired_at = now
        elif step.state == Alert.State.RESOLVED:
            alert.resolved_at = now
        changes.transitioned.append(alert)
    if step.notify:
        changes.events.append((alert, step.notify))


def _resolve_orphans(changes: _AlertChanges, now: datetime) -> None:
    """Open alerts of SLOs that were disabled since they opened resolve (a firing one with a notification)."""
    for alert in (
        Alert.objects.filter(slo__enabled=False).exclude(state=Alert.State.RESOLVED).select_related("slo__endpoint")
    ):
        if alert.state == Alert.State.FIRING:
            changes.events.append((alert, "resolved"))
        alert.state, alert.resolved_at = Alert.State.RESOLVED, now
        changes.transitioned.append(alert)


def _apply(changes: _AlertChanges, now: datetime) -> None:
    """Write the tick's alert changes in a few statements, then tell ``post_save`` listeners (the console) and
    queue notifications, exactly as one-by-one saves would."""
    if changes.created:
        try:
            with transaction.atomic():
                Alert.objects.bulk_create(changes.created, batch_size=500)
        except IntegrityError:  # an alert opened meanwhile (manual evaluation): fall back to row by row
            kept = []
            for alert in changes.created:
                try:
                    with transaction.atomic():
                        alert.save(force_insert=True)
                    kept.append(alert)
                except IntegrityError:
                    alert.pk = None
            changes.created[:] = kept
            changes.events[:] = [(a, e) for a, e in changes.events if a.pk is not None]
    _write_alerts(changes.transitioned + changes.burning)
    for alert in changes.created:
        post_save.send(sender=Alert, instance=alert, created=True, update_fields=None, raw=False, using="default")
    for alert in changes.transitioned:
        post_save.send(sender=Alert, instance=alert, created=False, update_fields=None, raw=False, using="default")
    notifications_enqueue_many(changes.events, now=now)


def _write_alerts(alerts: list[Alert]) -> None:
    """Update state, timestamps and burn rates of many alerts, one statement per 1,000 on PostgreSQL."""
    fields = ["state", "fired_at", "resolved_at", "burn_rate_long", "burn_rate_short"]
    if connection.vendor != "postgresql":
        Alert.objects.bulk_update(alerts, fields, batch_size=500)
        return
    row = "(%s::bigint, %s::varchar, %s::timestamptz, %s::timestamptz, %s::double precision, %s::double precision)"
    for first in range(0, len(alerts), 1000):
        batch = alerts[first : first + 1000]
        params = [
            v for a in batch for v in (a.pk, a.state, a.fired_at, a.resolved_at, a.burn_rate_long, a.burn_rate_short)
        ]
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE billing_alert SET state = v.state, fired_at = v.fired_at, resolved_at = v.resolved_at, "
                "burn_rate_long = v.long_burn, burn_rate_short = v.short_burn "
                f"FROM (VALUES {', '.join([row] * len(batch))}) AS v(id, state, fired_at, resolved_at, long_burn, "
                "short_burn) WHERE billing_alert.id = v.id",
                params,
            )


def _hook_matches(hook: Webhook, alert: Alert) -> bool:
    if hook.severities and alert.severity not in hook.severities:
        return False
    return hook.tenant_id is None or hook.tenant_id in (alert.slo.tenant_id, alert.slo.endpoint.owner_tenant_id)


def webhooks_for(slo: SLO, severity: str) -> list[Webhook]:
    """Operators' webhooks, plus those of the SLO's tenant and of the endpoint's owner."""
    probe = Alert(slo=slo, severity=severity)
    return [h for h in Webhook.objects.filter(enabled=True) if _hook_matches(h, probe)]


def notifications_enqueue_many(events: list[tuple[Alert, str]], *, now: datetime | None = None) -> int:
    """Queue one notification per matching webhook and alert event; the unique constraint drops repeats."""
    if not events:
        return 0
    now = now or timezone.now()
    hooks = list(Webhook.objects.filter(enabled=True))
    rows = [
        AlertNotification(alert=alert, webhook=hook, event=event, next_attempt_at=now, created_at=now)
        for alert, event in events
        for hook in hooks
        if _hook_matches(hook, alert)
    ]
    if rows:
        AlertNotification.objects.bulk_create(rows, ignore_conflicts=True, batch_size=500)
        transaction.on_commit(_deliver_soon)
    return len(rows)


def notifications_enqueue(*, alert: Alert, event: str, now: datetime | None = None) -> int:
    return notifications_enqueue_many([(alert, event)], now=now)


def _deliver_soon() -> None:
    try:
        # By name (workers.tasks.billing.notifications_deliver): the task module imports this one.
        signature("billing.notifications_deliver").delay()
    except Exception:  # the broker being down must not break evaluation; the beat delivery picks them up
        logger.warning("could not enqueue notification delivery; the periodic task will send them", exc_info=True)


def alert_acknowledge(*, alert: Alert, user, note: str = "") -> Alert:
    """Mark an open alert as seen by a person (or a key: no acknowledging user then) and audit it; acknowledging
    twice keeps the first acknowledgement and records nothing more. Who may is the caller's check
    (``billing.selectors.alert_acknowledgeable_by``)."""
    if alert.acknowledged_at is None:
        with transaction.atomic():
            alert.acknowledged_at = timezone.now()
            alert.acknowledged_by = user if getattr(user, "pk", None) else None
            alert.save(update_fields=["acknowledged_at", "acknowledged_by"])
            audit_log(
                actor=user,
                action="alert.acknowledge",
                obj=alert,
                tenant=alert.slo.tenant,
                detail={"slo": alert.slo.name, "severity": alert.severity, "note": note},
            )
    return alert
