"""The burn-rate evaluator: every SLO's burn rate per window from the rollups, its budget, and its stateful alerts.

One tick reads a handful of grouped queries over the rollup tiers (never raw usage), whatever the number of SLOs,
then walks each SLO's four window pairs through pending → firing → resolved. Alerts are saved one by one so the
console's ``post_save`` listener sees each change; notifications are queued once per alert event.
"""

import logging
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import IntegrityError, connection, transaction
from django.db.models import Q
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
            for field in SLI_FIELDS:
                row[field] += sums[field]

    def for_slo(self, slo: SLO) -> dict[str, float]:
        if slo.tenant_id:
            return self.per_pair.get((slo.endpoint_id, slo.tenant_id), {})
        return self.per_endpoint.get(slo.endpoint_id, {})


def _evaluation_end(now: datetime) -> datetime:
    # Windows end after the current (partial) minute so a burn shows up within the minute it starts.
    return now.replace(second=0, microsecond=0) + timedelta(minutes=1)


def slo_evaluate_all(*, now: datetime | None = None) -> EvaluationResult:
    """One evaluation tick over every enabled SLO."""
    started = time.perf_counter()
    now = now or timezone.now()
    end = _evaluation_end(now)
    slos = list(SLO.objects.filter(enabled=True).select_related("endpoint"))
    if not slos:
        return EvaluationResult(0, 0, 0, 0, time.perf_counter() - started)
    ranges = {label: (end - timedelta(seconds=seconds), end) for label, seconds in WINDOWS_S.items()}
    ranges |= {f"period-{days}d": (end - timedelta(days=days), end) for days in {slo.period_days for slo in slos}}
    sums = windows_sums(ranges, fields=SLI_FIELDS, now=now)
    windows = {label: _WindowTotals(sums[label]) for label in WINDOWS_S}
    periods = {days: _WindowTotals(sums[f"period-{days}d"]) for days in {slo.period_days for slo in slos}}
    open_alerts = {
        (a.slo_id, a.long_window, a.short_window): a
        for a in Alert.objects.filter(slo__enabled=True).exclude(state=Alert.State.RESOLVED)
    }
    statuses = []
    counts = {"opened": 0, "fired": 0, "resolved": 0}
    burning: list[Alert] = []  # open alerts whose state holds; their burn rates are refreshed in one statement
    for slo in slos:
        spec = slo_spec(slo)
        burns: dict[str, float] = {}
        window_counts: dict[str, list[float]] = {}
        for label, totals in windows.items():
            good, valid = sli_counts(spec, totals.for_slo(slo))
            burns[label] = round(burn_rate(good, valid, spec.objective), 6)
            window_counts[label] = [good, valid]
        period_good, period_valid = sli_counts(spec, periods[slo.period_days].for_slo(slo))
        remaining = budget_remaining(period_good, period_valid, spec.objective)
        statuses.append(
            SLOStatus(
                slo=slo,
                evaluated_at=now,
                burn_rates=burns,
                window_counts=window_counts,
                period_good=period_good,
                period_valid=period_valid,
                budget_remaining=remaining,
                exhausts_at=exhaustion_at(
                    remaining=remaining, burn=burns[PROJECTION_WINDOW], period_s=slo.period_days * 86400, now=now
                ),
            )
        )
        for pair in WINDOW_PAIRS:
            alert = open_alerts.get((slo.id, pair.long_window, pair.short_window))
            outcome = _advance_alert(slo, pair, alert, burns, now)
            if outcome == "burning":
                burning.append(alert)
            elif outcome:
                counts[outcome] += 1
    SLOStatus.objects.bulk_create(
        statuses,
        update_conflicts=True,
        unique_fields=["slo"],
        update_fields=[
            "evaluated_at",
            "burn_rates",
            "window_counts",
            "period_good",
            "period_valid",
            "budget_remaining",
            "exhausts_at",
        ],
        batch_size=500,
    )
    _update_burn_rates(burning)
    result = EvaluationResult(slos=len(slos), seconds=time.perf_counter() - started, **counts)
    logger.info("burn-rate evaluation: %s", result)
    return result


