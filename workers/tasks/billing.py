"""Billing control loops: usage rollups and burn-rate alerts every minute, webhook delivery, cost reports, retention.

Thin tasks: each calls one service in ``billing``. Minute tasks expire before the next tick so a stalled worker
does not pile them up; every service is idempotent, so a redelivered task is harmless.
"""

from datetime import timedelta

from celery import shared_task
from celery.schedules import crontab
from django.utils import timezone

from billing.alerts import slo_evaluate_all
from billing.cost import cost_reports_store
from billing.models import CostReport
from billing.notifiers import notifications_deliver_due
from billing.rollups import usage_retention_cleanup, usage_rollup_run
from billing.spend import budget_counters_sync


@shared_task(name="billing.usage_rollup", soft_time_limit=50, time_limit=58)
def usage_rollup() -> dict:
    return vars(usage_rollup_run())


@shared_task(name="billing.slo_evaluate", soft_time_limit=55, time_limit=59)
def slo_evaluate() -> dict:
    # Roll up first so the evaluation sees this minute's records whichever task beat started first.
    usage_rollup_run()
    return vars(slo_evaluate_all())


@shared_task(name="billing.notifications_deliver", soft_time_limit=50, time_limit=58)
def notifications_deliver() -> dict:
    return vars(notifications_deliver_due())


@shared_task(name="billing.cost_reports", soft_time_limit=240, time_limit=300)
def cost_reports(granularity: str, periods_back: int = 1) -> int:
    """Store the reports of the last complete hour or day (and ``periods_back - 1`` before it, for late usage)."""
    step = timedelta(hours=1) if granularity == CostReport.Granularity.HOUR else timedelta(days=1)
    now = timezone.now()
    stored = 0
    for back in range(1, periods_back + 1):
        stored += cost_reports_store(granularity=granularity, start=now - back * step)
    return stored


@shared_task(name="billing.usage_retention", soft_time_limit=240, time_limit=300)
def usage_retention() -> int:
    return usage_retention_cleanup()


@shared_task(name="billing.budget_sync", soft_time_limit=50, time_limit=58)
def budget_sync() -> dict:
    """Budget counters back to the records' spend after a Redis loss; tenants' soft alerts (billing/spend.py)."""
    return budget_counters_sync()


BEAT_SCHEDULE = {
    "billing-budget-sync": {"task": "billing.budget_sync", "schedule": 60.0, "options": {"expires": 55}},
    "billing-usage-rollup": {"task": "billing.usage_rollup", "schedule": 60.0, "options": {"expires": 55}},
    "billing-slo-evaluate": {"task": "billing.slo_evaluate", "schedule": 60.0, "options": {"expires": 55}},
    "billing-notifications-deliver": {
        "task": "billing.notifications_deliver",
        "schedule": 15.0,
        "options": {"expires": 14},
    },
    # A few minutes past the hour (and past midnight) so late usage records are in; the previous period is redone.
    "billing-cost-reports-hourly": {
        "task": "billing.cost_reports",
        "schedule": crontab(minute=7),
        "args": ("hour", 2),
    },
    "billing-cost-reports-daily": {
        "task": "billing.cost_reports",
        "schedule": crontab(hour=0, minute=17),
        "args": ("day", 2),
    },
    "billing-usage-retention": {"task": "billing.usage_retention", "schedule": crontab(minute=37)},
}
