"""The shipped dashboard and monitoring objects: generated from code and current, every panel reading a series the
platform exposes (the proxy's /metrics, /metrics/platform) or a recording rule, and every recording rule reading a
series the proxy or a vLLM replica exposes; /metrics/platform serves the books behind the panels."""

import json
import shutil
import subprocess
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
import yaml
from django.core.management import call_command
from django.utils import timezone
from prometheus_client import REGISTRY, generate_latest

import gateway.proxy.metrics  # noqa: F401 - registers the proxy's metrics in REGISTRY
from benchmarks.operations import dashboard_check
from billing.models import CostReport
from capacity.models import AutoscalerDecision
from capacity.runtimes.processes import free_port, sim_replica_argv
from workers import observability as obs

TOKEN = {"HTTP_AUTHORIZATION": "Bearer test-metrics-token"}


def exposed(text: str) -> set[str]:
    """Sample names of a Prometheus exposition, from its # TYPE lines (present before any sample is)."""
    suffixes = {"histogram": ("_bucket", "_sum", "_count")}
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            if kind == "counter" and not name.endswith("_total"):
                name += "_total"
            names |= {name + s for s in suffixes.get(kind, ("",))}
    return names


def test_the_committed_files_are_what_the_code_generates():
    call_command("export_observability", "--check")


