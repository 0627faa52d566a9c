"""Dollar spend of API keys and tenants against their budgets (docs/security.md, "Budgets").

Spend is the MU the usage records hold, priced at the usage rate (``statements.prices``: the overage price per
1,000 MU), over the budget's period: the key's UTC day or month, the tenant's month. The proxies count the same
figure in Redis as they serve (``gateway.proxy.budgets``); ``budget_counters_sync`` (every minute) raises each
counter to what the records say, so a counter Redis lost is back within a minute, and raises a tenant's soft alert
(an audit entry and its webhooks, once a month) when its spend passes ``budget_alert_fraction`` of its budget.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx
import redis
from django.conf import settings
from django.db.models import Q, Sum
from django.utils import timezone

from billing.models import UsageRecord, Webhook
from billing.notifiers import TIMEOUT_S, post_event
from billing.statements import prices
from tenants.models import ApiKey, AuditEntry, BudgetPeriod, Tenant
from tenants.services import audit_log

log = logging.getLogger(__name__)

ALERT_ACTION = "tenant.budget_alert"
# Raise a counter to the records' figure, never lower it: the proxies may have counted requests not yet written.
_RAISE = (
    "local cur = tonumber(redis.call('get', KEYS[1]) or '0') "
    "if tonumber(ARGV[1]) > cur then redis.call('set', KEYS[1], ARGV[1], 'EX', ARGV[2]) end return 1"
)
COUNTER_TTL_S = 40 * 86400  # gateway.proxy.budgets.COUNTER_TTL_S


def period_start(period: str, now: datetime) -> datetime:
    at = now.astimezone(UTC)
    if period == BudgetPeriod.DAY:
        return datetime(at.year, at.month, at.day, tzinfo=UTC)
    return datetime(at.year, at.month, 1, tzinfo=UTC)


def period_label(period: str, now: datetime) -> str:
    """The counter's period label, as ``gateway.proxy.budgets.period_label`` writes it."""
    at = now.astimezone(UTC)
    return f"{at:%Y-%m-%d}" if period == BudgetPeriod.DAY else f"{at:%Y-%m}"


def usd_per_mu() -> float:
    return prices()[1] / 1000.0


@dataclass(frozen=True)
class KeySpend:
    key: ApiKey
    period: str
    period_start: datetime
    spend_usd: float

    @property
    def budget_left_usd(self) -> float | None:
        return None if self.key.budget_usd is None else max(0.0, self.key.budget_usd - self.spend_usd)

    def as_dict(self) -> dict:
        return {
            "api_key": self.key.pk,
            "prefix": self.key.prefix,
            "name": self.key.name,
            "tenant": self.key.tenant_id,
            "period": self.period,
            "period_start": self.period_start.isoformat(),
            "spend_usd": round(self.spend_usd, 6),
            "budget_usd": self.key.budget_usd,
            "budget_left_usd": None if self.budget_left_usd is None else round(self.budget_left_usd, 6),
        }


def key_spend(keys, *, now: datetime | None = None) -> list[KeySpend]:
    """Each key's spend over its own budget period (month unless it has a daily budget), in one grouped query over
    its tenants' records of the month (the (tenant, finished_at) index)."""
    now = now or timezone.now()
    keys = list(keys)
    month, day = period_start(BudgetPeriod.MONTH, now), period_start(BudgetPeriod.DAY, now)
    rows = (
        UsageRecord.objects.filter(
            tenant_id__in={k.tenant_id for k in keys}, api_key_id__in=[k.pk for k in keys], finished_at__gte=month
        )
        .values("api_key_id")
        .annotate(month=Sum("mu"), day=Sum("mu", filter=Q(finished_at__gte=day)))
    )
    by_key = {row["api_key_id"]: row for row in rows}
    rate = usd_per_mu()
    out = []
    for key in keys:
        row = by_key.get(key.pk) or {}
        period = key.budget_period if key.budget_usd is not None else BudgetPeriod.MONTH
        mu = row.get("day" if period == BudgetPeriod.DAY else "month") or 0.0
        out.append(KeySpend(key, period, day if period == BudgetPeriod.DAY else month, mu * rate))
    return out


