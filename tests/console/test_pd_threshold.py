"""Selective disaggregation's threshold in the console: the P/D planner opened from an endpoint plans with its
threshold and last hour's prompts and shows the recommended one with its share straight to decode; the endpoint page
shows the configured threshold with the share of the last hour's prompts under it and the last plan's recommendation;
no tenant sees another tenant's endpoint or, on a shared endpoint, every tenant's prompts."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from console.pd_threshold import RECOMMENDATION_KEY
from endpoints.models import Endpoint
from tests.factories import HardwareProfileFactory, ReservationFactory, UsageRecordFactory


def _pct(share: float) -> str:
    return f"{share * 100:.0f}%"


@pytest.fixture
def disaggregated(tenant_a, clean_redis):
    """Tenant A's endpoint, disaggregated at 1,024 uncached tokens on hardware with a 400 Gb/s KV link, and its last
    hour: 7 short prompts (600 tokens, 100 of them cached), 3 long ones (8,000); plus what must not count: a shed
    request with no prompt, a prompt two hours old, and another endpoint's."""
    endpoint = tenant_a.endpoint
    Endpoint.objects.filter(pk=endpoint.pk).update(serving_mode="disaggregated", pd_min_uncached_tokens=1024)
    endpoint.hardware_profile.kv_link_gbps = 400
    endpoint.hardware_profile.save(update_fields=["kv_link_gbps"])
    now = timezone.now()
    for i in range(10):
        long = i >= 7
        UsageRecordFactory(tenant=tenant_a.tenant, endpoint=endpoint, input_tokens=8000 if long else 600,
                           cached_tokens=0 if long else 100, output_tokens=200,
                           finished_at=now - timedelta(minutes=5 + i))  # fmt: skip
    UsageRecordFactory(tenant=tenant_a.tenant, endpoint=endpoint, input_tokens=0, status="shed")
    UsageRecordFactory(
        tenant=tenant_a.tenant, endpoint=endpoint, input_tokens=50, finished_at=now - timedelta(hours=2)
    )
    UsageRecordFactory(tenant=tenant_a.tenant, input_tokens=50)
    endpoint.refresh_from_db()
    yield endpoint
    clean_redis.delete(RECOMMENDATION_KEY.format(endpoint_id=endpoint.pk))


def test_the_planner_plans_with_the_endpoints_threshold_and_shows_the_recommended_one(client, operator, disaggregated):
    client.force_login(operator)
    url = reverse("console:planner-pd")
    start = client.get(url, {"endpoint": disaggregated.pk})
    form = start.context["form"]
    assert form.initial["min_uncached_tokens"] == 1024 and form.initial["endpoint"] == disaggregated.pk
    # The last hour's 10 prompts: their rate, and their uncached tokens' mean (7 × 500 + 3 × 8,000) / 10 and spread.
    assert form.initial["arrival_rate_per_s"] == round(10 / 3600, 4)
    assert form.initial["input_tokens"] == 2750.0 and form.initial["input_tokens_sd"] > 3000
    # Their lengths as ranges split at the thresholds tried: 7 prompts of 500 uncached tokens, 3 of 8,000.
    assert form.initial["prompt_ranges"] == "7 256 512\n3 4096 8000"
    data = {name: field.initial for name, field in form.fields.items() if field.initial is not None}
    data |= {k: v for k, v in form.initial.items() if v is not None}
    data |= {"engine_profile": "llama-13b-a100", "model_profile": disaggregated.model_profile_id}
    data.pop("min_uncached_tokens")  # empty: the endpoint's own
    planned = client.post(url, data)
    assert planned.status_code == 200, planned.context["form"].errors
    plan = planned.context["result"]
    # Planned on the measured lengths: the share under 1,024 tokens is the measured 7 of 10, not a uniform range's.
    assert plan.min_uncached_tokens == 1024 and plan.bypass_share == pytest.approx(0.7)
    best = plan.threshold
    page = planned.content.decode()
    assert f"{disaggregated.name} is configured with" in page
    assert "1024 uncached tokens: 70% of prompts go straight to decode" in page
    assert (
        f"{best['recommended_min_uncached_tokens']} uncached tokens: {_pct(best['bypass_share'])} of prompts go "
        f"straight to decode ({best['gpus']} GPUs" in page
    )
    assert "Every threshold tried" in page and len(best["candidates"]) > 3
    # The endpoint's page: its threshold with the share of the last hour's prompts under it (7 of 10), and the plan's.
    detail = client.get(reverse("console:endpoint", args=[disaggregated.pk])).content.decode()
    assert "prompts under 1024 uncached tokens go straight to decode: 70% of the last hour's 10 prompts" in detail
    assert (
        f"{best['recommended_min_uncached_tokens']} uncached tokens: {_pct(best['bypass_share'])} of prompts straight "
        f"to decode, {best['gpus']} GPUs" in detail
    )
    assert "on llama-13b-a100" in detail


