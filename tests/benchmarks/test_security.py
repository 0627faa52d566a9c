"""The security bench: every registered attack case is refused on this code (failures == 0), and the runner turns a
case that is not refused, or that crashes, into a failed result with its reason instead of stopping."""

import json

import pytest
from django.core.management import call_command

from benchmarks.harness.security.registry import CASES, Case, case_run, cases_load, cases_select, expect
from benchmarks.operations.security import run
from tenants.models import Tenant

OWN_CASES = {
    "webhooks.literal_internal_ips",
    "webhooks.names_resolving_internally",
    "webhooks.rebinding_at_delivery",
    "isolation.api_other_tenants_endpoint",
    "isolation.api_other_tenants_usage",
    "isolation.api_other_tenants_reservations",
    "isolation.api_other_tenants_keys_and_webhooks",
    "isolation.api_key_scopes",
    "isolation.api_key_cannot_mint_stronger_key",
    "isolation.proxy_other_tenants_model",
    "isolation.proxy_credentials",
}


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)  # the proxy is another process: the world must be committed
def test_quick_bench_refuses_every_attack(clean_redis):
    figures = run(quick=True, progress=lambda message: None)
    results = {r["name"]: r for r in figures["security.results"]}
    assert OWN_CASES <= set(results)
    assert figures["security.cases"] == len(results)
    assert figures["security.failures"] == 0, [r for r in results.values() if not r["passed"]]
    assert all(r["detail"] for r in results.values())


@pytest.mark.django_db(transaction=True)
def test_bench_command_prints_the_figures_as_the_last_json_line(capsys):
    call_command("bench", "security", "--quick", "--opt", "cases=webhooks.")
    last = capsys.readouterr().out.strip().splitlines()[-1]
    figures = json.loads(last)
    assert {r["name"] for r in figures["security.results"]} == {n for n in OWN_CASES if n.startswith("webhooks.")}
    assert figures["security.failures"] == 0


def test_unknown_case_names_are_an_error():
    with pytest.raises(ValueError, match="no security case matches"):
        cases_select(quick=True, names=["no.such.case"])


@pytest.mark.django_db
def test_a_case_not_refused_or_crashing_is_a_failure_and_its_writes_are_rolled_back():
    cases_load()
    assert OWN_CASES <= set(CASES)

    def accepted(world) -> str:
        Tenant.objects.create(name="left behind?", slug="left-behind")
        expect(False, "the attack went through")
        return "unreachable"

    def crashed(world) -> str:
        raise KeyError("boom")

    failed = case_run(Case(name="t.accepted", description="", func=accepted), world=None)
    assert (failed.passed, failed.detail) == (False, "the attack went through")
    assert not Tenant.objects.filter(slug="left-behind").exists()
    errored = case_run(Case(name="t.crashed", description="", func=crashed), world=None)
    assert not errored.passed and errored.detail == "error: KeyError: 'boom'"
    passed = case_run(Case(name="t.ok", description="", func=lambda world: "refused\nwith 403"), world=None)
    assert passed.passed and passed.detail == "refused with 403"