@pytest.mark.django_db
def test_every_panel_reads_a_series_the_platform_exposes(client):
    platform = client.get("/metrics/platform", **TOKEN)
    assert platform.status_code == 200
    known = exposed(generate_latest(REGISTRY).decode()) | exposed(platform.content.decode())
    known |= {r["record"] for r in obs.recording_rules()} | obs.slo_recording_names() | {"ALERTS"}
    dashboard = json.loads((obs.ROOT / obs.DASHBOARD_FILE).read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len(panels) >= 15
    for panel in panels:
        for target in panel["targets"]:
            names = obs.series_names(target["expr"])
            assert names and names <= known, (panel["title"], names - known)
    titles = " | ".join(p["title"] for p in panels)
    for topic in ("have / sold / used", "Queue depth by class", "TTFT against its SLO", "TPOT against its SLO",
                  "Autoscaler decisions", "Cost per million good tokens", "Tenant", "SLO error ratio"):  # fmt: skip
        assert topic in titles


@pytest.mark.e2e
def test_every_recording_rule_reads_what_the_proxy_or_a_replica_exposes(procs):
    port = free_port()
    procs.spawn(sim_replica_argv(port, served_model_name="chat"), port=port)
    replica = exposed(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text)
    known = replica | exposed(generate_latest(REGISTRY).decode())
    for rule in obs.recording_rules():
        assert obs.series_names(rule["expr"]) <= known, rule["record"]


def test_series_names_drop_labels_groupings_and_functions():
    expr = 'histogram_quantile(0.9, sum by (endpoint, le) (rate(x_bucket{endpoint="a",le="1"}[5m]))) / y:z'
    assert obs.series_names(expr) == {"x_bucket", "y:z"}


@pytest.mark.django_db
def test_platform_metrics_serve_the_books_behind_the_token(client, tenant_a):
    endpoint = tenant_a.endpoint
    now = timezone.now()
    AutoscalerDecision.objects.create(endpoint=endpoint, axis="horizontal", current=2, desired=4, reason="old",
                                      at=now - timedelta(minutes=5))  # fmt: skip
    AutoscalerDecision.objects.create(endpoint=endpoint, axis="horizontal", current=4, desired=3, reason="new", at=now)
    CostReport.objects.create(granularity="hour", start=now - timedelta(hours=1), end=now, endpoint=endpoint,
                              usd=2.5, usd_per_1m_good_tokens=0.75)  # fmt: skip
    assert client.get("/metrics/platform").status_code == 404
    assert client.get("/metrics/platform", HTTP_AUTHORIZATION="Bearer wrong").status_code == 404
    body = client.get("/metrics/platform", **TOKEN).content.decode()
    e = f'endpoint="{endpoint.name}"'
    assert f'infercap_autoscaler_desired{{axis="horizontal",{e}}} 3.0' in body
    assert f"infercap_cost_usd_per_million_good_tokens{{{e}}} 0.75" in body
    assert f"infercap_cost_usd_per_hour{{{e}}} 2.5" in body
    assert f"infercap_endpoint_ttft_slo_seconds{{{e}}} {endpoint.ttft_slo_ms / 1000}" in body
    for measure in ("have", "sold", "used"):
        assert f'infercap_capacity_mu_per_min{{{e},measure="{measure}"}}' in body
    assert f'infercap_tenant_mu_per_min{{{e},measure="sold",tenant="{tenant_a.tenant.slug}"}}' in body


SCRAPE_FILE = dashboard_check.SCRAPE_FILE


def _shipped_labels() -> dict[str, dict[str, set[str]]]:
    """Every label the base manifests put on pods and services, with their values, as discovery meta labels."""
    found: dict[str, dict[str, set[str]]] = {"pod": {}, "service": {}}
    for role, kind in (("pod", "Deployment"), ("service", "Service")):
        for doc in dashboard_check.shipped_objects(kind):
            labels = doc["spec"]["template"]["metadata"]["labels"] if role == "pod" else doc["metadata"]["labels"]
            for label, value in labels.items():
                name = dashboard_check.kubernetes_label(f"__meta_kubernetes_{role}_label_", label)
                found[role].setdefault(name, set()).add(value)
    return found


def test_the_scrape_config_without_the_operator_reads_everything_the_dashboard_reads():
    config = yaml.safe_load(SCRAPE_FILE.read_text())
    discovered = [job for job in config["scrape_configs"] if "kubernetes_sd_configs" in job]
    scraped = {(job.get("metrics_path", "/metrics"), "authorization" in job) for job in discovered}
    # The proxy and the books behind the token, the replicas without.
    assert {("/metrics", True), ("/metrics/platform", True), ("/metrics", False)} <= scraped
    assert {Path(obs.RULES_FILE).name, "slo-rules.yml"} <= set(config["rule_files"])
    rules = yaml.safe_load((obs.ROOT / obs.RULES_FILE).read_text())
    assert [r["record"] for g in rules["groups"] for r in g["rules"]] == [r["record"] for r in obs.recording_rules()]
    labels = _shipped_labels()
    for job in discovered:
        (sd,) = job["kubernetes_sd_configs"]
        for rule in job["relabel_configs"]:
            for source in rule.get("source_labels", []):
                if "_label_" not in source:
                    continue
                assert source in labels[sd["role"]], (job["job_name"], source, "no shipped object carries it")
                if rule.get("action") == "keep":
                    assert rule["regex"] in labels[sd["role"]][source], (job["job_name"], rule["regex"])


@pytest.mark.django_db
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_accepts_the_scrape_config_and_its_rules(tmp_path):
    config = yaml.safe_load(SCRAPE_FILE.read_text())
    for job in config["scrape_configs"]:
        # Debian's Prometheus is built without Kubernetes discovery: the rest of each job is checked.
        if job.pop("kubernetes_sd_configs", None) is not None:
            job["static_configs"] = [{"targets": ["127.0.0.1:9"]}]
        if "credentials_file" in job.get("authorization", {}):
            job["authorization"]["credentials_file"] = str(tmp_path / "token")
    (tmp_path / "token").write_text("token")
    (tmp_path / "scrape.yml").write_text(yaml.safe_dump(config))
    (tmp_path / "dashboard-rules.yml").write_text((obs.ROOT / obs.RULES_FILE).read_text())
    call_command("export_slo_rules", "--output", str(tmp_path / "slo-rules.yml"))
    run = subprocess.run(["promtool", "check", "config", "scrape.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"SUCCESS: {len(obs.recording_rules())} rules found" in run.stdout + run.stderr
