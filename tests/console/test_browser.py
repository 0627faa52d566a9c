"""The console in headless Chromium against a real uvicorn server: operators and tenants log in with the
keyboard, act through forms, and see replicas appear live over the WebSocket. Screenshots: artifacts/screenshots/."""

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from billing.alerts import slo_evaluate_all
from billing.models import Alert
from billing.rollups import usage_rollup_run
from capacity.models import AutoscalerDecision
from console.queue_history import HISTORY_KEY, queue_sample
from console.selectors import DEMAND_KEY
from endpoints.models import Endpoint, Replica, ReplicaState
from endpoints.services import replica_transition
from tenants.models import ApiKey
from tests.console.browser import login, screenshot
from tests.factories import ReplicaFactory, SLOFactory, UsageRecordFactory

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _traffic(endpoint, tenant, minutes: int = 30, step: int = 1) -> None:
    """What the proxy would have written: a few requests per minute with rising latency."""
    now = timezone.now()
    for minute in range(0, minutes, step):
        for i in range(3):
            UsageRecordFactory(
                tenant=tenant,
                endpoint=endpoint,
                ttft_ms=300 + 40 * minute + 10 * i,
                tpot_ms=30 + minute,
                mu=12.0,
                output_tokens=200,
                slo_met=minute < 25,
                finished_at=now - timedelta(minutes=minute, seconds=i),
            )


def _redis():
    import redis
    from django.conf import settings

    return redis.Redis.from_url(settings.REDIS_URL)


def _queue_samples(endpoint) -> None:
    """What the proxy publishes and the console's beat task samples: queue depth by class over ten minutes."""
    demand = DEMAND_KEY.format(endpoint_id=endpoint.pk)
    client = _redis()
    now = timezone.now().timestamp()
    for i in range(10):
        queued = {"critical": i % 3, "standard": 2 * i, "sheddable": max(0, 12 - 2 * i)}
        client.hset(demand, "proxy-1", json.dumps({"queued_by_class": queued}))
        queue_sample(endpoint_ids=[endpoint.pk], now=now - 60 * (10 - i))
    client.delete(demand)


def test_operator_creates_endpoint_sees_replicas_live_and_charts(page, operator, tenant_a, tenant_b):
    login(page, "operator")
    page.wait_for_selector("body[data-live-state='live']")
    assert page.locator(".endpoint-card").count() == 2
    screenshot(page, "operator-fleet")

    page.get_by_role("link", name="New endpoint").first.click()
    page.get_by_label("Name").fill("bad name!")
    page.get_by_role("button", name="Continue").click()
    assert "Use letters, digits" in page.locator(".field.has-error").first.inner_text()
    assert page.evaluate("document.activeElement.id") == "id_name"  # focus moves to the first bad field
    screenshot(page, "operator-endpoint-form-errors")
    page.get_by_label("Name").fill("llama-live")
    page.get_by_label("Model profile").select_option(label="llama-13b")
    page.get_by_label("Hardware profile").select_option(label="a100-80g")
    page.get_by_label("Desired replicas").fill("2")
    page.get_by_role("button", name="Continue").click()
    page.get_by_role("button", name="Confirm").click()
    page.wait_for_selector("h1:has-text('Endpoint llama-live')")
    page.wait_for_selector("body[data-live-state='live']")
    assert "No replicas yet" in page.locator("#replica-table").inner_text()
    page.evaluate("window.__notReloaded = true")

    endpoint = Endpoint.objects.get(name="llama-live")
    for name in ("r0", "r1"):  # what the actuator does: start replicas and move them along their lifecycle
        replica = Replica.objects.create(endpoint=endpoint, name=f"llama-live-{name}", actuator="local")
        replica_transition(replica=replica, to_state=ReplicaState.STARTING)
        replica_transition(replica=replica, to_state=ReplicaState.READY)
    page.wait_for_function("document.querySelectorAll('#replica-table .state-ready').length === 2")
    assert page.evaluate("window.__notReloaded === true")  # arrived over the socket, not by a reload

    _traffic(endpoint, tenant_a.tenant)
    usage_rollup_run()  # the per-minute beat task; charts read its rollups
    _queue_samples(endpoint)
    AutoscalerDecision.objects.create(
        endpoint=endpoint,
        axis="horizontal",
        current=1,
        desired=2,
        reason="demand 1.6 replicas",
        at=timezone.now() - timedelta(minutes=10),
    )
    page.reload()
    titles = (
        "Requests per second",
        "Queue depth by priority class",
        "TTFT p95 (ms)",
        "TPOT p95 (ms)",
        "MU used vs capacity",
    )
    for title in titles:
        chart = page.locator(f"svg[aria-label='{title}']")
        assert chart.locator("polyline").count() >= 1, title
        assert chart.bounding_box()["width"] > 300, title
    assert page.locator("svg[aria-label^='Ready replicas'] line.marker").count() == 1
    assert page.locator("svg[aria-label='Queue depth by priority class'] polyline").count() == 3
    screenshot(page, "operator-endpoint-detail")
    _redis().delete(HISTORY_KEY.format(endpoint_id=endpoint.pk))

    page.get_by_role("link", name="Drain").first.click()
    page.get_by_role("button", name="Continue").click()
    page.get_by_role("button", name="Confirm").click()
    page.wait_for_selector(".messages >> text=is draining")
    assert page.locator("#replica-table .state-draining").count() == 1

    slo = SLOFactory(endpoint=endpoint, name="llama-goodput", sli="goodput", objective=0.99)
    slo_evaluate_all()
    if not Alert.objects.filter(slo=slo).exclude(state="resolved").exists():
        Alert.objects.create(
            slo=slo,
            severity="page",
            state="firing",
            long_window="1h",
            short_window="5m",
            burn_rate_threshold=14.4,
            burn_rate_long=16.7,
            burn_rate_short=16.7,
        )
    for link, name in [("SLOs", "operator-slos"), ("Cost", "operator-cost"), ("Tenants", "operator-tenants")]:
        page.get_by_role("link", name=link, exact=True).click()
        page.wait_for_load_state()
        screenshot(page, name)
    page.get_by_role("link", name="SLOs", exact=True).click()
    page.get_by_role("link", name="Acknowledge").first.click()
    page.get_by_role("button", name="Continue").click()
    page.get_by_role("button", name="Confirm").click()
    page.wait_for_selector(".messages >> text=Alert acknowledged")

    page.get_by_role("link", name="Planner").click()
    page.get_by_role("button", name="Plan").click()
    assert "3 replicas" in page.locator(".planner-result h2").inner_text()
    screenshot(page, "operator-planner")

    page.get_by_role("link", name="Audit").click()
    trail = page.locator("table").inner_text()
    for action in ("endpoint.create", "replica.drain", "alert.acknowledge"):
        assert action in trail, action
    screenshot(page, "operator-audit")


