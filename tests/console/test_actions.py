"""Console actions: bad input gives field errors, a valid form asks for confirmation, a confirmed one acts and audits."""

import pytest
from django.urls import reverse
from django.utils import timezone

from billing.models import Alert
from endpoints.models import Adapter, Endpoint, ReplicaState
from tenants.keys import authenticate_api_key
from tenants.models import ApiKey, AuditEntry, CapacityReservation
from tests.factories import EndpointFactory, ReplicaFactory, SLOFactory

pytestmark = pytest.mark.django_db


def _post_confirmed(client, url, data):
    """First POST must only ask for confirmation; the second (confirmed) one acts."""
    first = client.post(url, data)
    assert first.status_code == 200 and 'name="confirmed" value="yes"' in first.content.decode()
    return client.post(url, {**data, "confirmed": "yes"})


def _endpoint_data(tenant_a, **overrides):
    data = {
        "name": "llama-new",
        "owner_tenant": "",
        "model_profile": tenant_a.endpoint.model_profile_id,
        "hardware_profile": tenant_a.endpoint.hardware_profile_id,
        "runtime": "sim",
        "min_replicas": 1,
        "max_replicas": 4,
        "desired_replicas": 2,
        "concurrency_limit": 64,
        "routing_policy": "infercap",
        "ttft_slo_ms": 2000,
        "tpot_slo_ms": 100,
    }
    return {**data, **overrides}


def test_endpoint_create_errors_then_confirm_then_audit(client, operator, tenant_a):
    client.force_login(operator)
    url = reverse("console:endpoint-create")
    bad = client.post(url, _endpoint_data(tenant_a, name="bad name!", desired_replicas=9, ttft_slo_ms=0))
    assert bad.status_code == 400
    form = bad.context["form"]
    assert {"name", "desired_replicas", "ttft_slo_ms"} <= set(form.errors)
    assert "field-error" in bad.content.decode()
    duplicate = client.post(url, _endpoint_data(tenant_a, name=tenant_a.endpoint.name))
    assert duplicate.status_code == 400 and "name" in duplicate.context["form"].errors
    assert not Endpoint.objects.filter(name="llama-new").exists()
    done = _post_confirmed(client, url, _endpoint_data(tenant_a))
    endpoint = Endpoint.objects.get(name="llama-new")
    assert done.status_code == 302 and done["Location"] == reverse("console:endpoint", args=[endpoint.pk])
    assert endpoint.desired_replicas == 2
    entry = AuditEntry.objects.get(action="endpoint.create", object_id=str(endpoint.pk))
    assert entry.actor == operator and entry.detail["name"] == "llama-new"


def test_scale_validates_bounds_and_audits(client, operator, tenant_a):
    client.force_login(operator)
    url = reverse("console:endpoint-scale", args=[tenant_a.endpoint.pk])
    bad = client.post(url, {"min_replicas": 3, "max_replicas": 2, "desired_replicas": 2})
    assert bad.status_code == 400 and "min_replicas" in bad.context["form"].errors
    bad = client.post(url, {"min_replicas": 1, "max_replicas": 2, "desired_replicas": "many"})
    assert bad.status_code == 400 and "desired_replicas" in bad.context["form"].errors
    done = _post_confirmed(client, url, {"min_replicas": 1, "max_replicas": 6, "desired_replicas": 5})
    assert done.status_code == 302
    tenant_a.endpoint.refresh_from_db()
    assert (tenant_a.endpoint.max_replicas, tenant_a.endpoint.desired_replicas) == (6, 5)
    entry = AuditEntry.objects.get(action="endpoint.scale")
    assert (entry.detail["from"], entry.detail["to"], entry.actor) == (1, 5, operator)
    assert AuditEntry.objects.get(action="endpoint.update").detail["changes"]["max_replicas"] == [4, 6]


