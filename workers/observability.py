"""The monitoring shipped in platform/: the Grafana dashboard, the recording rules it reads and the Prometheus
Operator objects (ServiceMonitor, PodMonitor, PrometheusRule), generated here so they follow the metrics' names.

``python manage.py export_observability`` writes them (``--check``: fail if the committed files differ);
tests/platform/test_observability.py checks every panel's series against what the platform exposes;
benchmarks/operations/dashboard_check.py runs every panel's query on a real Prometheus scraping a running platform.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from billing.slo import WINDOWS_S
from capacity.api.metrics import PLATFORM_METRICS

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD_FILE = "platform/grafana/infercap.json"
MONITORING_FILE = "platform/kubernetes/base/monitoring.yaml"
# The same recording rules as a plain rules file, for Prometheus without the Operator (platform/prometheus/scrape.yml).
RULES_FILE = "platform/prometheus/dashboard-rules.yml"
QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))


def recording_rules() -> list[dict]:
    """What the dashboard reads pre-aggregated: request rates, latency quantiles, the replicas' own gauges."""
    rules = [
        {
            "record": "infercap:proxy_requests:rate5m",
            "expr": "sum by (endpoint, tenant, status) (rate(infercap_proxy_requests_total[5m]))",
        }
    ]
    for metric in ("ttft", "tpot"):
        for name, q in QUANTILES:
            rules.append(
                {
                    "record": f"infercap:proxy_{metric}_seconds:{name}",
                    "expr": f"histogram_quantile({q}, sum by (endpoint, le) "
                    f"(rate(infercap_proxy_{metric}_seconds_bucket[5m])))",
                }
            )
    rules += [
        # Serving replicas only: a warm pool's standby holds an empty cache and would pull the average down (the
        # scrape config sets role from the pod's infercap/role; without the label, as under the Operator, all count).
        {
            "record": "infercap:vllm_kv_cache_usage:avg",
            "expr": 'avg by (model_name) (vllm:kv_cache_usage_perc{role!="standby"})',
        },
        {"record": "infercap:vllm_requests_waiting:sum", "expr": "sum by (model_name) (vllm:num_requests_waiting)"},
        {"record": "infercap:vllm_requests_running:sum", "expr": "sum by (model_name) (vllm:num_requests_running)"},
    ]
    return rules


def _target(expr: str, legend: str) -> dict:
    return {"expr": expr, "legendFormat": legend, "datasource": {"type": "prometheus", "uid": "${datasource}"}}


def _panel(title: str, unit: str, *targets: dict, kind: str = "timeseries") -> dict:
    return {
        "type": kind,
        "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": list(targets),
    }


E = 'endpoint="$endpoint"'


def _fleet() -> list[dict]:
    return [
        _panel("Capacity: have / sold / used (MU per minute)", "short",
               _target("sum by (measure) (infercap_capacity_mu_per_min)", "{{measure}}")),
        _panel("Ready replicas by endpoint", "short", _target("infercap_endpoint_ready_replicas", "{{endpoint}}")),
        _panel("Autoscaler decisions: desired vs current replicas", "short",
               _target('infercap_autoscaler_desired{axis="horizontal"}', "{{endpoint}} desired"),
               _target('infercap_autoscaler_current{axis="horizontal"}', "{{endpoint}} current")),
        _panel("Cost per million good tokens (USD, last hour)", "currencyUSD",
               _target("infercap_cost_usd_per_million_good_tokens", "{{endpoint}}")),
        _panel("GPU cost per hour (USD)", "currencyUSD", _target("infercap_cost_usd_per_hour", "{{endpoint}}")),
        _panel("Replica KV cache usage and queues (vLLM)", "percentunit",
               _target("infercap:vllm_kv_cache_usage:avg", "{{model_name}} KV"),
               _target("infercap:vllm_requests_waiting:sum", "{{model_name}} waiting")),
    ]  # fmt: skip


def _endpoint() -> list[dict]:
    latency = []
    for metric, title in (("ttft", "TTFT"), ("tpot", "TPOT")):
        targets = [_target(f"infercap:proxy_{metric}_seconds:{name}{{{E}}}", name) for name, _ in QUANTILES]
        targets.append(_target(f"infercap_endpoint_{metric}_slo_seconds{{{E}}}", "SLO"))
        latency.append(_panel(f"{title} against its SLO (proxy, seconds)", "s", *targets))
    return [
        _panel("Have / sold / used (MU per minute)", "short",
               _target(f"infercap_capacity_mu_per_min{{{E}}}", "{{measure}}")),
        _panel("Queue depth by class", "short",
               _target(f"sum by (priority) (infercap_proxy_queue_depth{{{E}}})", "{{priority}}")),
        *latency,
        _panel("Requests per second by outcome", "reqps",
               _target(f"sum by (status) (infercap:proxy_requests:rate5m{{{E}}})", "{{status}}")),
        _panel("Shed by admission", "reqps",
               _target(f"sum by (priority, reason) (rate(infercap_proxy_shed_total{{{E}}}[5m]))", "{{priority}} {{reason}}")),
        _panel("Upstream retries", "reqps", _target(f"rate(infercap_proxy_upstream_retries_total{{{E}}}[5m])", "retries")),
    ]  # fmt: skip


