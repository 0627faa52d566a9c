"""Burn-rate alerting on synthetic usage: a fast burn pages within minutes, a slow burn only tickets, recovery
resolves, and one firing alert notifies each webhook once."""

import hashlib
import hmac
from datetime import UTC, datetime, timedelta

import pytest

from billing.alerts import alert_acknowledge, slo_evaluate_all
from billing.models import Alert, AlertNotification, SLOStatus, UsageRecord, Webhook
from billing.notifiers import MAX_ATTEMPTS, notifications_deliver_due
from billing.rollups import usage_rollup_run
from tests.billing.conftest import synth_minutes
from tests.factories import SLOFactory

T0 = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)  # the incident starts here
HISTORY = timedelta(days=3, hours=1)


@pytest.fixture
def slo(tenant_a):
    return SLOFactory(endpoint=tenant_a.endpoint, objective=0.999, name="availability")


def _world(tenant_a, *, before, during, incident_minutes, after=0.0, tail=120, per_minute=1000):
    """Three days of history at ``before``, then the incident, then ``after`` for ``tail`` minutes."""
    history_minutes = int(HISTORY.total_seconds() // 60)
    total = history_minutes + incident_minutes + tail

    def bad_ratio(i: int) -> float:
        if i < history_minutes:
            return before
        return during if i < history_minutes + incident_minutes else after

    synth_minutes(
        endpoint=tenant_a.endpoint,
        tenant=tenant_a.tenant,
        start=T0 - HISTORY,
        minutes=total,
        per_minute=per_minute,
        bad_ratio=bad_ratio,
    )


def _ticks(minutes: range):
    """Evaluate once a minute (30 s into each minute) and record which alerts are open after each tick."""
    timeline = []
    for m in minutes:
        slo_evaluate_all(now=T0 + timedelta(minutes=m, seconds=30))
        timeline.append({(a.severity, a.long_window, a.state) for a in Alert.objects.exclude(state="resolved")})
    return timeline


def _first(timeline, entry) -> int | None:
    return next((i for i, state in enumerate(timeline) if entry in state), None)


def test_fast_burn_pages_within_minutes_and_recovery_resolves(tenant_a, slo):
    # 10 % errors against a 0.1 % budget: burn 100.
    _world(tenant_a, before=0.0, during=0.10, incident_minutes=20)
    timeline = _ticks(range(0, 30))
    fired = _first(timeline, ("page", "1h", "firing"))
    assert fired is not None and fired <= 10, timeline[:12]
    assert _first(timeline, ("page", "1h", "pending")) < fired
    # The incident ends at minute 20; the 5 m window clears by minute 25 and the 1h/5m page resolves.
    assert ("page", "1h", "firing") in timeline[21]
    assert ("page", "1h", "firing") not in timeline[27]
    page = Alert.objects.get(severity="page", long_window="1h")
    assert page.state == "resolved" and page.fired_at and page.resolved_at
    status = SLOStatus.objects.get(slo=slo)
    # 2,000 bad requests out of 4,410 minutes × 1,000 in the period; 0.1 % of those may fail.
    assert status.budget_remaining == pytest.approx(1 - 2000 / 4410, rel=1e-6)
    # The last hour (2,000 bad of 60,000) burns at 33.3: what is left lasts 0.546 × 30 days / 33.3 ≈ 11.8 h.
    evaluated = T0 + timedelta(minutes=29, seconds=30)
    hours_left = (status.exhausts_at - evaluated).total_seconds() / 3600
    assert hours_left == pytest.approx((1 - 2000 / 4410) * 720 / (2000 / 60000 / 0.001), rel=1e-3)


def test_slow_burn_only_tickets(tenant_a, slo):
    # 0.2 % errors for three days: burn 2, below every page threshold but above the 3d/6h ticket's 1.
    _world(tenant_a, before=0.002, during=0.002, incident_minutes=30, after=0.002)
    timeline = _ticks(range(0, 8))
    assert ("ticket", "3d", "firing") in timeline[-1]
    assert not any(sev == "page" for state in timeline for sev, _, _ in state)
    assert not any(window == "1d" for state in timeline for _, window, _ in state)  # 1d/2h needs burn 3
    status = SLOStatus.objects.get(slo=slo)
    assert status.burn_rates["3d"] == pytest.approx(2.0, rel=0.01)


def test_healthy_service_raises_nothing(tenant_a, slo):
    _world(tenant_a, before=0.0002, during=0.0002, incident_minutes=10, per_minute=10_000)
    _ticks(range(0, 3))
    assert not Alert.objects.exists()
    assert SLOStatus.objects.get(slo=slo).budget_remaining == pytest.approx(0.8, abs=0.01)


def test_fast_burn_from_raw_records_through_the_rollup(tenant_a, slo):
    """End to end: usage records → rollup task → evaluation, a total outage of a few minutes pages."""
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    rows = []
    for minute in range(-6, 1):
        for i in range(20):
            when = now + timedelta(minutes=minute, seconds=i)
            status = "upstream_error" if minute >= -3 else "ok"
            rows.append(
                UsageRecord(
                    request_id=f"raw-{minute}-{i}",
                    tenant=tenant_a.tenant,
                    endpoint=tenant_a.endpoint,
                    status=status,
                    slo_met=status == "ok",
                    started_at=when,
                    finished_at=when,
                )
            )
    UsageRecord.objects.bulk_create(rows)
    usage_rollup_run(now=now)
    slo_evaluate_all(now=now)
    slo_evaluate_all(now=now + timedelta(minutes=1))
    states = {(a.severity, a.long_window): a.state for a in Alert.objects.all()}
    assert states[("page", "1h")] == "firing"
    assert states[("page", "6h")] == "firing"


def test_one_firing_alert_notifies_each_webhook_once(tenant_a, slo, webhook_server):
    Webhook.objects.create(name="ops", url=webhook_server.url, secret="s3cret")
    Webhook.objects.create(name="tickets only", url=webhook_server.url, severities=["ticket"])
    Webhook.objects.create(name="other tenant", url=webhook_server.url, tenant=_other_tenant())
    _world(tenant_a, before=0.0, during=0.5, incident_minutes=15)
    for m in range(0, 12):
        now = T0 + timedelta(minutes=m, seconds=30)
        slo_evaluate_all(now=now)
        notifications_deliver_due(now=now)
    page_posts = [r for r in webhook_server.requests if r["json"]["alert"]["severity"] == "page"]
    # Two page pairs fire (1h/5m and 6h/30m), each notified exactly once, only to the operators' hook.
    assert sorted(r["json"]["alert"]["long_window"] for r in page_posts) == ["1h", "6h"]
    assert all(r["json"]["event"] == "firing" for r in page_posts)
    body = page_posts[0]["body"]
    expected = "sha256=" + hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
    assert page_posts[0]["headers"]["X-Infercap-Signature"] == expected
    assert AlertNotification.objects.filter(event="firing", alert__severity="page").count() == 2
    alert = Alert.objects.get(severity="page", long_window="1h")
    alert_acknowledge(alert=alert, user=tenant_a.admin)
    alert.refresh_from_db()
    assert alert.acknowledged_by == tenant_a.admin and alert.state == "firing"


def _other_tenant():
    from tests.factories import TenantFactory

    return TenantFactory()


def test_failing_webhook_is_retried_with_backoff_then_marked_failed(tenant_a, slo, webhook_server):
    webhook_server.status = 503
    Webhook.objects.create(name="flaky", url=webhook_server.url)
    _world(tenant_a, before=0.0, during=1.0, incident_minutes=5)
    slo_evaluate_all(now=T0 + timedelta(seconds=30))
    slo_evaluate_all(now=T0 + timedelta(minutes=1, seconds=30))
    notification = AlertNotification.objects.get(alert__long_window="1h")
    assert notification.event == "firing"
    AlertNotification.objects.exclude(pk=notification.pk).delete()
    now = T0 + timedelta(minutes=2)
    notifications_deliver_due(now=now)
    notifications_deliver_due(now=now + timedelta(seconds=5))  # backoff not elapsed yet: no second try
    assert len(webhook_server.requests) == 1
    for _ in range(10):
        now += timedelta(minutes=15)
        notifications_deliver_due(now=now)
    notification.refresh_from_db()
    assert notification.status == "failed" and notification.attempts == MAX_ATTEMPTS
    assert "503" in notification.last_error
    assert len(webhook_server.requests) == MAX_ATTEMPTS


def test_unreachable_webhook_is_recorded_not_raised(tenant_a, slo):
    Webhook.objects.create(name="nowhere", url="http://127.0.0.1:9/hook")
    _world(tenant_a, before=0.0, during=1.0, incident_minutes=5)
    slo_evaluate_all(now=T0 + timedelta(seconds=30))
    slo_evaluate_all(now=T0 + timedelta(minutes=1, seconds=30))
    result = notifications_deliver_due(now=T0 + timedelta(minutes=2))
    assert result.retrying >= 1
    assert AlertNotification.objects.filter(last_error__icontains="connect").exists()


def test_overlapping_evaluations_skip_instead_of_racing(tenant_a, slo):
    """A tick that finds another evaluation holding the lock (a slow previous tick) skips rather than double-alerting."""
    import psycopg
    from django.db import connection

    from billing.alerts import EVALUATION_LOCK

    params = connection.settings_dict
    other = psycopg.connect(
        dbname=params["NAME"],
        user=params["USER"],
        password=params["PASSWORD"] or None,
        host=params["HOST"] or None,
        port=params["PORT"] or None,
        autocommit=True,
    )
    try:
        other.execute("SELECT pg_advisory_lock(%s)", [EVALUATION_LOCK])
        assert slo_evaluate_all(now=T0).skipped
        other.execute("SELECT pg_advisory_unlock(%s)", [EVALUATION_LOCK])
        assert not slo_evaluate_all(now=T0).skipped
    finally:
        other.close()


def test_disabling_an_slo_resolves_its_open_alerts(tenant_a, slo, webhook_server):
    Webhook.objects.create(name="ops", url=webhook_server.url)
    _world(tenant_a, before=0.0, during=1.0, incident_minutes=10)
    timeline = _ticks(range(0, 3))
    assert ("page", "1h", "firing") in timeline[-1]
    slo.enabled = False
    slo.save()
    slo_evaluate_all(now=T0 + timedelta(minutes=4))
    assert not Alert.objects.exclude(state="resolved").exists()
    assert set(AlertNotification.objects.values_list("alert__long_window", "event")) >= {
        ("1h", "firing"),
        ("1h", "resolved"),
    }
