"""The tenant statement page: a month or a date range, a CSV download of the same figures, currency and thousands
separators, and clear errors for a bad period."""

import csv
import io
from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from billing.statements import statement_for
from console.views.tenant import _safe_text
from tenants.models import CapacityReservation

pytestmark = pytest.mark.django_db


def _last_month(now):
    first = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    start = (first - timedelta(days=1)).replace(day=1)
    return start, first


def test_a_month_page_and_its_csv_hold_the_same_figures(client, tenant_a):
    client.force_login(tenant_a.admin)
    now = timezone.now()
    start, end = _last_month(now)
    # Tenant A's reservation has been held for two months: last month bills every one of its minutes.
    CapacityReservation.objects.filter(tenant=tenant_a.tenant).update(created_at=now - timedelta(days=70))
    url = reverse("console:statement")
    page = client.get(url, {"month": f"{start:%Y-%m}"})
    assert page.status_code == 200
    body = page.content.decode()
    assert f"{start:%B %Y}" in body and "USD" in body and 'id="statement-csv"' in body
    download = client.get(url, {"month": f"{start:%Y-%m}", "format": "csv"})
    assert download.status_code == 200 and download["Content-Type"].startswith("text/csv")
    assert f"-{start:%Y%m%d}-{end:%Y%m%d}.csv" in download["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(download.content.decode())))
    expected = statement_for(tenant=tenant_a.tenant, start=start, end=end, now=now)
    assert [r["endpoint"] for r in rows] == [tenant_a.endpoint.name, "TOTAL"]
    assert [line.endpoint for line in expected.lines] == [tenant_a.endpoint.name]
    assert all(r["currency"] == "USD" and r["period_start"] == start.isoformat() for r in rows)
    assert float(rows[-1]["total_usd"]) == pytest.approx(expected.total_usd, abs=1e-6)
    assert float(rows[-1]["reserved_mu"]) == pytest.approx(expected.reserved_mu, abs=1e-6)
    minutes = (end - start).total_seconds() / 60
    reservation = CapacityReservation.objects.get(tenant=tenant_a.tenant)
    assert float(rows[0]["reserved_mu"]) == pytest.approx(reservation.mu_per_min * minutes, rel=1e-6)
    assert float(rows[-1]["total_usd"]) > 0
    # The page shows the same total, with thousands separators and the currency.
    assert f"${expected.total_usd:,.2f} USD" in body


def test_a_date_range_ends_at_midnight_after_its_last_day_and_never_after_now(client, tenant_a):
    client.force_login(tenant_a.admin)
    now = timezone.now()
    first = (now - timedelta(days=3)).date()
    download = client.get(
        reverse("console:statement"), {"start": f"{first:%Y-%m-%d}", "end": f"{now.date():%Y-%m-%d}", "format": "csv"}
    )
    rows = list(csv.DictReader(io.StringIO(download.content.decode())))
    assert rows[0]["period_start"] == datetime(first.year, first.month, first.day, tzinfo=UTC).isoformat()
    assert datetime.fromisoformat(rows[0]["period_end"]) <= timezone.now()


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ({"month": "2026-13"}, "month"),
        ({"start": "2026-11-10", "end": "2026-11-01"}, "must not be before the start"),
        ({"start": "2026-11-10"}, "give both a start and an end date"),
        ({"start": "2024-01-01", "end": "2026-01-01"}, "at most 366 days"),
    ],
)
def test_a_bad_period_says_why_and_shows_this_month(client, tenant_a, query, says):
    client.force_login(tenant_a.admin)
    page = client.get(reverse("console:statement"), query)
    assert page.status_code == 200
    body = page.content.decode()
    assert says in body and "Showing this month instead." in body
    assert f"{timezone.now():%B %Y}" in body
    # No CSV of a period nobody asked for.
    csv_answer = client.get(reverse("console:statement"), {**query, "format": "csv"})
    assert not csv_answer["Content-Type"].startswith("text/csv")


def test_a_month_not_begun_bills_nothing(client, tenant_a):
    client.force_login(tenant_a.admin)
    later = timezone.now() + timedelta(days=40)
    page = client.get(reverse("console:statement"), {"month": f"{later:%Y-%m}"}).content.decode()
    assert "has not begun" in page and 'id="statement-csv"' not in page


def test_a_cell_a_spreadsheet_would_run_is_written_as_text():
    assert _safe_text("=HYPERLINK(1)") == "'=HYPERLINK(1)" and _safe_text("-1+2") == "'-1+2"
    assert _safe_text("llama-8b") == "llama-8b"
