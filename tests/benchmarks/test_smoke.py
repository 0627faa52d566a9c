"""Every ``bench`` suite once with ``--smoke``: tiny sizes, seconds each, through the management command; each prints
one line of JSON with every key its quick and full runs print. The figures of a smoke run mean nothing: only the keys
are checked (the figures are the other tests' business, and the benches' own at their sizes).

``bench fidelity --smoke`` needs the real engine: tests/engine/test_fidelity.py runs it at the same size, on the
engine those tests share (starting one here would cost a minute of imports); here only when ``INFERCAP_ENGINE_URL``
names an engine already serving. ``bench deploy`` needs ``kubectl`` (the Kubernetes package is rendered with
kustomize); Prometheus and promtool are optional to it (its figures say ``None`` without them).
"""

from __future__ import annotations

import json
import os
import shutil
from io import StringIO

import pytest
from django.core.management import call_command

from benchmarks.capacity.autoscale import ROWS
from benchmarks.management.commands.bench import BENCHMARKS
from benchmarks.operations import prometheus_check
from benchmarks.routing import routing_suite
from benchmarks.serving import fidelity
from benchmarks.serving import pd as pd_bench
from benchmarks.serving.adapter_routing import POLICIES as LORA_POLICIES
from capacity.planning.presets import WORKLOADS as ECONOMICS_WORKLOADS
from workers import manifests

# The keys each suite documents (its module docstring) and prints in its quick run, at the top of its line.
TOP = {
    "sim": {
        "profile", "profile_fit", "profile_fit_table", "profile_fit_rel_error", "profile_roofline_tok_s",
        "profile_within_roofline", "prefix_ttft_ratio", "prefix_ttft_cold_s", "prefix_ttft_warm_s",
        "des_requests_per_s", "des_requests_per_cpu_s", "des_wall_s", "des_summary", "deterministic",
    },
    "planner": {
        "worked_example", "worked_example_checks", "sim_agreement", "sim_detail", "fit_error", "fit", "seconds",
    },
    "routing": {"workloads", "stage_s", "seed", "held_out", "hot_prefix", "goals", "out_of_reach", "wall_s"},
    "lora": {
        "setup", "policies", "upper_bound", "ratio_vs_round_robin", "ratio_vs_lora_affinity",
        "loads_ratio_vs_lora_affinity", "loads_ratio_vs_lora_affinity_at_reference", "ratio_vs_upper_bound",
        "loads_lower_bound_per_1k_at_reference", "loads_floor_ratio_vs_lora_affinity_at_reference", "low_rate",
        "goals_met",
    },
    "economics": {"bench", "quick", "slo", "duration_s", "workloads", "spot"},
    "autoscale": {"training", "seed_set", "trace_seeds", "time_scale", "setup", "wall_s"},
    "slo": {
        "slos", "usage_rows", "eval_seconds", "eval_seconds_steady", "eval_tick_budget_used",
        "rollup_seconds_per_million", "rollup_seconds", "rollup_rerun_seconds", "late_rows", "late_rollup_seconds",
        "generate_seconds", "minute_rows", "alerts_firing", "alerts_pending", "pages_firing", "tickets_firing",
        "scaling",
    },
    "proxy": {"streams_1", "streams_64", "streams_256", "client_calibration_256"},
    "security": {"security.cases", "security.failures", "security.failed", "security.results"},
    "metering": {
        "metering.requests", "metering.records", "metering.unbilled_fraction", "metering.overbilled_fraction",
        "metering.misattributed_fraction", "metering.lost_records", "metering.duplicate_records", "metering.cases",
        "metering.goals", "metering.passed", "metering.computed_tokens", "metering.billed_tokens",
        "metering.computed_mu", "metering.billed_mu", "metering.adapter_loads", "metering.platform_prompt_tokens",
        "metering.by_tenant", "metering.by_kind", "metering.attribution", "metering.runtime",
    },
    "reliability": {
        "lost_usage", "duplicated_usage", "proxy_5xx", "critical_slo_attainment", "hang_detect_s", "hang_recover_s",
        "peak_rss_mb", "fuzz_500s", "requests", "usage_records", "worker_restarts", "overload", "scenarios",
    },
    "deploy": {
        "manifests_validated", "manifests_invalid", "promtool_rule_tests_passed", "fresh_clone_to_first_token_s",
        "prometheus_vs_platform_burn_rate_max_err", "production_boot",
        "tracing_added_ttft_p50_ms", "make_run_soak",
    },
    "fidelity": {
        "real_vllm_version", "fidelity.throughput_err", "fidelity.ttft_p50_err", "fidelity.ttft_p90_err",
        "fidelity.tpot_p50_err", "fidelity.prefix_hit_rate_err", "contract_divergences", "engine_startup_s",
        "calibration", "points",
    },
    "pd": {
        *(f"pd.{w}.{k}" for w in ("short_chat", "long_rag", "mix") for k in (
            "goodput_per_gpu_ratio", "planner_choice", "choice_goodput_ratio", "ttft_p90_ratio", "tpot_p90_ratio",
            "floor_ratio", "ceiling_ratio", "planner_vs_ceiling", "bound_ratio", "planner_threshold", "detail",
            "tpot_p90_ratio_ceiling", "tpot_p90_ceiling_split", "split_meeting_both", "oracle_splits",
            "tpot_p90_ratio_at_capacity",
        )),
        "pd.real_engine.outputs_match", "pd.real_engine.external_hit_tokens", "pd.real_engine.fallbacks_without_error",
        "pd.seeds", "pd.seed_set", "pd.wall_s",
    },
    "scale": {
        f"scale.{loop}.{key}"
        for loop in (
            "burn_tick", "autoscaler_tick", "snapshot_build", "key_lookup", "ingestion", "cost_reports", "console_fleet",
            "proxy_scrape", "proxy_scrape_busy", "heartbeat", "heartbeat_processes",
        )
        for key in ("sizes", "seconds", "exponent", "goal_met", "goal", "at_goal", "breaks_at")
    } | {"scale.mode", "scale.wall_s"},
    "placement": {
        f"placement.{policy}.{key}"
        for policy in ("naive", "gang", "infercap", "bound", "repack")
        for key in ("deadlocks", "gpu_allocation", "groups_across_domains", "pending_p99_s", "detail")
    } | {"placement.goals", "placement.setup", "placement.seeds", "placement.seed_set", "placement.wall_s",
         "placement.infercap.pending_p99_vs_repack", "placement.repack.pending_p99_vs_bound"},
}  # fmt: skip
PROXY_ROW = {
    "added_e2e_p50_ms", "added_ttft_p50_ci95_ms", "added_ttft_p50_ms", "added_ttft_p99_ms", "bare_passthrough",
    "direct_errors", "direct_tokens_per_s", "direct_ttft_p50_ms", "error_samples", "errors", "method",
    "proxied_tokens_per_s", "proxied_ttft_p50_ms", "proxy_cpu_ms_per_1k_tokens", "requests", "tokens_per_s_ratio",
}  # fmt: skip
RELIABILITY_SCENARIOS = {
    "crash", "hang", "postgres_down", "redis_down", "worker_killed", "overload", "bad_input", "api_fuzz",
}  # fmt: skip


