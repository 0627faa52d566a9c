"""The shipped dashboard and monitoring objects: generated from code and current, every panel reading a series the
platform exposes (the proxy's /metrics, /metrics/platform) or a recording rule, and every recording rule reading a
series the proxy or a vLLM replica exposes; /metrics/platform serves the books behind the panels."""

import json
from datetime import timedelta

import httpx
import pytest
from django.core.management import call_command
from django.utils import timezone
from prometheus_client import REGISTRY, generate_latest

import endpoints.proxy.metrics  # noqa: F401 - registers the proxy's metrics in REGISTRY
from billing.models import CostReport
from capacity.models import AutoscalerDecision
from endpoints.runtimes.processes import free_port, sim_replica_argv
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
