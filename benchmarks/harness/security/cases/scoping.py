"""What the REST API and the console answer about objects a tenant may see but does not own: a shared endpoint it
reserves on (its autoscaler decisions carry every tenant's demand; its operators' alerts are theirs to acknowledge,
and who did is not another tenant's business) and catalogue rows measured on another tenant's endpoint (benchmarks
name the endpoint and the replica's address). docs/security.md, "Tenant isolation on the REST API"."""

from __future__ import annotations

import json

from django.test import Client
from django.utils import timezone

from benchmarks.harness.security.registry import expect, security_case
from benchmarks.harness.security.world import SecurityWorld
from billing.models import SLO, Alert, SLIKind
from capacity.models import AutoscalerDecision, CapacityBenchmark
from tenants.models import AuditEntry, CapacityReservation, Role, User


def _rows(response) -> list[dict]:
    body = response.json()
    return body["results"] if isinstance(body, dict) and "results" in body else body


def _reserve_on_shared(world: SecurityWorld, side) -> None:
    """The side's tenant reserves on the shared endpoint, so it sees it (the world's tenants do not, at first)."""
    CapacityReservation.objects.create(tenant=side.tenant, endpoint=world.shared, mu_per_min=10.0)


def _decision(endpoint, demand: float) -> AutoscalerDecision:
    return AutoscalerDecision.objects.create(
        endpoint=endpoint,
        axis=AutoscalerDecision.Axis.HORIZONTAL,
        current=2,
        desired=5,
        reason=f"scale up: demand needs {demand:.2f} replicas",
        inputs={"demand_requests_20s": demand, "demand_mu_20s": demand * 10},
        applied=True,
    )


@security_case(
    "scoping.autoscaler_decisions_of_shared_endpoint",
    "a tenant reserving on a shared endpoint reads its autoscaler decisions (every tenant's demand)",
)
def autoscaler_decisions_of_shared_endpoint(world: SecurityWorld) -> str:
    _reserve_on_shared(world, world.a)
    shared = _decision(world.shared, 123.0)
    own = _decision(world.a.endpoint, 7.0)
    for who, label in ((world.a.keys["read"], "A's read key"), (world.a.admin, "A's admin")):
        api = world.api(who)
        filtered = api.get(f"/api/v1/autoscaler-decisions/?endpoint={world.shared.pk}")
        expect(filtered.status_code == 200, f"{label}: ?endpoint=shared answered {filtered.status_code}")
        expect(not _rows(filtered), f"{label} reads the shared endpoint's decisions (its total demand)")
        listed = {row["id"] for row in _rows(api.get("/api/v1/autoscaler-decisions/"))}
        expect(shared.pk not in listed, f"{label} lists the shared endpoint's decision")
        expect(own.pk in listed, f"{label} does not see its own endpoint's decision: the case proves nothing")
        detail = api.get(f"/api/v1/autoscaler-decisions/{shared.pk}/")
        expect(detail.status_code == 404, f"{label}: the shared decision by id answered {detail.status_code}")
    operator = {row["id"] for row in _rows(world.api(world.operator).get("/api/v1/autoscaler-decisions/"))}
    expect(shared.pk in operator, "operators no longer see the shared endpoint's decisions")
    return "shared endpoint's decisions: not listed, filtered to nothing, 404 by id; own and operators' intact"


@security_case(
    "scoping.benchmarks_name_other_tenants",
    "a tenant reads benchmarks measured on another tenant's endpoint (its name, the replica's URL, adapters)",
)
def benchmarks_name_other_tenants(world: SecurityWorld) -> str:
    secret_url = "http://10.42.7.9:8000"
    adapter = f"{world.tag}-b-private-adapter"
    benchmark = CapacityBenchmark.objects.create(
        model_profile=world.b.endpoint.model_profile,
        hardware_profile=world.b.endpoint.hardware_profile,
        version=10_000 + CapacityBenchmark.objects.count(),
        status=CapacityBenchmark.Status.FAILED,
        mu_per_min=1234.5,
        detail={
            "endpoint": world.b.endpoint.name,
            "url": secret_url,
            "progress": [f"LoRA pass with adapter {adapter} (rank 16)"],
            "error": f"cannot load adapter {adapter} on {secret_url}: refused",
            "quick": True,
        },
    )
    leaks = (world.b.endpoint.name, secret_url, adapter)
    for who, label in ((world.a.keys["read"], "A's read key"), (world.a.member, "A's member")):
        api = world.api(who)
        for url in ("/api/v1/capacity/benchmarks/?limit=1000", f"/api/v1/capacity/benchmarks/{benchmark.pk}/"):
            response = api.get(url)
            expect(response.status_code == 200, f"{label}: {url} answered {response.status_code}")
            text = json.dumps(response.json())
            found = [leak for leak in leaks if leak in text]
            expect(not found, f"{label} reads {', '.join(found)} at {url}")
        row = api.get(f"/api/v1/capacity/benchmarks/{benchmark.pk}/").json()
        expect(row["mu_per_min"] == 1234.5, f"{label} no longer reads the measured figures: the case proves nothing")
    operator = world.api(world.operator).get(f"/api/v1/capacity/benchmarks/{benchmark.pk}/").json()
    expect(operator["detail"].get("url") == secret_url, "operators no longer see where a benchmark ran")
    return (
        "B's endpoint name, replica URL and adapter name absent for A's key and member; figures and operators intact"
    )


