"""A real Prometheus, configured from the shipped scrape.yml and rules, scrapes a running platform: every Grafana
panel's query returns data (benchmarks/operations/dashboard_check.py sets up the world; EXEMPT there says which cannot, and why)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from benchmarks.operations import dashboard_check
from benchmarks.operations.prometheus_check import prometheus_binary
from capacity.models import AutoscalerDecision
from tests.factories import EndpointFactory, ReservationFactory, SLOFactory

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(prometheus_binary() is None, reason="prometheus not installed (scripts/ensure_prometheus.sh)"),
]


def test_every_panel_query_returns_data_from_the_shipped_scrape_config(clean_redis, tenant_a, tenant_b):
    # Given a shared endpoint both tenants reserve (B with a small per-minute request limit, so its bursts are
    # refused), an availability SLO, and the autoscaler's last decision.
    # Latency SLOs no loaded machine misses: the panels need good tokens (the cost per good token), not a race.
    endpoint = EndpointFactory(name="shared-chat", ttft_slo_ms=60_000, tpot_slo_ms=10_000)
    ReservationFactory(tenant=tenant_a.tenant, endpoint=endpoint, mu_per_min=1e6)
    ReservationFactory(tenant=tenant_b.tenant, endpoint=endpoint, mu_per_min=1e6, rpm_limit=20)
    SLOFactory(endpoint=endpoint, objective=0.99, name="availability")
    AutoscalerDecision.objects.create(endpoint=endpoint, axis="horizontal", current=2, desired=3, reason="demand",
                                      at=timezone.now() - timedelta(seconds=5))  # fmt: skip
    keys = {tenant_a.tenant.slug: tenant_a.raw_key, tenant_b.tenant.slug: tenant_b.raw_key}
    variables = {"endpoint": endpoint.name, "tenant": "|".join(keys)}

    # When Prometheus scrapes it through traffic, and every panel's query runs.
    result = dashboard_check.run(endpoint=endpoint, keys=keys, variables=variables)

    # Then the shipped jobs keep exactly the proxy, the books through the Service and both replicas (not the
    # worker's or beat's pods), and every one is up.
    kept = sorted((job, health) for job, health, _ in result["targets"])
    assert kept == [("infercap-platform", "up"), ("infercap-web", "up"), ("vllm", "up"), ("vllm", "up")], kept
    # And every panel's query returns a series with a value (the exempt ones: their substitute query).
    empty = [(q.panel, q.promql) for q, series in result["queries"] if not series]
    assert not empty, empty
    # And each answer carries the labels its legend names; the variables list this world's endpoint and tenants.
    unnamed = [(q.panel, q.expr, label) for q, series in result["queries"] for label in q.legend_labels
               if not all(label in s["metric"] for s in series)]  # fmt: skip
    assert not unnamed, unnamed
    assert endpoint.name in result["variables"]["endpoint"], result["variables"]
    assert set(keys) <= set(result["variables"]["tenant"]), result["variables"]
    assert len(result["queries"]) >= 29
    assert {q.expr for q, _ in result["queries"] if q.exempt} == set(dashboard_check.EXEMPT)
