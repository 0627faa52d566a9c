"""The billing app's REST resources without a case elsewhere, declared once; the checks come from
APIResourceCase: alerts, SLO budgets and cost reports (read-only) and webhooks (tenant admins write)."""

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from billing.models import SLO, Alert, CostReport, SLOStatus, Webhook
from tests.api.base import APIResourceCase, unique
from tests.factories import SLOFactory

# A fixed moment, so nothing depends on today's date.
MOMENT = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
# A public address literal: the webhook check accepts it without resolving a name.
PUBLIC_URL = "https://93.184.216.34/hook"

_hours = itertools.count()


def side_of(world, side):
    return world.a if side == "a" else world.b


def _slo(world, side) -> SLO:
    actors = side_of(world, side)
    return SLOFactory(name=unique(f"{side}-availability"), endpoint=actors.endpoint, tenant=actors.tenant)


class TestAlerts(APIResourceCase):
    basename = "alert"
    model = Alert
    write_access = None

    def make(self, world, side):
        actors = side_of(world, side)
        # Acknowledged: the list then also reads the user, which an N+1 would show.
        return Alert.objects.create(
            slo=_slo(world, side),
            severity=Alert.Severity.PAGE,
            state=Alert.State.FIRING,
            long_window="1h",
            short_window="5m",
            burn_rate_threshold=14.4,
            started_at=MOMENT,
            fired_at=MOMENT,
            acknowledged_at=MOMENT,
            acknowledged_by=actors.admin,
        )

    def tenant_of(self, obj):
        return obj.slo.tenant_id

    @pytest.mark.parametrize(
        ("who", "status"), [("a_admin", 200), ("a_write_key", 200), ("a_member", 403), ("a_read_key", 403)]
    )
    def test_acknowledging_needs_write_access_and_another_tenants_alert_is_not_found(self, world, who, status):
        mine, theirs = self.make(world, "a"), self.make(world, "b")
        client = world.client(who)
        assert client.post(self.detail_url(mine) + "acknowledge/").status_code == status
        assert client.post(self.detail_url(theirs) + "acknowledge/").status_code == 404
        theirs.refresh_from_db()
        assert theirs.acknowledged_by == world.b.admin


class TestSLOBudgets(APIResourceCase):
    basename = "slo-budget"
    model = SLO  # a budget is its SLO's figures: the id in its URL and rows is the SLO's
    write_access = None
    id_field = "slo_id"

    def make(self, world, side):
        slo = _slo(world, side)
        # Evaluated, with an alert firing: a row then reads all three of the budget's sources.
        SLOStatus.objects.create(slo=slo, evaluated_at=MOMENT, burn_rates={"1h": 15.0}, budget_remaining=0.4)
        Alert.objects.create(
            slo=slo, severity=Alert.Severity.PAGE, state=Alert.State.FIRING, long_window="1h", short_window="5m",
            burn_rate_threshold=14.4, started_at=MOMENT,
        )  # fmt: skip
        return slo

    def test_a_budget_reports_its_evaluation_and_firing_alerts(self, world):
        slo = self.make(world, "a")
        body = world.client("a_read_key").get(self.detail_url(slo)).json()
        assert body["budget_remaining"] == 0.4 and body["burn_rates"]["1h"] == 15.0
        assert body["health"] == "page" and body["firing"]
        assert body["evaluated_at"] == MOMENT.isoformat()


class TestCostReports(APIResourceCase):
    basename = "cost-report"
    model = CostReport
    write_access = None

    def make(self, world, side):
        actors = side_of(world, side)
        start = MOMENT + timedelta(hours=next(_hours))
        return CostReport.objects.create(
            granularity=CostReport.Granularity.HOUR, start=start, end=start + timedelta(hours=1),
            endpoint=actors.endpoint, tenant=actors.tenant, gpu_hours=1.0, usd=4.0, requests=10,
        )  # fmt: skip

    def tenant_of(self, obj):
        # An endpoint-wide report (no tenant) belongs to the endpoint's owner.
        return obj.tenant_id or obj.endpoint.owner_tenant_id

    def test_the_csv_export_is_cut_to_the_tenant_too(self, world):
        self.make(world, "a"), self.make(world, "b")
        response = world.client("a_read_key").get(self.list_url() + "export/")
        assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
        text = response.content.decode()
        assert world.a.endpoint.name in text and world.b.endpoint.name not in text


class TestWebhooks(APIResourceCase):
    basename = "webhook"
    model = Webhook

    def make(self, world, side):
        return Webhook.objects.create(name=unique(f"{side}-pager"), url=PUBLIC_URL, tenant=side_of(world, side).tenant)

    def create_payload(self, world):
        return {"name": unique("pager"), "url": PUBLIC_URL, "secret": "s3cret", "severities": ["page"]}

    def invalid_payloads(self, world):
        good = self.create_payload(world)
        return [
            ({**good, "name": ""}, "name"),
            ({key: value for key, value in good.items() if key != "url"}, "url"),
            ({**good, "url": "ftp://93.184.216.34/hook"}, "url"),
            ({**good, "url": "http://127.0.0.1:8000/hook"}, "url"),  # inside the platform's network
            ({**good, "url": "http://10.1.2.3/hook"}, "url"),
            ({**good, "severities": ["sms"]}, "severities"),
            ({**good, "tenant": world.b.tenant.pk}, "tenant"),
        ]

    def update_payload(self, world, obj):
        return {"name": unique("renamed"), "enabled": False, "severities": ["ticket"]}

    def test_the_secret_is_never_read_back(self, world):
        hook = self.make(world, "a")
        Webhook.objects.filter(pk=hook.pk).update(secret="s3cret")
        for who in ("operator", "a_admin", "a_read_key"):
            assert "secret" not in world.client(who).get(self.detail_url(hook)).json()