def test_tenant_creates_key_once_and_sees_only_its_endpoints(page, tenant_a, tenant_b):
    ReplicaFactory(endpoint=tenant_b.endpoint, name="b-r1")
    _traffic(tenant_a.endpoint, tenant_a.tenant, minutes=8 * 60, step=10)
    _traffic(tenant_b.endpoint, tenant_b.tenant, minutes=5)
    usage_rollup_run()
    login(page, "a-admin")
    page.wait_for_selector("body[data-live-state='live']")
    table = page.locator("#tenant-endpoints").inner_text()
    assert "a-model" in table and "b-model" not in table
    assert page.locator("svg[aria-label^='Usage, last 24 hours'] polyline").count() == 1
    screenshot(page, "tenant-endpoints")

    page.get_by_role("link", name="API keys").click()
    page.get_by_label("Name").focus()
    page.keyboard.press("Enter")  # empty name, submitted from the keyboard
    assert "This field is required." in page.locator(".field.has-error").first.inner_text()
    page.keyboard.type("ci-pipeline")  # focus is back on the field in error
    page.keyboard.press("Enter")
    page.get_by_role("button", name="Confirm").focus()
    page.keyboard.press("Enter")
    shown = page.locator("#new-key-value").input_value()
    key = ApiKey.objects.get(tenant=tenant_a.tenant, name="ci-pipeline")
    assert shown.startswith(key.prefix) and len(shown) > 30
    screenshot(page, "tenant-api-key-shown-once")
    page.reload()
    assert page.locator("#new-key-value").count() == 0
    assert shown not in page.content()

    response = page.goto(f"/console/endpoints/{tenant_b.endpoint.pk}/")
    assert response.status == 404
    response = page.goto("/console/fleet/")
    assert response.status == 404
    page.goto("/console/tenant/statement/")
    screenshot(page, "tenant-statement")


FORM_CASES = [
    # (url builder, field label, bad value, expected error fragment)
    ("scale", "Desired replicas", "999", "must lie within"),
    ("sell", "MU per minute", "-1", "greater than"),
    ("planner", "Arrival rate λ (req/s)", "-2", "greater than or equal to 0"),
    ("cost", "Hours", "0", "greater than or equal to 1"),
    ("drain", "Reason", "x" * 201, "at most 200 characters"),
    ("ack", "Note", "y" * 201, "at most 200 characters"),
]


def test_every_operator_form_shows_field_errors(page, operator, tenant_a, tenant_b):
    replica = ReplicaFactory(endpoint=tenant_a.endpoint, name="a-r1", state=ReplicaState.READY)
    alert = Alert.objects.create(
        slo=SLOFactory(endpoint=tenant_a.endpoint),
        severity="ticket",
        state="firing",
        long_window="1d",
        short_window="2h",
        burn_rate_threshold=3,
    )
    urls = {
        "scale": f"/console/endpoints/{tenant_a.endpoint.pk}/scale/",
        "sell": f"/console/reservations/new/?tenant={tenant_b.tenant.pk}&endpoint={tenant_a.endpoint.pk}",
        "planner": "/console/planner/",
        "cost": "/console/cost/",
        "drain": f"/console/endpoints/{tenant_a.endpoint.pk}/replicas/{replica.pk}/drain/",
        "ack": f"/console/alerts/{alert.pk}/ack/",
    }
    login(page, "operator")
    for case, label, bad, expected in FORM_CASES:
        page.goto(urls[case])
        field = page.get_by_label(label)
        field.evaluate("el => el.removeAttribute('maxlength')")  # what a hand-made request could send
        field.fill(bad)
        field.press("Enter")
        page.wait_for_selector(".field.has-error")
        error = page.locator(".field.has-error").first
        assert expected in error.inner_text(), (case, error.inner_text())
        assert error.locator("input, select, textarea").first.get_attribute("aria-invalid") == "true", case
    screenshot(page, "operator-form-errors")


def test_without_websocket_the_page_falls_back_to_periodic_refresh(page, tenant_a):
    page.add_init_script("window.infercapPollMs = 1000")
    page.route_web_socket("**/ws/console/", lambda ws: ws.close())  # the socket is refused every time
    login(page, "a-member")
    page.goto(f"/console/endpoints/{tenant_a.endpoint.pk}/")
    page.wait_for_selector("body[data-live-state='polling']")
    assert "refreshing every" in page.locator("#live-status").inner_text()
    page.evaluate("window.__notReloaded = true")
    ReplicaFactory(endpoint=tenant_a.endpoint, name="a-polled", state=ReplicaState.READY)
    page.wait_for_selector("#replica-table >> text=a-polled")
    assert page.evaluate("window.__notReloaded === true")
