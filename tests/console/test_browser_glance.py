"""The console at a glance, in headless Chromium, judged from its screenshots (tests/console/png.py reads them):
a fast TTFT under a far SLO fills its chart instead of lying flat on the axis; the fleet's totals and its sortable
table; the statement's period picker. Screenshots are kept in artifacts/screenshots/."""

from datetime import timedelta

import pytest
from django.utils import timezone

from billing.rollups import usage_rollup_run
from capacity.models import AutoscalerDecision
from endpoints.models import Endpoint, ReplicaState
from tenants.models import ApiKey
from tests.console.browser import login, screenshot
from tests.console.png import read_png, rows_with
from tests.factories import EndpointFactory, ReplicaFactory, UsageRecordFactory

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SERIES_BLUE = (0x00, 0x72, 0xB2)  # charts.PALETTE[0]: the first series


def test_a_fast_ttft_under_a_far_slo_fills_its_chart(page, operator, tenant_a):
    endpoint = tenant_a.endpoint
    Endpoint.objects.filter(pk=endpoint.pk).update(ttft_slo_ms=2000)
    now = timezone.now()
    for minute in range(2, 30):  # TTFT rising 50 → 100 ms over the half hour, far under the 2,000 ms SLO
        for i in range(4):
            UsageRecordFactory(
                tenant=tenant_a.tenant,
                endpoint=endpoint,
                ttft_ms=100 - minute * 50 / 30 + i,
                finished_at=now - timedelta(minutes=minute, seconds=i),
            )
    usage_rollup_run()
    login(page, operator.username)
    page.goto(f"/console/endpoints/{endpoint.pk}/")
    chart = page.locator("svg[aria-label='TTFT p95 (ms)']")
    chart.scroll_into_view_if_needed()
    width, height, rows = read_png(chart.screenshot())
    screenshot(page, "glance-endpoint-ttft")
    # The plot's frame in pixels (console/charts.py: 28 px above it, 40 below, in a 220-unit-high drawing); the
    # legend's swatch lies below it.
    top, bottom = height * 28 / 220, height * 180 / 220
    drawn = [y for y in rows_with(rows, SERIES_BLUE, tolerance=30) if top <= y <= bottom]
    assert drawn, "the TTFT series is not in the plot"
    # The line stands well up the plot: the axis follows the data, not the SLO 20× above it. (With the SLO setting
    # the axis, it lay 2 % of the plot's height above the x-axis.)
    elevation = (bottom - min(drawn)) / (bottom - top)
    assert elevation > 0.25, (drawn, height, elevation)
    assert chart.locator("line.threshold.off-scale").count() == 1
    assert "SLO 2000 ms ↑ above this axis" in chart.text_content()


def test_the_fleet_reads_at_a_glance_and_sorts(page, operator):
    for i in range(14):
        endpoint = EndpointFactory(name=f"fleet-{i:02d}")
        for _ in range(i % 4):
            ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY)
    login(page, operator.username)
    page.goto("/console/fleet/")
    totals = page.locator("#fleet-totals")
    assert totals.locator("[data-total='gpus']").inner_text().strip() == str(sum(i % 4 for i in range(14)))
    assert page.locator("#fleet-table tbody tr").count() == 14
    page.locator("#fleet-table thead a", has_text="Ready").click()
    page.wait_for_url("**sort=ready**")
    page.locator("#fleet-table thead a", has_text="Ready").click()  # again: descending
    page.wait_for_url("**dir=desc**")
    first = page.locator("#fleet-table tbody tr").first.locator("td").nth(1).inner_text()
    assert first.startswith("3 /"), first
    screenshot(page, "glance-fleet-table")


def test_the_statement_picks_its_period(page, tenant_a):
    login(page, tenant_a.admin.username)
    page.goto("/console/tenant/statement/")
    now = timezone.now()
    last = (now.replace(day=1) - timedelta(days=1)).replace(day=1)
    page.fill("input[name='month']", f"{last:%Y-%m}")
    page.get_by_role("button", name="Show").click()
    page.wait_for_url(f"**month={last:%Y-%m}**")
    assert f"{last:%B %Y}" in page.locator("h1").inner_text()
    assert page.locator("#statement-csv").get_attribute("href").endswith("format=csv")
    screenshot(page, "glance-statement")


OPERATOR_PINK = (0xCC, 0x79, 0xA7)  # console.css: an operator's mark on the replicas chart


def test_an_operator_scale_is_a_mark_of_its_own_on_the_replicas_chart(page, operator, tenant_a):
    endpoint = tenant_a.endpoint
    now = timezone.now()
    AutoscalerDecision.objects.create(
        endpoint=endpoint, axis="horizontal", tick="manual-x", current=1, desired=3, reason="operator scale by ops",
        applied=True, at=now - timedelta(minutes=20),
    )  # fmt: skip
    AutoscalerDecision.objects.create(
        endpoint=endpoint, axis="horizontal", tick="h-1", current=3, desired=4, reason="scale up: demand",
        applied=True, at=now - timedelta(minutes=10),
    )  # fmt: skip
    login(page, operator.username)
    page.goto(f"/console/endpoints/{endpoint.pk}/")
    chart = page.locator("svg[aria-label^='Ready replicas']")
    chart.scroll_into_view_if_needed()
    assert chart.locator("line.marker.operator").count() == 1 and chart.locator("line.marker").count() == 2
    _, _, rows = read_png(chart.screenshot())
    screenshot(page, "glance-operator-mark")
    assert rows_with(rows, OPERATOR_PINK, tolerance=25), "the operator's mark is not drawn in its colour"


def test_the_keys_page_shows_a_spent_budget(page, tenant_a):
    ApiKey.objects.filter(pk=tenant_a.key.pk).update(rpm_limit=1200, budget_usd=0.001, budget_period="day")
    UsageRecordFactory(tenant=tenant_a.tenant, endpoint=tenant_a.endpoint, api_key=tenant_a.key, mu=1000.0)
    login(page, tenant_a.admin.username)
    page.goto("/console/tenant/keys/")
    row = page.locator("tr", has_text=tenant_a.key.prefix)
    assert "1,200 req/min" in row.locator(".key-limits").inner_text()
    assert "spent" in row.locator(".key-spend").inner_text()
    assert "Spent this month" in page.locator("#tenant-spend").inner_text()
    screenshot(page, "glance-keys")
