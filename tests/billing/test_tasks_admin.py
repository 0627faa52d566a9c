"""The billing beat entries and thin tasks run end to end; the admin pages of billing's models load for operators."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from billing.models import SLOStatus, UsageMinute, UsageRecord
from tests.factories import SLOFactory
from workers.schedule import beat_schedule
from workers.tasks import billing as tasks


def test_beat_schedule_has_the_billing_loops():
    schedule = beat_schedule()
    assert schedule["billing-usage-rollup"]["schedule"] == 60.0
    assert schedule["billing-slo-evaluate"]["schedule"] == 60.0
    for name in (
        "billing-cost-reports-hourly",
        "billing-cost-reports-daily",
        "billing-usage-retention",
        "billing-notifications-deliver",
    ):
        assert schedule[name]["task"].startswith("billing.")


def test_tasks_run_the_services(tenant_a):
    now = timezone.now()
    UsageRecord.objects.create(
        request_id="task-1",
        tenant=tenant_a.tenant,
        endpoint=tenant_a.endpoint,
        status="ok",
        slo_met=True,
        started_at=now - timedelta(seconds=2),
        finished_at=now,
        mu=3.0,
    )
    slo = SLOFactory(endpoint=tenant_a.endpoint)
    assert tasks.usage_rollup.delay().get()["minute_rows"] == 1
    assert UsageMinute.objects.get().mu == 3.0
    assert tasks.slo_evaluate.delay().get()["slos"] == 1
    assert SLOStatus.objects.get(slo=slo).window_counts["5m"] == [1, 1]
    assert tasks.cost_reports.delay("hour").get() >= 1
    assert tasks.notifications_deliver.delay().get() == {"sent": 0, "retrying": 0, "failed": 0}
    assert tasks.usage_retention.delay().get() == 0


@pytest.mark.parametrize(
    "model",
    [
        "rollupcursor",
        "slostatus",
        "webhook",
        "alertnotification",
        "costreport",
        "usageminute",
        "usagehour",
        "usageday",
    ],
)
def test_admin_pages_load_for_operators(client, operator, tenant_a, model):
    client.force_login(operator)
    assert client.get(reverse(f"admin:billing_{model}_changelist")).status_code == 200
    client.force_login(tenant_a.admin)
    assert client.get(reverse(f"admin:billing_{model}_changelist")).status_code in (302, 403)
