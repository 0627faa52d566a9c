"""bench slo in a smoke size: its generated usage rows fit the table as it is now (a column added without a
database default breaks the bulk insert, which once left the bench failing at once), and it prints its figures."""

import pytest

from benchmarks.billing.slo import run
from billing.models import UsageRecord


@pytest.mark.django_db(transaction=True)
def test_bench_slo_runs_on_the_current_schema_and_leaves_nothing_behind():
    figures = run(quick=True, plot=None, progress=lambda message: None, rows=20_000, slos=20, endpoints=5, tenants=3)
    assert figures["usage_rows"] >= 20_000 and figures["slos"] == 20
    assert figures["alerts_firing"] + figures["alerts_pending"] >= 1  # endpoint 0's error burst opens alerts
    assert not UsageRecord.objects.exists()  # rolled back