def smoke(name: str, *args: str, plot=None) -> dict:
    out = StringIO()
    argv = ["bench", name, "--smoke", *args] + (["--plot", str(plot)] if plot else [])
    call_command(*argv, stdout=out, stderr=StringIO())
    figures = json.loads(out.getvalue().strip().splitlines()[-1])
    missing = TOP[name] - set(figures)
    assert not missing, (name, sorted(missing))
    return figures


def test_every_suite_has_smoke_options_and_a_smoke_test():
    assert set(TOP) == set(BENCHMARKS)
    assert all(isinstance(module.SMOKE, dict) for module in BENCHMARKS.values())


def test_sim(tmp_path):
    figures = smoke("sim", plot=tmp_path / "sim.svg")
    assert set(figures["profile_fit"]) == set(figures["profile_roofline_tok_s"]) == {"16", "64", "128"}
    assert (tmp_path / "sim.svg").read_text().startswith("<svg")


@pytest.mark.slow
def test_planner(tmp_path):
    figures = smoke("planner", plot=tmp_path / "planner.svg")
    assert figures["sim_agreement"] and all("n_base" in row for row in figures["sim_agreement"])
    assert {"alpha", "alpha_cached", "beta", "gamma", "held_out_relative_error"} <= set(figures["fit"])
    assert (tmp_path / "planner.svg").read_text().startswith("<svg")