def _shared_alert(world: SecurityWorld) -> Alert:
    slo = SLO.objects.create(name=f"{world.tag} shared availability", endpoint=world.shared, sli=SLIKind.AVAILABILITY,
                             objective=0.99)  # fmt: skip
    return Alert.objects.create(
        slo=slo,
        severity=Alert.Severity.PAGE,
        state=Alert.State.FIRING,
        long_window="1h",
        short_window="5m",
        burn_rate_threshold=14.4,
        fired_at=timezone.now(),
    )


@security_case(
    "scoping.operator_alert_acknowledged_by_tenant",
    "a tenant's write key or admin acknowledges the operators' alert on a shared endpoint",
)
def operator_alert_acknowledged_by_tenant(world: SecurityWorld) -> str:
    _reserve_on_shared(world, world.a)
    alert = _shared_alert(world)
    url = f"/api/v1/alerts/{alert.pk}/acknowledge/"
    expect(world.api(world.a.keys["read"]).get(f"/api/v1/alerts/{alert.pk}/").status_code == 200,
           "A cannot even see the shared endpoint's alert: the case proves nothing")  # fmt: skip
    statuses = {}
    for who, label in ((world.a.keys["write"], "A's write key"), (world.a.admin, "A's admin")):
        response = world.api(who).post(url)
        statuses[label] = response.status_code
        alert.refresh_from_db()
        expect(alert.acknowledged_at is None, f"{label} acknowledged the operators' alert ({response.status_code})")
        expect(response.status_code == 403, f"{label} got {response.status_code}, not 403")
    return "refused: " + ", ".join(f"{label} {status}" for label, status in statuses.items())


@security_case(
    "scoping.alert_acknowledgement_audited",
    "an alert is acknowledged over the API without an audit entry",
)
def alert_acknowledgement_audited(world: SecurityWorld) -> str:
    alert = _shared_alert(world)
    response = world.api(world.operator).post(f"/api/v1/alerts/{alert.pk}/acknowledge/")
    expect(response.status_code == 200, f"the operator's acknowledgement answered {response.status_code}")
    entries = AuditEntry.objects.filter(action="alert.acknowledge", object_type="alert", object_id=str(alert.pk))
    expect(entries.count() == 1, f"{entries.count()} audit entries for the operator's acknowledgement")
    own_slo = SLO.objects.create(name=f"{world.tag} a ttft", endpoint=world.a.endpoint, tenant=world.a.tenant,
                                 sli=SLIKind.TTFT, objective=0.99)  # fmt: skip
    own = Alert.objects.create(slo=own_slo, severity=Alert.Severity.TICKET, state=Alert.State.FIRING,
                               long_window="6h", short_window="30m", burn_rate_threshold=6.0)  # fmt: skip
    by_key = world.api(world.a.keys["write"]).post(f"/api/v1/alerts/{own.pk}/acknowledge/")
    expect(by_key.status_code == 200, f"A's write key acknowledging A's own alert answered {by_key.status_code}")
    entry = AuditEntry.objects.filter(action="alert.acknowledge", object_id=str(own.pk)).first()
    expect(entry is not None, "no audit entry for A's key acknowledging its own alert")
    expect(entry.tenant_id == world.a.tenant.pk, "the key's acknowledgement is not in A's audit trail")
    expect(entry.actor_label.startswith("key:"), f"the entry names {entry.actor_label!r}, not the key")
    return f"operator's and A's key's acknowledgements audited ({entry.actor_label} in A's trail)"


@security_case(
    "scoping.alert_acknowledger_hidden",
    "tenants read the username of whoever acknowledged a shared endpoint's alert (API and console)",
)
def alert_acknowledger_hidden(world: SecurityWorld) -> str:
    _reserve_on_shared(world, world.a)
    _reserve_on_shared(world, world.b)
    by_b, by_operator = _shared_alert(world), _shared_alert(world)  # each on an SLO of its own
    b_person = User.objects.create_user(username=f"{world.tag}-b-oncall-person", tenant=world.b.tenant,
                                        role=Role.TENANT_ADMIN)  # fmt: skip
    now = timezone.now()
    # As the code before the fix allowed: B's person acknowledged the shared alert; an operator the other.
    Alert.objects.filter(pk=by_b.pk).update(acknowledged_at=now, acknowledged_by=b_person)
    Alert.objects.filter(pk=by_operator.pk).update(acknowledged_at=now, acknowledged_by=world.operator)
    names = (b_person.username, world.operator.username)
    for who, label in ((world.a.keys["read"], "A's read key"), (world.a.member, "A's member")):
        text = json.dumps(world.api(who).get("/api/v1/alerts/?limit=1000").json())
        found = [name for name in names if name in text]
        expect(not found, f"{label} reads the acknowledging username(s) {', '.join(found)} on /api/v1/alerts/")
    console = Client()
    console.force_login(world.a.member)
    page = console.get("/console/slos/")
    expect(page.status_code == 200, f"A's console SLO page answered {page.status_code}")
    found = [name for name in names if name in page.content.decode()]
    expect(not found, f"A's console SLO page shows {', '.join(found)}")
    mine = json.dumps(world.api(world.b.member).get(f"/api/v1/alerts/{by_b.pk}/").json())
    expect(b_person.username in mine, "B no longer sees its own person's acknowledgement: the case proves nothing")
    return "another tenant's person and the operator's username hidden from A (API, console); B sees its own"
