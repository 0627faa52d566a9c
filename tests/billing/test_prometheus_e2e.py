"""A real Prometheus scraping a real proxy and a simulated replica: its recording rules' burn rate matches the
platform evaluator on the same traffic within 1% (benchmarks/operations/prometheus_check.py sets up the world)."""

import pytest

from benchmarks.operations.prometheus_check import compare, prometheus_binary
from tenants.models import CapacityReservation
from tests.factories import SLOFactory

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(prometheus_binary() is None, reason="prometheus not installed (scripts/ensure_prometheus.sh)"),
]


def test_recording_rule_burn_rate_matches_the_platforms_within_one_percent(clean_redis, tenant_a):
    # Enough reserved capacity that no request is rate limited (they would count for neither side anyway).
    CapacityReservation.objects.filter(tenant=tenant_a.tenant).update(mu_per_min=1e6)
    slo = SLOFactory(endpoint=tenant_a.endpoint, objective=0.99, name="availability")
    result = compare(endpoint=tenant_a.endpoint, raw_key=tenant_a.raw_key, slo=slo, requests=400, error_rate=0.1)
    good, valid = result["platform_window_counts_5m"]
    assert valid >= 400 * 0.95 and 0.05 < 1 - good / valid < 0.2, result
    assert result["relative_error"] <= 0.01, repr(result)