@pytest.mark.slow
def test_routing(tmp_path):
    figures = smoke("routing", plot=tmp_path / "routing.svg")
    assert set(figures["workloads"]) == {w.name for w in routing_suite.suite(quick=True)}
    for name, workload in figures["workloads"].items():
        assert set(routing_suite.SUITE_POLICIES) | {"oracle", "upper_bound", "ratio_vs_llmd"} <= set(workload), name
        headline = {"ceiling", "ratio_vs_ceiling", "best_baseline", "paired_diff_vs_best_baseline_ci95", "unit"}
        assert headline <= set(workload), name
    assert {"infercap", "affinity", "max_over_mean_load", "hit_rate_vs_affinity"} <= set(figures["hot_prefix"])
    assert "all" in figures["goals"]


@pytest.mark.slow
def test_lora(tmp_path):
    figures = smoke("lora", plot=tmp_path / "lora.svg")
    assert set(figures["policies"]) == set(LORA_POLICIES)
    assert {"infercap_without_history", "infercap_with_wrong_history", "loads_online_bound_per_1k"} <= set(
        figures["low_rate"]
    )
    assert (tmp_path / "lora.svg").read_text().startswith("<svg")


@pytest.mark.slow
def test_economics():
    figures = smoke("economics")
    assert set(figures["workloads"]) == set(ECONOMICS_WORKLOADS)
    assert {"savings", "with_spot_usd", "on_demand_usd", "slo_attainment", "runs"} <= set(figures["spot"])


@pytest.mark.slow
def test_autoscale(tmp_path):
    figures = smoke("autoscale", plot=tmp_path / "frontier.svg")
    block = figures["training"]  # without --held-out: the protocol's training seeds
    assert figures["seed_set"] == "training" and set(ROWS) <= set(block["policies"])
    assert {"frontier", "spike_blind_reference", "tuning", "decision_reasons", "infercap_vs_oracle"} <= set(block)
    assert (tmp_path / "frontier.svg").read_text().startswith("<svg")


@pytest.mark.django_db(transaction=True)
def test_slo(tmp_path):
    figures = smoke("slo", plot=tmp_path / "slo.svg")
    assert figures["scaling"] and (tmp_path / "slo.svg").read_text().startswith("<svg")


@pytest.mark.django_db(transaction=True)  # the usage writer inserts on its own thread and connection
def test_scale(clean_redis, tmp_path):
    figures = smoke("scale", plot=tmp_path / "scale.svg")
    assert all(len(figures[f"scale.{loop}.sizes"]) == 3 for loop in ("burn_tick", "ingestion", "console_fleet"))
    assert figures["scale.ingestion.lost"] == figures["scale.ingestion.duplicated"] == [0, 0, 0]
    assert figures["scale.autoscaler_tick.decisions_stored"] == figures["scale.autoscaler_tick.sizes"]
    # The scraper follows the traffic: of 30 and 60 replicas only the 20 read are scraped once their warm-up is over,
    # every interval; with every replica read, every one is.
    assert figures["scale.proxy_scrape.wanted"] == [20, 20] and figures["scale.proxy_scrape.failures"] == [0, 0]
    # 60 replicas scraped every 0.1 s would be 600 a second; the 20 read, 200 (a 0.5-s window also counts scrapes
    # that started before it).
    assert figures["scale.proxy_scrape.scrapes_per_s"][-1] < 60 / 0.1 / 2
    assert figures["scale.proxy_scrape_busy.wanted"] == figures["scale.proxy_scrape_busy.sizes"]
    # The processes loop: as many members as its sizes say, each with the streams of one proxy process.
    assert figures["scale.heartbeat_processes.members"] == figures["scale.heartbeat_processes.sizes"] == [2, 3]
    assert figures["scale.heartbeat_processes.replicas"] == [200, 200]
    assert (tmp_path / "scale.svg").read_text().startswith("<svg")