def test_drain_only_ready_replicas(client, operator, tenant_a):
    client.force_login(operator)
    ready = ReplicaFactory(endpoint=tenant_a.endpoint, name="r-ready", state=ReplicaState.READY)
    starting = ReplicaFactory(endpoint=tenant_a.endpoint, name="r-start", state=ReplicaState.STARTING)
    url = reverse("console:replica-drain", args=[tenant_a.endpoint.pk, starting.pk])
    refused = _post_confirmed(client, url, {"reason": ""})
    assert refused.status_code == 400 and "only a ready replica drains" in refused.content.decode()
    url = reverse("console:replica-drain", args=[tenant_a.endpoint.pk, ready.pk])
    assert _post_confirmed(client, url, {"reason": "maintenance"}).status_code == 302
    ready.refresh_from_db()
    assert ready.state == ReplicaState.DRAINING
    assert ready.transitions.get().reason == "maintenance"
    assert AuditEntry.objects.filter(action="replica.drain", object_id=str(ready.pk)).exists()
    other = EndpointFactory(name="other")
    assert client.get(reverse("console:replica-drain", args=[other.pk, ready.pk])).status_code == 404


def test_sell_reservation_refuses_overcommit(client, operator, tenant_a, tenant_b, settings):
    settings.INFERCAP = {**settings.INFERCAP, "OVERCOMMIT_LIMIT": 1.5}
    client.force_login(operator)
    endpoint = tenant_a.endpoint  # 1 desired replica × 1000 MU/min; tenant A holds 100
    ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY)
    url = reverse("console:reservation-sell")
    bad = client.post(
        url,
        {
            "tenant": tenant_b.tenant.pk,
            "endpoint": endpoint.pk,
            "mu_per_min": -5,
            "priority": "standard",
            "burst_minutes": 1,
        },
    )
    assert bad.status_code == 400 and "mu_per_min" in bad.context["form"].errors
    duplicate = client.post(
        url,
        {
            "tenant": tenant_a.tenant.pk,
            "endpoint": endpoint.pk,
            "mu_per_min": 5,
            "priority": "standard",
            "burst_minutes": 1,
        },
    )
    assert duplicate.status_code == 400 and "already holds" in duplicate.content.decode()
    data = {
        "tenant": tenant_b.tenant.pk,
        "endpoint": endpoint.pk,
        "mu_per_min": 1500,
        "priority": "standard",
        "burst_minutes": 1,
    }
    refused = _post_confirmed(client, url, data)
    assert refused.status_code == 400 and "overcommit limit" in refused.content.decode()
    assert "mu_per_min" in refused.context["form"].errors  # shown next to the field
    assert not CapacityReservation.objects.filter(tenant=tenant_b.tenant, endpoint=endpoint).exists()
    assert _post_confirmed(client, url, {**data, "mu_per_min": 1400}).status_code == 302
    assert CapacityReservation.objects.get(tenant=tenant_b.tenant, endpoint=endpoint).mu_per_min == 1400
    assert AuditEntry.objects.filter(action="reservation.create", tenant=tenant_b.tenant, actor=operator).exists()


def test_sell_an_adapter_reservation_only_for_an_adapter_the_tenant_may_use(client, operator, tenant_a, tenant_b):
    client.force_login(operator)
    endpoint = tenant_b.endpoint  # B's endpoint: B's own adapter and a shared one are B's to use, A's is not
    ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY)
    own, shared = (
        Adapter.objects.create(name=name, owner_tenant=owner, endpoint=endpoint, rank=8, artifact_path=name)
        for name, owner in (("b-ft", tenant_b.tenant), ("any-ft", None))
    )
    private_to_a = Adapter.objects.create(
        name="a-ft", owner_tenant=tenant_a.tenant, endpoint=endpoint, rank=8, artifact_path="a-ft"
    )
    url = reverse("console:reservation-sell")
    page = client.get(url, {"tenant": tenant_b.tenant.pk, "endpoint": endpoint.pk, "adapter": own.pk})
    assert page.status_code == 200 and "LoRA adapter" in page.content.decode()
    data = {"tenant": tenant_b.tenant.pk, "endpoint": endpoint.pk, "mu_per_min": 30, "priority": "standard"}
    data["burst_minutes"] = 1
    refused = client.post(url, {**data, "adapter": private_to_a.pk})
    assert refused.status_code == 400 and "private to another tenant" in str(refused.context["form"].errors["adapter"])
    # B's base-model reservation (the tenant_b fixture's) does not stop one for its adapter, and the summary says which.
    first = client.post(url, {**data, "adapter": own.pk})
    assert "for adapter b-ft" in first.content.decode()
    assert _post_confirmed(client, url, {**data, "adapter": own.pk}).status_code == 302
    assert _post_confirmed(client, url, {**data, "adapter": shared.pk}).status_code == 302
    again = client.post(url, {**data, "adapter": own.pk})
    assert again.status_code == 400 and "already holds a reservation for adapter b-ft" in again.content.decode()
    sold = CapacityReservation.objects.filter(tenant=tenant_b.tenant, endpoint=endpoint, adapter__isnull=False)
    assert sorted(r.adapter.name for r in sold) == ["any-ft", "b-ft"]
    entry = AuditEntry.objects.get(action="reservation.create", object_id=str(sold.get(adapter=own).pk))
    assert entry.detail["adapter"] == "b-ft" and entry.actor == operator