def _advance_alert(slo: SLO, pair, alert: Alert | None, burns: dict[str, float], now: datetime) -> str | None:
    """Apply one state-machine step to the (SLO, pair) alert.

    Returns "opened", "fired" or "resolved" after a transition (saved one by one, so ``post_save`` listeners see
    it), "burning" when an open alert only has new burn rates (the caller bulk-updates those), else None.
    """
    condition = pair_condition(burns, pair)
    step = alert_step(
        state=alert.state if alert else None,
        condition=condition,
        pending_since=alert.started_at if alert else None,
        now=now,
        for_s=ALERT_FOR_S[pair.severity],
    )
    long_burn, short_burn = burns[pair.long_window], burns[pair.short_window]
    if alert is None:
        if step.state is None:
            return None
        try:
            with transaction.atomic():
                alert = Alert.objects.create(
                    slo=slo,
                    severity=pair.severity,
                    state=step.state,
                    long_window=pair.long_window,
                    short_window=pair.short_window,
                    burn_rate_threshold=pair.burn_rate,
                    burn_rate_long=long_burn,
                    burn_rate_short=short_burn,
                    started_at=now,
                    fired_at=now if step.state == Alert.State.FIRING else None,
                )
        except IntegrityError:  # another evaluator opened it first: the constraint deduplicates
            return None
        if step.notify:
            notifications_enqueue(alert=alert, event=step.notify, now=now)
            return "fired"
        return "opened"
    changed = step.state != alert.state
    alert.burn_rate_long, alert.burn_rate_short = long_burn, short_burn
    if not changed:
        return "burning"  # only the burn rates moved: saved in bulk by the caller, no event
    fields = ["burn_rate_long", "burn_rate_short"]
    if changed:
        alert.state = step.state
        fields.append("state")
        if step.state == Alert.State.FIRING:
            alert.fired_at = now
            fields.append("fired_at")
        elif step.state == Alert.State.RESOLVED:
            alert.resolved_at = now
            fields.append("resolved_at")
    alert.save(update_fields=fields)
    if step.notify:
        notifications_enqueue(alert=alert, event=step.notify, now=now)
    if not changed:
        return None
    return "fired" if step.state == Alert.State.FIRING else "resolved"


def _update_burn_rates(alerts: list[Alert]) -> None:
    """Refresh open alerts' burn rates in one statement per 1,000 (no per-row save, no event: nothing changed state)."""
    if connection.vendor != "postgresql":
        Alert.objects.bulk_update(alerts, ["burn_rate_long", "burn_rate_short"], batch_size=500)
        return
    for first in range(0, len(alerts), 1000):
        batch = alerts[first : first + 1000]
        values = ", ".join(["(%s::bigint, %s::double precision, %s::double precision)"] * len(batch))
        params = [v for a in batch for v in (a.pk, a.burn_rate_long, a.burn_rate_short)]
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE billing_alert SET burn_rate_long = v.l, burn_rate_short = v.s "
                f"FROM (VALUES {values}) AS v(id, l, s) WHERE billing_alert.id = v.id",
                params,
            )


def webhooks_for(slo: SLO, severity: str) -> list[Webhook]:
    """Operators' webhooks, plus those of the SLO's tenant and of the endpoint's owner."""
    tenant_ids = {t for t in (slo.tenant_id, slo.endpoint.owner_tenant_id) if t}
    hooks = Webhook.objects.filter(enabled=True).filter(Q(tenant__isnull=True) | Q(tenant_id__in=tenant_ids))
    return [h for h in hooks if not h.severities or severity in h.severities]


def notifications_enqueue(*, alert: Alert, event: str, now: datetime | None = None) -> int:
    """Queue one notification per matching webhook for this alert event; a second call for the same event adds none."""
    now = now or timezone.now()
    created = 0
    for hook in webhooks_for(alert.slo, alert.severity):
        _, was_created = AlertNotification.objects.get_or_create(
            alert=alert, webhook=hook, event=event, defaults={"next_attempt_at": now, "created_at": now}
        )
        created += was_created
    if created:
        transaction.on_commit(_deliver_soon)
    return created


def _deliver_soon() -> None:
    from workers.tasks.billing import notifications_deliver  # the task module imports this one

    try:
        notifications_deliver.delay()
    except Exception:  # the broker being down must not break evaluation; the beat delivery picks them up
        logger.warning("could not enqueue notification delivery; the periodic task will send them", exc_info=True)


def alert_acknowledge(*, alert: Alert, user) -> Alert:
    """Mark an open alert as seen by a person; acknowledging twice keeps the first acknowledgement."""
    if alert.acknowledged_at is None:
        alert.acknowledged_at = timezone.now()
        alert.acknowledged_by = user if getattr(user, "pk", None) else None
        alert.save(update_fields=["acknowledged_at", "acknowledged_by"])
    return alert