def tenant_spend_usd(tenant_ids, *, now: datetime | None = None) -> dict[int, float]:
    """Each tenant's spend this UTC month."""
    now = now or timezone.now()
    rows = (
        UsageRecord.objects.filter(tenant_id__in=list(tenant_ids), finished_at__gte=period_start("month", now))
        .values("tenant_id")
        .annotate(mu=Sum("mu"))
    )
    rate = usd_per_mu()
    return {row["tenant_id"]: (row["mu"] or 0.0) * rate for row in rows}


def budget_counters_sync(*, now: datetime | None = None, client=None, http: httpx.Client | None = None) -> dict:
    """Raise every budgeted key's and hard-stopped tenant's Redis counter to the records' spend, and raise each
    tenant's soft alert once a month when its spend passes the alert fraction. Returns what it did.

    Without Redis (the embedded default: one process, no shared counters) only the soft alerts are sent."""
    now = now or timezone.now()
    if client is None and settings.REDIS_URL:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2)
    raise_counter = client.register_script(_RAISE) if client is not None else None
    keys = ApiKey.objects.filter(budget_usd__isnull=False, revoked_at__isnull=True)
    synced = 0
    for spent in key_spend(keys, now=now) if raise_counter is not None else []:
        raise_counter(
            keys=[f"infercap:spend:key:{spent.key.pk}:{period_label(spent.period, now)}"],
            args=[repr(spent.spend_usd), COUNTER_TTL_S],
        )
        synced += 1
    tenants = list(Tenant.objects.filter(budget_usd__isnull=False, is_active=True))
    spends = tenant_spend_usd([t.pk for t in tenants], now=now)
    alerted = []
    for tenant in tenants:
        spend = spends.get(tenant.pk, 0.0)
        if tenant.budget_hard_stop and raise_counter is not None:
            raise_counter(
                keys=[f"infercap:spend:tenant:{tenant.pk}:{period_label('month', now)}"],
                args=[repr(spend), COUNTER_TTL_S],
            )
            synced += 1
        if spend >= tenant.budget_alert_fraction * tenant.budget_usd and _not_alerted(tenant, now):
            detail = {
                "month": period_label("month", now),
                "spend_usd": round(spend, 2),
                "budget_usd": tenant.budget_usd,
                "fraction": tenant.budget_alert_fraction,
                "hard_stop": tenant.budget_hard_stop,
            }
            detail["deliveries"] = budget_alert_deliver(tenant, detail, http=http)
            audit_log(actor=None, action=ALERT_ACTION, obj=tenant, tenant=tenant, detail=detail)
            alerted.append(tenant.slug)
    return {"counters": synced, "alerted": alerted}


def budget_alert_deliver(tenant: Tenant, detail: dict, *, http: httpx.Client | None = None) -> dict[str, str]:
    """POST the soft alert to the tenant's enabled webhooks and the operators' (severity ``ticket``), signed and
    through the egress checks as SLO alerts are (``notifiers.post_event``); one attempt each, whose outcome the
    audit entry keeps (webhook name → "sent" or the error)."""
    hooks = Webhook.objects.filter(enabled=True).filter(Q(tenant=tenant) | Q(tenant__isnull=True))
    payload = {"event": "budget_alert", "tenant": tenant.slug, **detail}
    client = http or httpx.Client(timeout=TIMEOUT_S, follow_redirects=False)
    outcomes = {}
    try:
        for hook in hooks:
            if hook.severities and "ticket" not in hook.severities:
                continue
            key = f"infercap-budget-{tenant.pk}-{detail['month']}-{hook.pk}"
            error = post_event(client, hook, payload, idempotency_key=key)
            outcomes[hook.name] = "sent" if error is None else error
    finally:
        if http is None:
            client.close()
    return outcomes


def _not_alerted(tenant: Tenant, now: datetime) -> bool:
    return not AuditEntry.objects.filter(
        action=ALERT_ACTION, object_id=str(tenant.pk), at__gte=period_start("month", now)
    ).exists()
