"""The security bench's scoping and suspension cases refuse every attack on this code (docs/security.md: "Tenant
isolation on the REST API", "Suspended tenants"), under the test settings too (the suspension's worker task runs
eagerly there, on the committed world, and the cases restore it)."""

import pytest

from benchmarks.operations.security import run

CASES = {
    "scoping.autoscaler_decisions_of_shared_endpoint",
    "scoping.benchmarks_name_other_tenants",
    "scoping.operator_alert_acknowledged_by_tenant",
    "scoping.alert_acknowledgement_audited",
    "scoping.alert_acknowledger_hidden",
    "suspension.api_sessions_and_keys",
    "suspension.console_logins_and_pages",
    "suspension.console_socket",
    "suspension.proxy_keys",
    "suspension.autoscaler_and_replicas",
    "suspension.operators_unaffected",
}


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)  # the proxy and the socket's consumer read the committed world
def test_scoping_and_suspension_cases_pass(clean_redis):
    figures = run(quick=True, cases="scoping.,suspension.", progress=lambda message: None)
    results = {r["name"]: r for r in figures["security.results"]}
    assert set(results) == CASES
    assert figures["security.failures"] == 0, [r for r in results.values() if not r["passed"]]
