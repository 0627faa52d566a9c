"""Real Prometheus tooling on the exported rules: ``promtool check rules`` loads what ``export_slo_rules`` writes, and
``promtool test rules`` replays a scenario whose alerts the platform's evaluator fires at the same steps
(``billing.rule_scenario`` generates both sides from one series)."""

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from django.core.management import call_command

from billing.rule_scenario import DEFAULT_PHASES, Phase, promtool_test
from gateway.proxy.metrics import TPOT_BUCKETS, TTFT_BUCKETS
from tests.factories import SLOFactory

PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (scripts/ensure_prometheus.sh)")


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_promtool_loads_every_exported_rule(tenant_a, tmp_path):
    SLOFactory(endpoint=tenant_a.endpoint, tenant=tenant_a.tenant, objective=0.999, name='av "quoted"')
    SLOFactory(endpoint=tenant_a.endpoint, sli="ttft", objective=0.99, ttft_ms=2000, name="ttft")
    SLOFactory(endpoint=tenant_a.endpoint, sli="tpot", objective=0.99, name="tpot")
    SLOFactory(endpoint=tenant_a.endpoint, sli="goodput", objective=0.95, name="goodput")
    call_command("export_slo_rules", "--output", str(tmp_path / "slo.yml"))
    checked = _promtool("check", "rules", "slo.yml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 44 rules found" in checked.stdout  # 4 SLOs × (7 recording + 4 alerting)


def _write(tmp_path: Path, phases=DEFAULT_PHASES) -> dict:
    rules, test, summary = promtool_test("rules.yml", phases=phases, buckets=(TTFT_BUCKETS, TPOT_BUCKETS))
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test))
    return summary


def test_prometheus_fires_a_page_and_a_ticket_at_the_platforms_steps(tmp_path):
    summary = _write(tmp_path)
    first = summary["first_firing_minute"]
    # The outage starts at minute 60: the pages fire within minutes, the tickets after their 5-minute `for:`.
    assert 60 < first["page 1h/5m"] < 80 and 60 < first["page 6h/30m"] < 80
    assert 60 < first["ticket 1d/2h"] < 80 and 60 < first["ticket 3d/6h"] < 80
    assert summary["alert_steps_checked"] >= 20 and summary["burn_rate_samples_checked"] == 21
    run = _promtool("test", "rules", "test.yml", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr


def test_promtool_fails_when_the_expectations_are_a_minute_off(tmp_path):
    # The check can fail: the same series with the platform's expectations taken one step early.
    _write(tmp_path)
    test = yaml.safe_load((tmp_path / "test.yml").read_text())
    cases = test["tests"][0]["alert_rule_test"]
    test["tests"][0]["alert_rule_test"] = [
        {**case, "eval_time": f"{int(case['eval_time'][:-1]) - 1}m"} for case in cases if case["eval_time"] != "0m"
    ]
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test))
    run = _promtool("test", "rules", "test.yml", cwd=tmp_path)
    assert run.returncode != 0 and "FAILED" in run.stdout + run.stderr


def test_a_healthy_scenario_fires_nothing_on_either_side(tmp_path):
    summary = _write(tmp_path, phases=(Phase(180, {"ok": 199, "upstream_error": 1}),))
    assert set(summary["first_firing_minute"].values()) == {None}
    run = _promtool("test", "rules", "test.yml", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