def test_placement(tmp_path):
    figures = smoke("placement", plot=tmp_path / "placement.svg")
    assert figures["placement.seed_set"] == "training" and figures["placement.infercap.groups_across_domains"] == 0
    assert figures["placement.infercap.deadlocks"] == 0 and figures["placement.bound.groups_across_domains"] is None
    assert figures["placement.bound.gpu_allocation"] >= figures["placement.infercap.gpu_allocation"]
    assert (tmp_path / "placement.svg").read_text().startswith("<svg")


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)  # the proxy is another process: the world must be committed
def test_proxy(clean_redis):
    figures = smoke("proxy")
    for level in (1, 64, 256):
        assert PROXY_ROW <= set(figures[f"streams_{level}"]), level
    assert set(figures["client_calibration_256"]) == {"aiohttp", "httpx"}


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_security(clean_redis):
    figures = smoke("security")
    assert figures["security.cases"] == len(figures["security.results"]) == 2
    assert all({"name", "passed", "detail"} <= set(r) for r in figures["security.results"])


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_metering(clean_redis, tmp_path):
    """Each kind once (the tenants in turn), and the books' goals hold as in the full run."""
    figures = smoke("metering", plot=tmp_path / "metering.svg")
    assert figures["metering.runtime"] == "sim" and set(figures["metering.by_tenant"]) == {"A", "B", "C"}
    assert figures["metering.cases"]["count"] >= 12
    assert figures["metering.lost_records"] == 0 and figures["metering.duplicate_records"] == 0
    assert figures["metering.misattributed_fraction"] == 0
    failed = {name: check for name, check in figures["metering.goals"].items() if not check["passed"]}
    assert not failed, (
        failed,
        {k: (v["unbilled_fraction"], v["overbilled_fraction"]) for k, v in figures["metering.by_kind"].items()},
    )


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_reliability(clean_redis):
    figures = smoke("reliability")
    assert set(figures["scenarios"]) == RELIABILITY_SCENARIOS and set(figures["overload"]) == {"3x", "10x"}


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.skipif(manifests.kubectl() is None, reason="kubectl (kustomize) not installed")
@pytest.mark.django_db(transaction=True)
def test_deploy(clean_redis):
    """Its production boot is the shipped package booted as deployed (benchmarks/operations/production_boot.py): the
    prod overlay's web/proxy, worker and beat with their own command lines and the production settings, against the
    test PostgreSQL and Redis, probed as the kubelet probes them; the Dockerfile's CMD and HEALTHCHECK the same way."""
    figures = smoke("deploy")
    boot = figures["production_boot"]
    assert boot["failed"] == [], "\n".join(boot["failed"])
    assert boot["checks"] >= 12
    if prometheus_check.prometheus_binary() is not None:
        assert {"prometheus_error_ratio_5m", "platform_error_ratio_5m"} <= set(figures)
    if shutil.which("promtool") is not None:
        assert {"promtool_alert_steps_checked", "first_firing_minute"} <= set(figures)


def test_pd(tmp_path, settings):
    settings.VAR_DIR = tmp_path
    assert pd_bench.real_engine_figures()["pd.real_engine.outputs_match"] is None  # the two-engine test has not run
    measured = {"outputs_match": True, "external_hit_tokens": 896, "fallbacks_without_error": 1}
    pd_bench.write_real_engine_record(measured)  # as tests/engine/test_pd_real_engine.py leaves it
    figures = smoke("pd", plot=tmp_path / "pd.svg")
    assert figures["pd.seed_set"] == "training"
    assert {k: figures[f"pd.real_engine.{k}"] for k in measured} == measured
    assert figures["pd.real_engine.source"]["stale"] is False
    detail = figures["pd.long_rag.detail"][0]
    assert set(detail["fleets"]) == {"aggregated", "round_robin", "disaggregated", "oracle", "bound"}
    # The ceiling comes from oracles alone: every split, clairvoyant pairings, never the proxy's pairing
    assert detail["fleets"]["oracle"]["router"].startswith("oracle")
    assert 1 <= detail["fleets"]["bound"]["prefill_replicas"] < detail["gpus"]
    assert detail["gpus"] == detail["split"]["prefill"] + detail["split"]["decode"]
    assert (tmp_path / "pd.svg").read_text().startswith("<svg")


@pytest.mark.e2e
@pytest.mark.skipif(not os.environ.get("INFERCAP_ENGINE_URL"), reason="no engine serving (tests/engine runs it)")
def test_fidelity():
    assert fidelity.SMOKE == {"size": "smoke"}  # tests/engine/test_fidelity.py's size
    figures = smoke("fidelity", "--opt", f"url={os.environ['INFERCAP_ENGINE_URL']}")
    assert figures["points"] and figures["contract_divergences"] == len(figures["contract_divergence_list"])