def test_a_threshold_given_in_the_form_wins_and_a_bad_one_is_a_field_error(client, operator, disaggregated):
    client.force_login(operator)
    url = reverse("console:planner-pd")
    form = client.get(url, {"endpoint": disaggregated.pk}).context["form"]
    data = {name: field.initial for name, field in form.fields.items() if field.initial is not None}
    data |= {k: v for k, v in form.initial.items() if v is not None} | {"engine_profile": "llama-13b-a100"}
    given = client.post(url, {**data, "min_uncached_tokens": 0})
    assert given.context["result"].min_uncached_tokens == 0
    assert "0 uncached tokens: every prompt goes through the prefill pool" in given.content.decode()
    bad = client.post(url, {**data, "min_uncached_tokens": -5, "prompt_ranges": "7 256 512\n3 4096"})
    assert bad.status_code == 400 and {"min_uncached_tokens", "prompt_ranges"} <= set(bad.context["form"].errors)
    assert "line 2: three numbers" in bad.content.decode()
    # Without ranges the share is a uniform range's of the mean and spread.
    uniform = client.post(url, {**data, "prompt_ranges": ""}).context["result"]
    assert uniform.bypass_share != pytest.approx(0.7)
    assert client.get(url, {"endpoint": "abc"}).status_code == 404
    assert client.get(url, {"endpoint": "²"}).status_code == 404  # a digit to str.isdigit, not to int()
    assert client.get(url, {"endpoint": 999_999}).status_code == 404


def test_before_any_plan_the_endpoint_page_says_so_and_an_aggregated_one_shows_none(
    client, operator, disaggregated, tenant_b
):
    client.force_login(operator)
    detail = client.get(reverse("console:endpoint", args=[disaggregated.pk])).content.decode()
    assert 'id="pd-threshold"' in detail and "not planned yet" in detail and "plan it" in detail
    aggregated = client.get(reverse("console:endpoint", args=[tenant_b.endpoint.pk])).content.decode()
    assert 'id="pd-threshold"' not in aggregated


def test_a_plan_on_other_hardware_is_not_kept_as_the_endpoints(client, operator, disaggregated):
    client.force_login(operator)
    url = reverse("console:planner-pd")
    form = client.get(url, {"endpoint": disaggregated.pk}).context["form"]
    data = {name: field.initial for name, field in form.fields.items() if field.initial is not None}
    data |= {k: v for k, v in form.initial.items() if v is not None}
    other = HardwareProfileFactory(name="h200-pd", kv_link_gbps=400)
    planned = client.post(url, {**data, "engine_profile": "llama-13b-a100", "hardware_profile": other.pk})
    assert planned.status_code == 200 and planned.context["result"] is not None
    detail = client.get(reverse("console:endpoint", args=[disaggregated.pk])).content.decode()
    assert "not planned yet" in detail  # the endpoint does not run on that hardware


def test_no_tenant_sees_another_tenants_endpoint_or_its_prompts(client, tenant_a, tenant_b, disaggregated):
    # The owner sees its endpoint's threshold and share, with no planner link (the planner is the operators').
    client.force_login(tenant_a.member)
    own = client.get(reverse("console:endpoint", args=[disaggregated.pk])).content.decode()
    assert "70% of the last hour's 10 prompts" in own and "plan it" not in own
    # Another tenant: no page, no planner.
    client.force_login(tenant_b.member)
    assert client.get(reverse("console:endpoint", args=[disaggregated.pk])).status_code == 404
    planner = client.get(reverse("console:planner-pd"), {"endpoint": disaggregated.pk})
    assert planner.status_code == 404 and disaggregated.name not in planner.content.decode()
    # A tenant reserving on the shared endpoint sees its own figures, not every tenant's prompts.
    ReservationFactory(tenant=tenant_b.tenant, endpoint=disaggregated)
    shared = client.get(reverse("console:endpoint", args=[disaggregated.pk]))
    assert shared.status_code == 200
    assert 'id="pd-threshold"' not in shared.content.decode() and "70%" not in shared.content.decode()
