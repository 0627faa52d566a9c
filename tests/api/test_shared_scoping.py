"""What tenants read and change on a shared endpoint they reserve on, and on catalogue rows measured elsewhere:
autoscaler decisions (every tenant's demand) are its owner's and the operators'; benchmark details that name where
a sweep ran are the operators'; alerts of the operators' endpoint-wide SLOs are theirs to acknowledge, audited, and
who acknowledged is never another tenant's person."""

import pytest
from django.test import Client

from billing.models import Alert, SLIKind
from capacity.models import AutoscalerDecision, CapacityBenchmark
from tenants.models import AuditEntry, Role
from tests.factories import EndpointFactory, ReservationFactory, SLOFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def shared(world):
    """A shared endpoint both tenants reserve on."""
    endpoint = EndpointFactory(name="shared-model", owner_tenant=None)
    ReservationFactory(tenant=world.a.tenant, endpoint=endpoint)
    ReservationFactory(tenant=world.b.tenant, endpoint=endpoint)
    return endpoint


def _rows(response) -> list[dict]:
    body = response.json()
    return body["results"] if isinstance(body, dict) and "results" in body else body


def _decision(endpoint) -> AutoscalerDecision:
    return AutoscalerDecision.objects.create(
        endpoint=endpoint, axis="horizontal", current=1, desired=3, reason="scale up", inputs={"demand": 9.0}
    )


def _alert(slo, **fields) -> Alert:
    defaults = {"severity": "page", "state": "firing", "long_window": "1h", "short_window": "5m"}
    return Alert.objects.create(slo=slo, burn_rate_threshold=14.4, **{**defaults, **fields})


def test_a_reserving_tenant_reads_no_decision_of_the_shared_endpoint(world, shared):
    # Given decisions on the shared endpoint and on A's own
    theirs, own = _decision(shared), _decision(world.a.endpoint)
    for who in ("a_admin", "a_read_key"):
        client = world.client(who)
        # When A lists, filters by the shared endpoint and asks for its decision by id
        listed = {row["id"] for row in _rows(client.get("/api/v1/autoscaler-decisions/"))}
        filtered = _rows(client.get(f"/api/v1/autoscaler-decisions/?endpoint={shared.pk}"))
        # Then only its own endpoint's decision exists for it
        assert listed == {own.pk} and filtered == []
        assert client.get(f"/api/v1/autoscaler-decisions/{theirs.pk}/").status_code == 404
    operator = {row["id"] for row in _rows(world.client("operator").get("/api/v1/autoscaler-decisions/"))}
    assert {theirs.pk, own.pk} <= operator


def test_benchmark_details_naming_where_it_ran_are_the_operators(world):
    # Given a sweep of B's endpoint, recorded with its name, the replica's URL and its progress
    endpoint = world.b.endpoint
    benchmark = CapacityBenchmark.objects.create(
        model_profile=endpoint.model_profile,
        hardware_profile=endpoint.hardware_profile,
        version=1,
        mu_per_min=900.0,
        detail={"endpoint": endpoint.name, "url": "http://10.0.0.9:8000", "progress": ["b-adapter"], "quick": True},
    )
    url = f"/api/v1/capacity/benchmarks/{benchmark.pk}/"
    # When A reads it, then the figures are there and where it ran is not
    row = world.client("a_read_key").get(url).json()
    assert row["mu_per_min"] == 900.0 and row["detail"] == {"quick": True}
    listed = world.client("a_member").get("/api/v1/capacity/benchmarks/").content.decode()
    assert endpoint.name not in listed and "10.0.0.9" not in listed
    # And operators still see everything
    assert world.client("operator").get(url).json()["detail"]["url"] == "http://10.0.0.9:8000"


def test_only_operators_acknowledge_an_endpoint_wide_alert_of_a_shared_endpoint(world, shared):
    alert = _alert(SLOFactory(endpoint=shared, tenant=None, sli=SLIKind.AVAILABILITY))
    url = f"/api/v1/alerts/{alert.pk}/acknowledge/"
    # When A's write key and admin try, then 403 and the alert stays unacknowledged
    for who in ("a_write_key", "a_admin"):
        assert world.client(who).post(url).status_code == 403
    alert.refresh_from_db()
    assert alert.acknowledged_at is None
    # When an operator does, then it is acknowledged once, with one audit entry
    assert world.client("operator").post(url).status_code == 200
    assert world.client("operator").post(url).status_code == 200
    assert AuditEntry.objects.filter(action="alert.acknowledge", object_id=str(alert.pk)).count() == 1


def test_a_tenant_acknowledges_its_own_alerts_audited(world):
    own = _alert(SLOFactory(endpoint=world.a.endpoint, tenant=world.a.tenant, sli=SLIKind.TTFT))
    wide = _alert(SLOFactory(endpoint=world.a.endpoint, tenant=None, sli=SLIKind.AVAILABILITY))
    for alert, who in ((own, "a_write_key"), (wide, "a_admin")):
        assert world.client(who).post(f"/api/v1/alerts/{alert.pk}/acknowledge/").status_code == 200
        entry = AuditEntry.objects.get(action="alert.acknowledge", object_id=str(alert.pk))
        assert entry.actor_label == (f"key:{world.a.key.prefix}" if who == "a_write_key" else world.a.admin.username)
    assert world.client("a_member").post(f"/api/v1/alerts/{own.pk}/acknowledge/").status_code == 403


def test_who_acknowledged_is_never_another_tenants_person(world, shared):
    # Given two shared alerts: one acknowledged by B's person (as the old code let them), one by an operator
    b_person = UserFactory(username="b-oncall", tenant=world.b.tenant, role=Role.TENANT_ADMIN)
    by_b = _alert(SLOFactory(endpoint=shared, tenant=None), acknowledged_by=b_person)
    by_operator = _alert(SLOFactory(endpoint=shared, tenant=None), acknowledged_by=world.operator)
    Alert.objects.update(acknowledged_at="2025-01-01T00:00:00Z")

    def shown(who: str) -> dict:
        return {row["id"]: row["acknowledged_by"] for row in _rows(world.client(who).get("/api/v1/alerts/"))}

    # Then A sees neither username, B its own person's, operators both
    assert shown("a_read_key") == {by_b.pk: None, by_operator.pk: "an operator"}
    assert shown("b_member") == {by_b.pk: "b-oncall", by_operator.pk: "an operator"}
    assert shown("operator") == {by_b.pk: "b-oncall", by_operator.pk: "operator"}
    # And so does A's console page
    console = Client()
    console.force_login(world.a.member)
    page = console.get("/console/slos/").content.decode()
    assert "b-oncall" not in page and "an operator" in page
