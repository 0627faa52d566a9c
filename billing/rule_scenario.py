"""A promtool unit test generated from one scenario, so Prometheus and the platform's evaluator see the same series.

The scenario is per-minute request counts by status; the Prometheus side gets them as the proxy's cumulative
``infercap_proxy_requests_total`` counters sampled every minute, the platform side as the minute rollups its
evaluator sums (``billing.alerts``: windows ending after the current minute, the same ``billing.slo`` arithmetic
and pending → firing state machine). The expected alerts at each checked step are the platform's; ``promtool test
rules`` then fails wherever Prometheus fires a different set. docs/algorithms.md#slos-and-burn-rates says why
both count the same minutes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from billing.prometheus_rules import SloRuleSpec, rule_groups
from billing.slo import (
    ALERT_FOR_S,
    WINDOW_PAIRS,
    WINDOWS_S,
    SliSpec,
    alert_step,
    burn_rate,
    pair_condition,
    sli_counts,
)

# Counters that have run for a while before the scenario: Prometheus' rate() clamps its extrapolation at a counter's
# zero, which would treat a series that starts at 0 differently from one that does not.
COUNTER_OFFSET = 1_000_000
ROUND_TO = 2.0**-30


@dataclass(frozen=True)
class Phase:
    minutes: int
    per_minute: dict[str, int]  # requests per minute by proxy status (ok, upstream_error, rate_limited, ...)


# Healthy (0.5% errors, under a 99% objective's budget), then 30 minutes of an outage, then healthy again until
# every window has forgotten it: the page pairs fire and resolve, then the ticket pairs.
DEFAULT_PHASES: tuple[Phase, ...] = (
    Phase(60, {"ok": 199, "upstream_error": 1, "rate_limited": 10}),
    Phase(30, {"ok": 20, "upstream_error": 180, "rate_limited": 10}),
    Phase(390, {"ok": 199, "upstream_error": 1, "rate_limited": 10}),
)
DEFAULT_SPEC = SloRuleSpec(
    slo_id=1, name="chat availability", sli="availability", objective=0.99, endpoint="chat", tenant=None,
    ttft_ms=1000, tpot_ms=100,
)  # fmt: skip


def per_minute_counts(phases: Sequence[Phase]) -> list[dict[str, int]]:
    statuses = sorted({s for p in phases for s in p.per_minute})
    return [{s: p.per_minute.get(s, 0) for s in statuses} for p in phases for _ in range(p.minutes)]


def platform_burn_rates(minutes: list[dict[str, int]], spec: SloRuleSpec, now_min: int) -> dict[str, float]:
    """The evaluator's burn rate per window at step ``now_min``: its tick as minute ``now_min − 1`` completes (one
    second before ``now_min``), whose windows [end − W, end) end after the current minute (``billing.alerts``), so
    they sum minutes now − W … now − 1: the increments Prometheus 2.x sees over ``[W]`` at ``now_min`` (its range
    selectors include both ends; 3.x's exclude the start)."""
    sli = SliSpec(kind=spec.sli, objective=spec.objective, ttft_ms=spec.ttft_ms, tpot_ms=spec.tpot_ms)
    burns = {}
    for label, seconds in WINDOWS_S.items():
        window = minutes[max(0, now_min - seconds // 60) : now_min]
        sums = {
            "requests": sum(sum(m.values()) for m in window),
            "ok": sum(m.get("ok", 0) for m in window),
            "rate_limited": sum(m.get("rate_limited", 0) for m in window),
            "client_cancelled": sum(m.get("client_cancelled", 0) for m in window),
        }
        good, valid = sli_counts(sli, sums)
        burns[label] = burn_rate(good, valid, spec.objective)
    return burns


def platform_firing(minutes: list[dict[str, int]], spec: SloRuleSpec) -> list[set[tuple[str, str]]]:
    """Per evaluation minute (0 … len), the (long, short) window pairs whose alert is firing."""
    states: dict[tuple[str, str], tuple[str | None, int | None]] = {}
    firing_by_minute = []
    for now_min in range(len(minutes) + 1):
        burns = platform_burn_rates(minutes, spec, now_min)
        firing = set()
        for pair in WINDOW_PAIRS:
            key = (pair.long_window, pair.short_window)
            state, since = states.get(key, (None, None))
            step = alert_step(
                state=state,
                condition=pair_condition(burns, pair),
                pending_since=_as_datetime(since),
                now=_as_datetime(now_min),
                for_s=ALERT_FOR_S[pair.severity],
            )
            since = now_min if step.state == "pending" and state != "pending" else since
            states[key] = (step.state, since if step.state in ("pending", "firing") else None)
            if step.state == "firing":
                firing.add(key)
        firing_by_minute.append(firing)
    return firing_by_minute


def _as_datetime(minute: int | None) -> datetime | None:
    # alert_step wants datetimes; the scenario counts minutes from any fixed origin.
    return None if minute is None else datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=minute)


def input_series(minutes: list[dict[str, int]], spec: SloRuleSpec) -> list[dict]:
    series = []
    for status in minutes[0]:
        value, values = COUNTER_OFFSET, [COUNTER_OFFSET]
        for minute in minutes:
            value += minute[status]
            values.append(value)
        labels = f'endpoint="{spec.endpoint}",tenant="t",priority="standard",status="{status}"'
        series.append({"series": f"infercap_proxy_requests_total{{{labels}}}", "values": " ".join(map(str, values))})
    return series


def checked_minutes(firing: list[set]) -> list[int]:
    """Every step where the platform's firing set changes, the steps either side of it, and one every 30 min."""
    steps = set(range(0, len(firing), 30))
    for minute in range(1, len(firing)):
        if firing[minute] != firing[minute - 1]:
            steps |= {minute - 1, minute, minute + 1}
    return sorted(m for m in steps if m < len(firing))


def promtool_test(
    rules_file: str, *, phases: Sequence[Phase] = DEFAULT_PHASES, spec: SloRuleSpec = DEFAULT_SPEC, buckets
) -> tuple[dict, dict, dict]:
    """(rules, promtool test file, summary): the rules as ``export_slo_rules`` writes them for ``spec``, the test
    with the platform's expected alerts and recording-rule values, and what the platform fires when."""
    ttft_buckets, tpot_buckets = buckets
    rules = rule_groups([spec], ttft_buckets_s=ttft_buckets, tpot_buckets_s=tpot_buckets)
    alert_rules = {(r["labels"]["long_window"], r["labels"]["short_window"]): r for r in _alert_rules(rules)}
    minutes = per_minute_counts(phases)
    firing = platform_firing(minutes, spec)
    alert_tests = [
        {
            "eval_time": f"{minute}m",
            "alertname": "InfercapSLOBurnRate",
            "exp_alerts": [
                {"exp_labels": alert_rules[key]["labels"], "exp_annotations": alert_rules[key]["annotations"]}
                for key in sorted(firing[minute])
            ],
        }
        for minute in checked_minutes(firing)
    ]
    budget = 1.0 - spec.objective
    # Rounded on both sides to 2^-30 (exact in binary): the two sums differ in the last bit of their order.
    expr_tests = [
        {
            "expr": f"round(slo:sli_error:ratio_rate{window}, {ROUND_TO!r})",
            "eval_time": f"{minute}m",
            "exp_samples": [{"labels": _record_labels(window, rules), "value": _rounded(rate * budget)}],
        }
        for minute in (75, 120, 300)
        if minute <= len(minutes)
        for window, rate in platform_burn_rates(minutes, spec, minute).items()
    ]
    test = {
        "rule_files": [rules_file],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": input_series(minutes, spec),
                "alert_rule_test": alert_tests,
                "promql_expr_test": expr_tests,
            }
        ],
    }
    summary = {
        "first_firing_minute": {
            f"{pair.severity} {pair.long_window}/{pair.short_window}": next(
                (m for m, f in enumerate(firing) if (pair.long_window, pair.short_window) in f), None
            )
            for pair in WINDOW_PAIRS
        },
        "alert_steps_checked": len(alert_tests),
        "burn_rate_samples_checked": len(expr_tests),
    }
    return rules, test, summary


def _rounded(value: float) -> float:
    # PromQL's round(v, to): floor(v · (1 / to) + 0.5) / (1 / to).
    return math.floor(value * (1 / ROUND_TO) + 0.5) / (1 / ROUND_TO)


def _alert_rules(rules: dict) -> list[dict]:
    return [r for g in rules["groups"] for r in g["rules"] if "alert" in r]


def _record_labels(window: str, rules: dict) -> str:
    record = next(
        r for g in rules["groups"] for r in g["rules"] if r.get("record") == f"slo:sli_error:ratio_rate{window}"
    )
    labels = record["labels"]
    return "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