def test_acknowledge_alert_once(client, operator, tenant_a):
    client.force_login(operator)
    slo = SLOFactory(endpoint=tenant_a.endpoint)
    alert = Alert.objects.create(
        slo=slo, severity="page", state="firing", long_window="1h", short_window="5m", burn_rate_threshold=14.4
    )
    url = reverse("console:alert-ack", args=[alert.pk])
    assert _post_confirmed(client, url, {"note": "looking"}).status_code == 302
    alert.refresh_from_db()
    assert alert.acknowledged_by == operator and alert.acknowledged_at is not None
    again = client.post(url, {"note": "", "confirmed": "yes"})
    assert again.status_code == 400 and "already acknowledged" in again.content.decode()
    assert AuditEntry.objects.filter(action="alert.acknowledge").count() == 1


def test_api_key_shown_once_then_revoked(client, tenant_a):
    client.force_login(tenant_a.admin)
    url = reverse("console:api-key-create")
    bad = client.post(
        url, {"name": "  ", "scopes": ["bogus"], "max_priority": "urgent", "expires_at": "2001-01-01T00:00"}
    )
    assert bad.status_code == 400
    assert {"name", "scopes", "max_priority", "expires_at"} <= set(bad.context["form"].errors)
    done = _post_confirmed(client, url, {"name": "ci", "scopes": ["inference", "read"], "max_priority": "critical"})
    assert done.status_code == 302
    page = client.get(reverse("console:api-keys")).content.decode()
    key = ApiKey.objects.get(tenant=tenant_a.tenant, name="ci")
    raw = page.split('id="new-key-value" class="key" type="text" readonly value="')[1].split('"')[0]
    assert raw.startswith(key.prefix) and authenticate_api_key(raw) == key
    assert key.scopes == ["inference", "read"] and key.max_priority == "critical"
    assert raw not in client.get(reverse("console:api-keys")).content.decode()  # shown once
    revoke = reverse("console:api-key-revoke", args=[key.pk])
    assert "Applications using it stop working" in client.get(revoke).content.decode()
    client.post(revoke, {"confirmed": "yes"})
    key.refresh_from_db()
    assert key.revoked_at is not None and key.revoked_at <= timezone.now()
    assert authenticate_api_key(raw) is None
    assert AuditEntry.objects.filter(action="api_key.revoke", object_id=str(key.pk)).exists()


def test_planner_reproduces_worked_example_and_reports_field_errors(client, operator):
    client.force_login(operator)
    url = reverse("console:planner")
    form = client.get(url).context["form"]
    data = {name: field.initial for name, field in form.fields.items() if field.initial is not None}
    result = client.post(url, data)
    assert result.status_code == 200
    plan = result.context["result"]
    assert (plan.n_mem, plan.n_thr, plan.n_lat, plan.n_with_headroom) == (1, 2, 2, 3)
    assert "binding" in result.content.decode()
    bad = client.post(url, {**data, "throughput_table": "16 fast", "arrival_rate_per_s": -1, "gpu_memory_gb": ""})
    assert bad.status_code == 400
    assert {"throughput_table", "arrival_rate_per_s", "gpu_memory_gb"} <= set(bad.context["form"].errors)
    no_kv = client.post(url, {**data, "weights_gb": 79})
    assert no_kv.status_code == 400 and "gpu_memory_gb" in no_kv.context["form"].errors


