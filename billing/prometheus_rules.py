"""Prometheus recording and alerting rules equivalent to the burn-rate evaluator, from the proxy's metrics.

Recording rules give each SLO's error ratio over the seven windows (Sloth's ``slo:sli_error:ratio_rate<W>``
naming); one alerting rule per window pair uses the same thresholds and ``for:`` as ``billing.alerts``.
Latency thresholds snap to the proxy histogram's largest bucket not above them (``le`` must be an existing bucket).
"""

from dataclasses import dataclass

from prometheus_client.utils import floatToGoString

from billing.slo import ALERT_FOR_S, WINDOW_PAIRS, WINDOWS_S, snap_bound

REQUESTS = "infercap_proxy_requests_total"
GOOD_REQUESTS = "infercap_proxy_good_requests_total"  # ok and within the endpoint's TTFT and TPOT SLOs
TTFT = "infercap_proxy_ttft_seconds"
TPOT = "infercap_proxy_tpot_seconds"
BAD_STATUSES = "shed|upstream_error|timeout"
EXCLUDED_STATUSES = "rate_limited|client_cancelled"  # the client's doing: counted by no SLI


@dataclass(frozen=True)
class SloRuleSpec:
    slo_id: int
    name: str
    sli: str
    objective: float
    endpoint: str
    tenant: str | None
    ttft_ms: float
    tpot_ms: float


def _selector(spec: SloRuleSpec, *extra: str, tenant: bool = True) -> str:
    """A label selector for the SLO's endpoint (and tenant), plus extra matchers such as 'status=~"a|b"'."""
    labels = {"endpoint": spec.endpoint}
    if tenant and spec.tenant:
        labels["tenant"] = spec.tenant
    parts = [f'{k}="{_escape(v)}"' for k, v in labels.items()] + list(extra)
    return "{" + ",".join(parts) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def error_ratio_expr(spec: SloRuleSpec, window: str, *, ttft_buckets_s, tpot_buckets_s) -> str:
    valid_selector = _selector(spec, 'status!~"' + EXCLUDED_STATUSES + '"')
    valid = f"sum(rate({REQUESTS}{valid_selector}[{window}]))"
    if spec.sli == "availability":
        bad_selector = _selector(spec, 'status=~"' + BAD_STATUSES + '"')
        bad = f"sum(rate({REQUESTS}{bad_selector}[{window}]))"
        return f"({bad}) / ({valid})"
    if spec.sli == "goodput":
        good = f"sum(rate({GOOD_REQUESTS}{_selector(spec)}[{window}]))"
        return f"1 - (({good}) / ({valid}))"
    # The proxy's latency histograms carry no tenant label: a tenant's latency SLO reads the endpoint's latency.
    metric, threshold_ms, buckets = (
        (TTFT, spec.ttft_ms, ttft_buckets_s) if spec.sli == "ttft" else (TPOT, spec.tpot_ms, tpot_buckets_s)
    )
    bound_ms = snap_bound(threshold_ms, tuple(b * 1000 for b in buckets))
    le = floatToGoString(bound_ms / 1000)
    bucket_selector = _selector(spec, 'le="' + le + '"', tenant=False)
    good = f"sum(rate({metric}_bucket{bucket_selector}[{window}]))"
    total = f"sum(rate({metric}_count{_selector(spec, tenant=False)}[{window}]))"
    return f"1 - (({good}) / ({total}))"


def rule_groups(specs: list[SloRuleSpec], *, ttft_buckets_s, tpot_buckets_s) -> dict:
    """The rules file as a dict (``yaml.safe_dump`` it): one group per SLO."""
    groups = []
    for spec in specs:
        labels = {"slo_id": str(spec.slo_id), "slo": spec.name, "endpoint": spec.endpoint}
        if spec.tenant:
            labels["tenant"] = spec.tenant
        rules: list[dict] = [
            {
                "record": f"slo:sli_error:ratio_rate{window}",
                "expr": error_ratio_expr(spec, window, ttft_buckets_s=ttft_buckets_s, tpot_buckets_s=tpot_buckets_s),
                "labels": dict(labels),
            }
            for window in WINDOWS_S
        ]
        budget = 1.0 - spec.objective
        for pair in WINDOW_PAIRS:
            threshold = f"({pair.burn_rate:g} * {budget:.10g})"
            match = f'{{slo_id="{spec.slo_id}"}}'
            rules.append(
                {
                    "alert": "InfercapSLOBurnRate",
                    "expr": (
                        f"(slo:sli_error:ratio_rate{pair.long_window}{match} > {threshold})"
                        f" and (slo:sli_error:ratio_rate{pair.short_window}{match} > {threshold})"
                    ),
                    "for": f"{ALERT_FOR_S[pair.severity] // 60}m",
                    "labels": {
                        **labels,
                        "severity": pair.severity,
                        "long_window": pair.long_window,
                        "short_window": pair.short_window,
                    },
                    "annotations": {
                        "summary": f"{spec.name}: error budget burning over {pair.burn_rate:g}x "
                        f"({pair.long_window} and {pair.short_window})",
                        "description": f"SLO {spec.sli} {spec.objective:.3%} on {spec.endpoint}"
                        + (f" for tenant {spec.tenant}" if spec.tenant else ""),
                    },
                }
            )
        groups.append({"name": f"infercap-slo-{spec.slo_id}", "rules": rules})
    return {"groups": groups}