def _tenant() -> list[dict]:
    t = E + ',tenant=~"$tenant"'
    return [
        _panel("Tenant: reserved (sold) vs used MU per minute", "short",
               _target(f"infercap_tenant_mu_per_min{{{t}}}", "{{tenant}} {{measure}}")),
        _panel("Tenant requests per second by outcome", "reqps",
               _target(f"sum by (tenant, status) (infercap:proxy_requests:rate5m{{{t}}})", "{{tenant}} {{status}}")),
        _panel("Tenant requests refused by limits", "reqps",
               _target(f"sum by (tenant, limit) (rate(infercap_proxy_rate_limited_total{{{t}}}[5m]))", "{{tenant}} {{limit}}")),
    ]  # fmt: skip


def _slos() -> list[dict]:
    ratios = [_target(f"slo:sli_error:ratio_rate{w}{{{E}}}", "{{slo}} " + w) for w in ("5m", "1h", "6h", "1d")]
    return [
        _panel("SLO error ratio by window (burn rate × budget)", "percentunit", *ratios),
        _panel("Burn-rate alerts firing", "short",
               _target(f'ALERTS{{alertname="InfercapSLOBurnRate",alertstate="firing",{E}}}',
                       "{{slo}} {{severity}} {{long_window}}/{{short_window}}")),
    ]  # fmt: skip


def _row(title: str, panels: list[dict], y: int, next_id: list[int]) -> tuple[list[dict], int]:
    out = [{"type": "row", "title": title, "collapsed": False, "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}}]
    y += 1
    for i, panel in enumerate(panels):
        panel["gridPos"] = {"h": 8, "w": 12, "x": 12 * (i % 2), "y": y + 8 * (i // 2)}
        out.append(panel)
    for item in out:
        item["id"] = next_id[0]
        next_id[0] += 1
    return out, y + 8 * ((len(panels) + 1) // 2)


def dashboard() -> dict:
    panels, y, ids = [], 0, [1]
    for title, group in (("Fleet", _fleet()), ("Endpoint $endpoint", _endpoint()), ("Tenants", _tenant()),
                         ("SLOs", _slos())):  # fmt: skip
        row, y = _row(title, group, y, ids)
        panels += row
    variables = [
        {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
        _query_variable("endpoint", "label_values(infercap_capacity_mu_per_min, endpoint)", multi=False),
        _query_variable(
            "tenant", 'label_values(infercap_tenant_mu_per_min{endpoint="$endpoint"}, tenant)', multi=True
        ),
    ]
    return {
        "uid": "infercap-overview",
        "title": "infercap: fleet, endpoints, tenants, SLOs",
        "tags": ["infercap", "vllm"],
        "timezone": "utc",
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": variables},
        "panels": panels,
    }


def _query_variable(name: str, query: str, *, multi: bool) -> dict:
    return {
        "name": name,
        "type": "query",
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "query": {"query": query, "refId": name},
        "refresh": 2,
        "multi": multi,
        "includeAll": multi,
    }


def monitoring_objects() -> list[dict]:
    labels = {"app.kubernetes.io/part-of": "infercap"}
    bearer = {"name": "infercap", "key": "INFERCAP_METRICS_TOKEN"}
    endpoints = [
        {"port": "http", "path": path, "interval": "15s", "bearerTokenSecret": dict(bearer)}
        for path in ("/metrics", "/metrics/platform")
    ]
    return [
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "ServiceMonitor",
            "metadata": {"name": "infercap-web", "labels": labels},
            "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": "infercap-web"}}, "endpoints": endpoints},
        },
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PodMonitor",
            "metadata": {"name": "infercap-vllm", "labels": labels},
            "spec": {
                "selector": {"matchLabels": {"app.kubernetes.io/name": "vllm"}},
                "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": "15s"}],
            },
        },
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": {"name": "infercap-dashboards", "labels": labels},
            "spec": {"groups": dashboard_rule_groups()},
        },
    ]


def dashboard_rule_groups() -> list[dict]:
    return [{"name": "infercap-dashboards", "interval": "30s", "rules": recording_rules()}]


HEADER = (
    "# Generated by `python manage.py export_observability` (workers/observability.py): do not edit by hand.\n"
    "# The SLOs' own rules come from `python manage.py export_slo_rules` (put them in a PrometheusRule's spec).\n"
)


def rendered_files() -> dict[str, str]:
    return {
        DASHBOARD_FILE: json.dumps(dashboard(), indent=2) + "\n",
        MONITORING_FILE: HEADER + yaml.safe_dump_all(monitoring_objects(), sort_keys=False),
        RULES_FILE: HEADER.splitlines(keepends=True)[0]
        + yaml.safe_dump({"groups": dashboard_rule_groups()}, sort_keys=False),
    }


_NOT_METRICS = {"by", "without", "sum", "avg", "rate", "histogram_quantile", "on", "and", "or", "ignoring"}


def series_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (label matchers, grouping labels and functions dropped)."""
    bare = re.sub(r"\{[^}]*\}", "", expr)
    bare = re.sub(r"\b(by|without)\s*\([^)]*\)", "", bare)
    bare = re.sub(r"\[[^\]]*\]", "", bare)
    names = set()
    for found in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*(\s*\()?", bare):
        name = found.group(0).rstrip("( ")
        if not found.group(1) and name not in _NOT_METRICS and not re.fullmatch(r"\d.*", name):
            names.add(name)
    return names


def slo_recording_names() -> set[str]:
    return {f"slo:sli_error:ratio_rate{w}" for w in WINDOWS_S}


def platform_metric_names() -> set[str]:
    return set(PLATFORM_METRICS)