def test_cost_period_errors_and_csv(client, operator, tenant_a):
    client.force_login(operator)
    bad = client.get(reverse("console:cost"), {"hours": "-3"})
    assert bad.status_code == 400 and "hours" in bad.context["form"].errors
    csv_response = client.get(reverse("console:cost"), {"hours": 24, "format": "csv"})
    assert csv_response["Content-Type"] == "text/csv"
    lines = csv_response.content.decode().strip().splitlines()
    assert lines[0].startswith("endpoint_id,endpoint,tenant_id,tenant,start,end,gpu_hours,usd")
    assert any(",a-model," in line for line in lines[1:])


def test_audit_page_shows_console_actions_to_the_right_people(client, operator, tenant_a, tenant_b):
    client.force_login(tenant_a.admin)
    _post_confirmed(
        client, reverse("console:api-key-create"), {"name": "audited", "scopes": ["read"], "max_priority": "standard"}
    )
    own = client.get(reverse("console:audit"), {"action": "api_key."}).content.decode()
    assert own.count("<code>api_key.create</code>") == 2  # the fixture's key and this one, not tenant B's
    assert "a-admin" in own
    client.force_login(tenant_b.member)
    assert "a-admin" not in client.get(reverse("console:audit")).content.decode()
    client.force_login(operator)
    everything = client.get(reverse("console:audit"), {"page": "999", "action": "api_key."}).content.decode()
    assert everything.count("<code>api_key.create</code>") == 3  # an out-of-range page shows the last one


def test_endpoint_create_with_a_prefill_pool_shows_both_pools(client, operator, tenant_a):
    client.force_login(operator)
    url = reverse("console:endpoint-create")
    inverted = client.post(
        url, _endpoint_data(tenant_a, serving_mode="disaggregated", prefill_min_replicas=3, prefill_max_replicas=1)
    )
    assert inverted.status_code == 400 and "prefill_min_replicas" in inverted.context["form"].errors
    data = _endpoint_data(
        tenant_a,
        serving_mode="disaggregated",
        kv_connector="shared_storage",
        pd_min_uncached_tokens=512,
        prefill_min_replicas=2,
        prefill_max_replicas=3,
    )
    assert _post_confirmed(client, url, data).status_code == 302
    endpoint = Endpoint.objects.get(name="llama-new")
    assert (endpoint.serving_mode, endpoint.prefill_min_replicas, endpoint.prefill_desired_replicas) == (
        "disaggregated",
        2,
        2,
    )
    ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY, role="prefill", name="p-1")
    page = client.get(reverse("console:endpoint", args=[endpoint.pk])).content.decode()
    assert "decode 1–4, desired 2; prefill on" in page and "prompts under 512 uncached tokens" in page
    assert "<td>p-1</td>\n        <td>prefill</td>" in page
    # An aggregated endpoint's form needs none of the pool fields; its page says nothing of pools.
    assert _post_confirmed(client, url, _endpoint_data(tenant_a, name="plain-new")).status_code == 302
    plain = Endpoint.objects.get(name="plain-new")
    assert plain.serving_mode == "aggregated"
    assert "pd-pools" not in client.get(reverse("console:endpoint", args=[plain.pk])).content.decode()


def test_the_keys_page_shows_each_keys_limits_and_spend_beside_its_budget(client, tenant_a):
    from billing.spend import usd_per_mu
    from tenants.models import Tenant
    from tests.factories import UsageRecordFactory

    ApiKey.objects.filter(pk=tenant_a.key.pk).update(
        rpm_limit=1200, allowed_models=[tenant_a.endpoint.name], budget_usd=0.01, budget_period="day"
    )
    Tenant.objects.filter(pk=tenant_a.tenant.pk).update(budget_usd=2500.0, budget_hard_stop=True)
    UsageRecordFactory(tenant=tenant_a.tenant, endpoint=tenant_a.endpoint, api_key=tenant_a.key, mu=1000.0)
    client.force_login(tenant_a.member)
    page = client.get(reverse("console:api-keys")).content.decode()
    spend = 1000.0 * usd_per_mu()
    assert "1,200 req/min" in page and f"only {tenant_a.endpoint.name}" in page
    assert f"${spend:,.2f} this day of $0.01" in page and '<span class="bad">spent</span>' in page
    assert f"Spent this month: ${spend:,.2f} USD of a $2,500.00 budget (requests stop when it is spent)" in page


def test_an_operator_scale_is_marked_apart_from_the_autoscalers_moves(client, operator, tenant_a):
    import re

    from capacity.models import AutoscalerDecision

    client.force_login(operator)
    url = reverse("console:endpoint-scale", args=[tenant_a.endpoint.pk])
    assert (
        _post_confirmed(client, url, {"min_replicas": 1, "max_replicas": 6, "desired_replicas": 3}).status_code == 302
    )
    AutoscalerDecision.objects.create(
        endpoint=tenant_a.endpoint, axis="horizontal", tick="h-1", current=3, desired=4, reason="scale up: demand"
    )
    page = client.get(reverse("console:endpoint", args=[tenant_a.endpoint.pk])).content.decode()
    chart = page[page.index('aria-label="Ready replicas') :]
    chart = chart[: chart.index("</svg>")]
    operator_marks = re.findall(r'<line [^>]*class="marker operator"><title>([^<]+)</title>', chart)
    plain_marks = re.findall(r'<line [^>]*class="marker"><title>([^<]+)</title>', chart)
    assert len(operator_marks) == 1 and "operator scale by operator" in operator_marks[0]
    assert len(plain_marks) == 1 and "scale up: demand" in plain_marks[0]


def test_the_planner_plans_a_live_endpoint_and_applies_its_bounds(client, operator, tenant_a):
    from datetime import timedelta

    from billing.models import UsageMinute

    endpoint = tenant_a.endpoint
    Endpoint.objects.filter(pk=endpoint.pk).update(ttft_slo_ms=1500, tpot_slo_ms=50)
    start = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=30)
    # The last hour served 7,200 requests: 2 req/s, 800 tokens in and 200 out each on average.
    UsageMinute.objects.create(
        endpoint=endpoint, tenant=tenant_a.tenant, start=start, requests=7200, input_tokens=7200 * 800,
        output_tokens=7200 * 200,
    )  # fmt: skip
    client.force_login(operator)
    url = reverse("console:planner")
    page = client.get(url, {"endpoint": endpoint.pk})
    initial = page.context["form"].initial
    assert (initial["arrival_rate_per_s"], initial["input_tokens"], initial["output_tokens"]) == (2.0, 800.0, 200.0)
    assert (initial["min_stream_tok_s"], initial["ttft_s"], initial["endpoint"]) == (20.0, 1.5, endpoint.pk)
    assert "Planning for" in page.content.decode()
    form = page.context["form"]
    data = {name: initial.get(name, field.initial) for name, field in form.fields.items()}
    data = {k: v for k, v in data.items() if v is not None}
    result = client.post(url, data)
    assert result.status_code == 200, result.context["form"].errors
    plan, low_high = result.context["result"], result.context["apply"]
    assert low_high == (plan.n_base, max(plan.n_with_headroom, plan.spike.replicas_needed))
    assert 'id="plan-apply"' in result.content.decode()
    apply = reverse("console:planner-apply", args=[endpoint.pk])
    inverted = client.post(apply, {"min_replicas": 5, "max_replicas": 2, "confirmed": "yes"})
    assert inverted.status_code == 400 and "min_replicas" in inverted.context["form"].errors
    done = _post_confirmed(client, apply, {"min_replicas": low_high[0], "max_replicas": low_high[1]})
    assert done.status_code == 302 and done["Location"] == reverse("console:endpoint", args=[endpoint.pk])
    endpoint.refresh_from_db()
    assert (endpoint.min_replicas, endpoint.max_replicas) == low_high
    entry = AuditEntry.objects.filter(action="endpoint.update", object_id=str(endpoint.pk)).latest("at")
    assert entry.actor == operator and "max_replicas" in entry.detail["changes"]
    # Tenants cannot reach it.
    client.force_login(tenant_a.admin)
    assert client.post(apply, {"min_replicas": 1, "max_replicas": 1, "confirmed": "yes"}).status_code == 404
