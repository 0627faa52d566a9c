"""``bench routing --quick`` runs through the management command and its JSON shows the routing goals
(docs/algorithms.md#the-routing-workload-suite-bench-routing)."""

import json
import math
from dataclasses import replace
from io import StringIO

import pytest
from django.core.management import call_command

from benchmarks import protocol
from benchmarks.routing import routing as bench
from benchmarks.routing import routing_headline, routing_suite
from benchmarks.routing.routing_oracles import AssignmentOracle, pooled_profile
from benchmarks.routing.routing_sessions import session_stage_figures, sessions_of, sustained_rate
from benchmarks.serving.stats import interval
from gateway.routing import ReplicaView, RouteRequest
from gateway.routing.kv_index import KVBlockIndex
from gateway.routing.llmd import LlmdPreciseRouter, LlmdRouter
from simulator.results import RequestResult, SimResult

SUITE = ("shared_prefix", "cache_pressure", "multi_turn", "zipf", "heterogeneous", "mixed_lengths")


def check_workload(name: str, w: dict) -> None:
    """Every policy's figures, the ratios and ceilings, and the orderings that hold whatever the load."""
    policies = set(routing_suite.SUITE_POLICIES)
    assert policies <= set(w), name
    for policy in policies:
        p = w[policy]
        assert p["slo_throughput"] > 0 and "ttft_p90_ms" in p, (name, policy)
        # Driven past its own saturation: the best stage is a knee, and the last stage missed the SLO. Chat sessions:
        # the session rate sustained with 90 % of the sessions within the SLO on every turn.
        if w["unit"] == "sessions/s":
            stages = [{"qps": s[0], "slo_attainment": s[3]} for s in p["stages"]]
            assert p["slo_throughput"] == sustained_rate(stages), (name, policy)
            assert p["closed_loop_turns_slo_rps"] > 0 and len(p["closed_loop_turn_stages"]) == len(p["stages"])
        else:
            assert w["unit"] == "req/s" and max(s[2] for s in p["stages"]) == p["slo_throughput"], (name, policy)
        if p["saturated_at_qps"] is not None:
            assert p["stages"][-1][3] < 0.9, (name, policy)
    assert w["oracle"]["slo_throughput"] > 0 and w["oracle_kind"] in ("assignment", "outstanding_work")
    assert w["upper_bound"] >= w["oracle"]["slo_throughput"]
    ours = w["infercap"]["slo_throughput"]
    assert w["ratio_vs_llmd"] == round(ours / w["llmd"]["slo_throughput"], 4)
    best = max(w[p]["slo_throughput"] for p in routing_suite.BASELINES)
    assert w["ratio_vs_best_baseline"] == round(ours / best, 4)
    assert w["ratio_vs_upper_bound"] == round(ours / w["upper_bound"], 4)
    # The ceiling is a reference's figure, never a policy's: the oracle's or the balanced fleet's, whichever is higher.
    references = {"oracle": w["oracle"]["slo_throughput"]}
    if "balanced_fleet" in w:
        references["balanced_fleet"] = w["balanced_fleet"]["slo_throughput"]
    assert w["ceiling"] == max(references.values()) and references[w["ceiling_source"]] == w["ceiling"], name
    assert w["ratio_vs_ceiling"] == round(ours / w["ceiling"], 4)
    assert w["best_baseline"] == {
        "name": max(routing_suite.BASELINES, key=lambda p: w[p]["slo_throughput"]),
        "slo_throughput": best,
    }, name
    assert (
        w["paired_diff_vs_best_baseline_ci95"] is None and "one seed" in w["paired_diff_vs_best_baseline_ci95_reason"]
    )
    # Each stage's TTFT p90; the headline one is the stage every policy ran, and the ratio per stage repeats it there.
    common = w["stages_qps"].index(w["ttft_at_qps"])
    for policy in ("infercap", "llmd"):
        assert w[policy]["stages"][common][4] == w[policy]["ttft_p90_ms"], (name, policy)
    by_stage = w["ttft_p90_ratio_vs_llmd_by_stage"]
    assert [q for q, _ in by_stage] == w["stages_qps"][: min(len(w["infercap"]["stages"]), len(w["llmd"]["stages"]))]
    assert by_stage[common][1] == w["ttft_p90_ratio_vs_llmd"], name
    for tuned, base in routing_suite.TUNED.items():
        if w["llmd_tuned_weights"][base] == routing_suite.LLMD_DEFAULT:  # tuning kept the defaults: the same run
            assert w[tuned]["stages"] == w[base]["stages"], (name, tuned)
    # The whole fleet as one engine n× as fast serves at least what any router, the oracle included, gets from the
    # replicas, and at least the balanced fleet at a replica's pace.
    keys = [key for key, _ in routing_suite.CEILINGS.values()]
    if len(set(w["replicas"])) > 1:
        assert all(w[key] is None and w[f"ratio_vs_{key}"] is None for key in keys), name
    else:
        assert w["pooled_bound"] >= max(w[p]["slo_throughput"] for p in (*policies, "oracle", "balanced_fleet")), name
        for key in keys:
            assert w[f"ratio_vs_{key}"] == round(ours / w[key], 4), (name, key)


@pytest.mark.slow
def test_quick_benchmark_has_every_workload_policy_and_goal(tmp_path):
    out = StringIO()
    svg = tmp_path / "routing.svg"
    call_command("bench", "routing", "--quick", "--plot", str(svg), stdout=out, stderr=StringIO())
    figures = json.loads(out.getvalue().strip().splitlines()[-1])

    assert set(figures["workloads"]) == set(SUITE)
    for name, w in figures["workloads"].items():
        check_workload(name, w)
    ws = figures["workloads"]
    # Prefix-aware routing keeps more of the cache than load-only routing where prefixes repeat.
    for name in ("shared_prefix", "cache_pressure", "zipf", "heterogeneous"):
        assert ws[name]["infercap"]["prefix_hit_rate"] > ws[name]["round_robin"]["prefix_hit_rate"], name
    assert ws["mixed_lengths"]["infercap"]["prefix_hit_rate"] < 0.05  # nothing to share there
    # The regression row stays where it was: infercap at least at llm-d's level on llm-d's own workload.
    assert ws["shared_prefix"]["ratio_vs_llmd"] >= 0.95
    hot = figures["hot_prefix"]
    assert hot["max_over_mean_load"] <= 1.3 and hot["hit_rate_vs_affinity"] >= 0.8
    assert hot["affinity"]["max_over_mean_load"] > 2.0  # without the bound, the hot group melts one replica
    goals = figures["goals"]
    assert goals["hot_prefix_max_over_mean_le_1.3"] and goals["hot_prefix_hit_rate_ge_0.8x_affinity"]
    assert goals["all"] is all(v for k, v in goals.items() if k != "all")
    text = svg.read_text()
    assert text.startswith("<svg") and all(name in text for name in SUITE)
    assert "upper_bound" in text and all(policy in text for policy in routing_suite.CEILINGS)


def test_one_workload_runs_alone_with_every_key():
    figures = bench.run(quick=True, progress=lambda m: None, workloads="cache_pressure")
    assert set(figures["workloads"]) == {"cache_pressure"} and "hot_prefix" not in figures
    w = figures["workloads"]["cache_pressure"]
    check_workload("cache_pressure", w)
    # 64 groups of 4,096 tokens, a cache holding about a quarter: routing by prefix still hits far more often.
    assert w["llmd"]["prefix_hit_rate"] > 2 * w["round_robin"]["prefix_hit_rate"]
    assert w["infercap"]["prefix_hit_rate"] > 2 * w["round_robin"]["prefix_hit_rate"]
    assert "cache_pressure_ttft_p90_le_0.8x_llmd" in figures["goals"]
    with pytest.raises(ValueError, match="unknown workloads"):
        bench.run(quick=True, progress=lambda m: None, workloads="nope")


@pytest.mark.slow
def test_several_seeds_are_judged_on_their_means_and_each_seed_is_the_single_seed_run():
    quiet = {"quick": True, "progress": lambda m: None, "workloads": "cache_pressure"}
    figures = bench.run(seeds="3-4", **quiet)
    assert figures["seeds"] == [3, 4] and "hot_prefix" not in figures
    w = figures["workloads"]["cache_pressure"]
    singles = [bench.run(seed=seed, **quiet)["workloads"]["cache_pressure"] for seed in (3, 4)]
    for policy in (*routing_suite.SUITE_POLICIES, "oracle", *routing_suite.CEILINGS):
        per_seed = [single[policy]["slo_throughput"] for single in singles]
        assert w[policy]["per_seed"] == per_seed, policy  # the same arrivals and routers as a run on that seed
        assert w[policy]["slo_throughput"] == round(sum(per_seed) / 2, 2)
    ours = w["infercap"]["slo_throughput"]
    assert w["ratio_vs_llmd"] == round(ours / w["llmd"]["slo_throughput"], 4)
    best = w["best_baseline"]["name"]
    assert w["best_baseline"]["slo_throughput"] == w[best]["slo_throughput"]
    assert w["ratio_vs_best_baseline"] == round(ours / w[best]["slo_throughput"], 4)
    assert w["seeds_ge_llmd"] == sum(s["infercap"]["slo_throughput"] >= s["llmd"]["slo_throughput"] for s in singles)
    assert "cache_pressure_ge_1.0x_best_baseline" in figures["goals"]
    # Per stage both ran on both seeds: the ratio of the seeds' mean TTFT p90s.
    for k, (qps, ratio) in enumerate(w["ttft_p90_ratio_vs_llmd_by_stage"]):
        ours_k, theirs_k = ([s[p]["stages"][k][4] for s in singles] for p in ("infercap", "llmd"))
        assert qps == singles[0]["stages_qps"][k] and ratio == round(sum(ours_k) / sum(theirs_k), 4)
    assert w["ttft_p90_ratio_vs_llmd_by_stage"], "no stage with a TTFT p90 for both on both seeds"
    for policy, (key, _) in routing_suite.CEILINGS.items():
        assert w[key] == w[policy]["slo_throughput"]
        assert w[f"ratio_vs_{key}"] == round(ours / w[key], 4)
    # Paired on each seed's arrivals against the baseline with the best mean.
    paired = [s["infercap"]["slo_throughput"] - s[best]["slo_throughput"] for s in singles]
    diff = w["diff_vs_best_baseline"]
    assert diff["mean"] == round(sum(paired) / 2, 3)
    low, high = diff["ci95"]
    assert low <= diff["mean"] <= high and (low < high or paired[0] == paired[1])
    assert w["paired_diff_vs_best_baseline_ci95"] == diff["ci95"]
    # The ceiling over seeds: the mean of each seed's ceiling, no policy in it.
    assert w["ceiling_per_seed"] == [s["ceiling"] for s in singles] and w["unit"] == "req/s"
    assert w["ceiling"] == round(sum(w["ceiling_per_seed"]) / 2, 2)
    assert w["ratio_vs_ceiling"] == round(ours / w["ceiling"], 4)
    # The balanced-fleet ceiling against llm-d's default, seed by seed: how firmly out_of_reach's ratio stands.
    ceiling = w["balanced_bound_vs_llmd"]
    ratios = [round(s["balanced_fleet"]["slo_throughput"] / s["llmd"]["slo_throughput"], 4) for s in singles]
    assert ceiling["per_seed"] == ratios and ceiling["mean"] == round(sum(ratios) / 2, 4)
    low, high = ceiling["ci95"]
    assert low <= ceiling["mean"] <= high and (low < high or ratios[0] == ratios[1])


@pytest.mark.slow
def test_the_ceiling_holds_no_policy_and_the_paired_difference_needs_two_seeds():
    def table(infercap, llmd, oracle, balanced):
        w = {p: {"slo_throughput": 10.0} for p in routing_suite.BASELINES}
        w.update(
            infercap={"slo_throughput": infercap}, llmd={"slo_throughput": llmd}, oracle={"slo_throughput": oracle}
        )
        if balanced is not None:
            w["balanced_fleet"] = {"slo_throughput": balanced}
            w["balanced_bound"] = balanced
        return w

    one = table(20.0, 16.0, 12.0, 18.0)  # infercap above every reference: the ratio says so
    one.update(routing_headline.single_seed(one))
    assert (one["ceiling"], one["ceiling_source"], one["ratio_vs_ceiling"]) == (18.0, "balanced_fleet", 1.1111)
    assert one["best_baseline"] == {"name": "llmd", "slo_throughput": 16.0}
    assert one["paired_diff_vs_best_baseline_ci95"] is None and one["paired_diff_vs_best_baseline_ci95_reason"]
    assert routing_headline.ceiling(table(5.0, 4.0, 6.0, None)) == (6.0, "oracle")  # a mixed fleet: the oracle only
    runs = [table(20.0, 16.0, 12.0, 18.0), table(19.0, 16.0, 12.0, 17.0), table(19.0, 15.0, 12.0, 20.0)]
    for r in runs:
        r.update(routing_headline.single_seed(r))
    mean = {
        p: {"slo_throughput": sum(r[p]["slo_throughput"] for r in runs) / 3}
        for p in (*runs[0].keys(),)
        if isinstance(runs[0][p], dict) and "slo_throughput" in runs[0][p]
    }
    out = routing_headline.over_seeds(mean, runs)
    assert out["paired_diff_vs_best_baseline_per_seed"] == [4.0, 3.0, 4.0]
    assert out["paired_diff_vs_best_baseline_ci95"] == interval([4.0, 3.0, 4.0])
    assert out["ceiling_per_seed"] == [18.0, 17.0, 20.0] and out["ceiling"] == 18.33
    assert out["ratio_vs_balanced_bound_ci95"] == interval([round(20 / 18, 4), round(19 / 17, 4), 0.95])
    assert routing_headline.paired_above_zero({"a": out, "b": one}) == ["a"]


def test_ceilings_off_skips_only_the_router_independent_ceilings():
    quiet = {"quick": True, "progress": lambda m: None, "workloads": "cache_pressure", "seed": 3}
    figures = bench.run(ceilings="off", **quiet)
    w = figures["workloads"]["cache_pressure"]
    for policy, (key, _) in routing_suite.CEILINGS.items():
        assert policy not in w and w[key] is None and w[f"ratio_vs_{key}"] is None
    assert figures["out_of_reach"] == {}  # no ceiling, nothing shown out of reach
    several = bench.run(ceilings="off", seeds="3-4", quick=True, progress=lambda m: None, workloads="cache_pressure")
    assert "balanced_bound_vs_llmd" not in several["workloads"]["cache_pressure"]
    assert w["infercap"]["slo_throughput"] > 0 and w["oracle"]["slo_throughput"] > 0
    with pytest.raises(ValueError, match="ceilings=maybe"):
        bench.run(ceilings="maybe", **quiet)


def test_a_missed_goal_is_out_of_reach_only_where_the_balanced_fleet_misses_it_too():
    def workload(ratio_vs_llmd, llmd, balanced):
        return {"ratio_vs_llmd": ratio_vs_llmd, "llmd": {"slo_throughput": llmd}, "balanced_bound": balanced}

    workloads = {
        "cache_pressure": workload(1.05, 15.0, 16.9),  # missed; the ceiling is 1.1267× llm-d: out of reach
        "multi_turn": workload(1.08, 70.0, 84.0),  # missed, but the ceiling is 1.2×: reachable, not listed
        "heterogeneous": workload(1.26, 50.0, 55.0),  # met: not listed, whatever the ceiling
        "shared_prefix": workload(0.9, 90.0, 95.0),  # no 1.15× goal
    }
    assert routing_suite.out_of_reach(workloads) == {"cache_pressure_ge_1.15x_llmd": 1.1267}
    workloads["cache_pressure"]["balanced_bound"] = None  # ceilings=off
    workloads["multi_turn"]["balanced_bound"] = 80.0  # 1.1429×
    assert routing_suite.out_of_reach(workloads) == {"multi_turn_ge_1.15x_llmd": 1.1429}
    # Over several seeds, only where the ceiling's whole interval lies below the goal as well.
    workloads["multi_turn"]["balanced_bound_vs_llmd"] = {"mean": 1.143, "ci95": [1.10, 1.16]}
    assert routing_suite.out_of_reach(workloads) == {}
    workloads["multi_turn"]["balanced_bound_vs_llmd"]["ci95"] = [1.13, 1.149]
    assert routing_suite.out_of_reach(workloads) == {"multi_turn_ge_1.15x_llmd": 1.1429}
    # A quick run reads it off its own ceilings: only missed goals, each with a ceiling below 1.15× llm-d.
    figures = bench.run(quick=True, progress=lambda m: None, workloads="cache_pressure", seed=3)
    w = figures["workloads"]["cache_pressure"]
    ceiling = w["balanced_bound"] / w["llmd"]["slo_throughput"]
    missed = not figures["goals"]["cache_pressure_ge_1.15x_llmd"]
    assert ("cache_pressure_ge_1.15x_llmd" in figures["out_of_reach"]) == (missed and ceiling < 1.15)


def test_pooled_fleets_are_one_engine_with_the_fleets_memory_at_n_times_or_at_one_replicas_pace():
    replica = routing_suite.get_profile(routing_suite.H100, num_gpu_blocks=2048)
    batches = [(40, 40 * 3000), (10, 10 * 500), (70, 70 * 5000), (1, 800)] * 2
    steps = [replica.decode_step_s(b, c) for b, c in batches]
    batch, context = sum(b for b, _ in batches), sum(c for _, c in batches)
    for balanced in (False, True):
        pooled = pooled_profile(replica, 8, balanced=balanced)
        assert pooled.num_gpu_blocks == 8 * 2048 and pooled.max_num_seqs == 8 * replica.max_num_seqs
        assert pooled.max_num_batched_tokens == 8 * replica.max_num_batched_tokens
        # A prefill step computes eight replicas' chunks in one replica's time for one of them, less the overhead
        # it takes once for all eight.
        one_chunk = replica.prefill_s(4096) - 7 / 8 * replica.prefill_overhead_s
        assert pooled.prefill_s(8 * 4096) == pytest.approx(one_chunk)
    # n× as fast: the eight replicas' batches in one step, in an eighth of one replica's time for all of them, less
    # than the slowest replica's step, so no sequence gets its tokens later than on its replica.
    fast = pooled_profile(replica, 8).decode_step_s(batch, context)
    assert fast == pytest.approx(replica.decode_step_s(batch, context) / 8) and fast < max(steps)
    # Balanced: one replica's pace for the mean batch, the mean of the replicas' step times.
    paced = pooled_profile(replica, 8, balanced=True).decode_step_s(batch, context)
    assert paced == pytest.approx(sum(steps) / 8) and fast < paced < max(steps)
    with pytest.raises(ValueError, match="at least one"):
        pooled_profile(replica, 0)
    mixed = next(w for w in routing_suite.suite(quick=True) if w.name == "heterogeneous")
    for policy in routing_suite.CEILINGS:
        with pytest.raises(ValueError, match="one replica profile"):
            routing_suite.run_policy(mixed, policy, routing_suite.Run(stage_s=8.0))


@pytest.mark.parametrize("text", ["", "x", "5-3", "1-b"])
def test_bad_seed_lists_are_refused(text):
    with pytest.raises(ValueError, match="seed"):
        bench.run(quick=True, progress=lambda m: None, workloads="cache_pressure", seeds=text)


def test_seed_lists_accept_ranges_and_drop_repeats():
    assert routing_suite.parse_seeds("17-19, 21,18") == [17, 18, 19, 21]
    with pytest.raises(ValueError, match="take one"):
        bench.run(quick=True, plot="x.svg", progress=lambda m: None, seeds="1,2")


def test_assignment_oracle_deals_popular_groups_over_several_replicas_by_speed():
    weights = [0.4, 0.3] + [0.3 / 8] * 8
    oracle = AssignmentOracle(weights=weights, seed=0)
    views = [ReplicaView(replica_id=f"r{i}", mu_capacity=1.0 if i < 2 else 0.5) for i in range(4)]
    picks = {}
    for g in range(len(weights)):
        for k in range(8):
            request = RouteRequest(request_id=f"{g}-{k}", prompt_text="", extra={"workload": {"group": g}})
            chosen = oracle.pick(request, views, 0.0)
            picks.setdefault(g, set()).add(chosen)
            next(v for v in views if v.replica_id == chosen).in_flight_mu += 1.0
    assert len(picks[0]) >= 2  # 40% of the traffic is more than one replica's share of 3 replicas' worth
    assert all(len(picks[g]) == 1 for g in range(2, len(weights)))  # cold groups live on one replica each


def test_tuned_llmd_baselines_run_llmds_profiles_with_the_workloads_weights():
    workload = next(w for w in routing_suite.suite(quick=True) if w.name == "zipf")
    weights = {"queue_weight": 1.0, "kv_weight": 3.0, "prefix_weight": 0.0}
    tuned = routing_suite.replace(workload, llmd_weights={"llmd_precise": weights})
    index = KVBlockIndex()
    precise = routing_suite.make_policy(tuned, "llmd_precise_tuned", 2, index, [])
    assert isinstance(precise, LlmdPreciseRouter) and precise.kv_index is index
    assert (precise.queue_weight, precise.kv_weight, precise.prefix_weight) == (1.0, 3.0, 0.0)
    approximate = routing_suite.make_policy(tuned, "llmd_tuned", 2, None, [])
    assert type(approximate) is LlmdRouter  # no weights tuned for this profile: llm-d's defaults
    assert (approximate.queue_weight, approximate.kv_weight, approximate.prefix_weight) == (2.0, 2.0, 3.0)
    # The weights change what the profile does: without its prefix scorer llm-d routes by load and misses the cache.
    run = routing_suite.Run(stage_s=8.0, seed=1)
    blind = routing_suite.run_policy(tuned, "llmd_precise_tuned", run)["result"]
    default = routing_suite.run_policy(workload, "llmd_precise_tuned", run)["result"]
    assert blind.prefix_hit_rate() < default.prefix_hit_rate()
    assert default.digest() == routing_suite.run_policy(workload, "llmd_precise", run)["result"].digest()


def test_tuning_keeps_the_weights_with_the_best_mean_and_reports_every_one_tried():
    grid = (routing_suite.LLMD_DEFAULT, {"queue_weight": 2.0, "kv_weight": 2.0, "prefix_weight": 0.0})
    quiet = {"quick": True, "progress": lambda m: None, "workloads": "cache_pressure"}
    out = routing_suite.tune_llmd(
        [1, 3], quick=True, stage_s=None, only=["cache_pressure"], progress=quiet["progress"], grid=grid
    )
    assert out["seeds"] == [1, 3]
    for base in ("llmd", "llmd_precise"):
        t = out["tuning"]["cache_pressure"][base]
        assert [g["weights"] for g in t["grid"]] == list(grid)
        for g in t["grid"]:
            assert len(g["per_seed"]) == 2 and g["slo_throughput"] == round(sum(g["per_seed"]) / 2, 2)
        best = max(g["slo_throughput"] for g in t["grid"])
        assert t["slo_throughput"] == best
        assert t["weights"] == next(g["weights"] for g in t["grid"] if g["slo_throughput"] == best)
    # Without the prefix scorer llm-d balances load only: 4,096-token prefixes are recomputed, and it serves less.
    no_prefix = out["tuning"]["cache_pressure"]["llmd"]["grid"][1]
    assert no_prefix["slo_throughput"] < out["tuning"]["cache_pressure"]["llmd"]["grid"][0]["slo_throughput"]
    with pytest.raises(ValueError, match="needs seeds"):
        bench.run(tune="llmd", **quiet)
    with pytest.raises(ValueError, match="only llm-d"):
        bench.run(tune="infercap", seeds="1", **quiet)


@pytest.mark.slow
def test_another_load_bound_changes_infercap_only():
    quiet = {"quick": True, "progress": lambda m: None, "workloads": "zipf"}
    default = bench.run(**quiet)["workloads"]["zipf"]
    loose = bench.run(load_bound="3", **quiet)
    assert loose["infercap_options"] == {"load_bound": 3.0}
    w = loose["workloads"]["zipf"]
    assert w["llmd"]["stages"] == default["llmd"]["stages"]  # the same arrivals for every other policy
    assert w["infercap"]["stages"] != default["infercap"]["stages"]
    for bad in ("0.5", "x", "inf", "nan"):
        with pytest.raises(ValueError, match="load_bound"):
            bench.run(load_bound=bad, **quiet)


@pytest.mark.slow
def test_the_pending_prefill_term_is_an_option_that_changes_infercap_only():
    quiet = {"quick": True, "progress": lambda m: None, "workloads": "cache_pressure"}
    default = bench.run(**quiet)["workloads"]["cache_pressure"]
    unweighed = bench.run(prefill_weight="0", **quiet)  # 2 by default
    assert unweighed["infercap_options"] == {"prefill_weight": 0.0}
    w = unweighed["workloads"]["cache_pressure"]
    assert w["llmd"]["stages"] == default["llmd"]["stages"]
    assert w["infercap"]["stages"] != default["infercap"]["stages"]
    for bad in ("-1", "x", "inf", "nan"):
        with pytest.raises(ValueError, match="prefill_weight"):
            bench.run(prefill_weight=bad, **quiet)


@pytest.mark.slow
def test_chat_stages_are_measured_after_a_warm_up_near_their_nominal_turn_rate():
    """A closed-loop chat's turn rate lags its sessions' starts by a session's life: from cold, a short stage measures
    a transient (and how fast the policy serves decides how many turns fall into it). The multi-turn workload warms
    up for one stage, unmeasured, and its stages are four times longer. Its stages are session starts, which arrive
    open-loop at the stage's rate whatever the service."""
    workload = next(w for w in routing_suite.suite(quick=True) if w.name == "multi_turn")
    run = routing_suite.Run(stage_s=30.0, seed=3)  # full mode's stages (on the quick fleet)
    staged = run.for_workload(workload)
    assert staged.stage_s == 120.0 and staged.warmup_s == 120.0 and staged.stage_window(1) == (240.0, 360.0)
    out = routing_suite.run_policy(workload, "least_request", run)
    result, first = out["result"], out["stages"][0]
    assert any(r.arrival_s < staged.warmup_s for r in result.requests)  # the warm-up ran, and is not a stage
    starts = [s.start_s for s in sessions_of(result)]
    assert first["requests"] == sum(120.0 <= t < 240.0 for t in starts)  # sessions that started in the stage
    assert first["offered_rps"] > 0.8 * first["qps"] and first["slo_attainment"] > 0.95
    turn_rate = first["qps"] * routing_suite.mean_turns(workload)
    assert first["turns_offered_rps"] > 0.8 * turn_rate
    cold = routing_suite.run_policy(replace(workload, stage_scale=1.0, warmup_stages=0.0), "least_request", run)
    assert cold["stages"][0]["turns_offered_rps"] < 0.6 * turn_rate  # what the stage measured before
    assert cold["stages"][0]["offered_rps"] > 0.6 * first["qps"]  # sessions arrive at the stage's rate from cold


def _turn(session: str, arrival_s: float, ttft_s: float | None) -> RequestResult:
    done = ttft_s is not None
    return RequestResult(
        request_id=f"{session}-{arrival_s}",
        tenant="t",
        priority=0,
        arrival_s=arrival_s,
        prompt_tokens=100,
        max_tokens=10,
        mu=1.0,
        session_id=session,
        status="ok" if done else "unserved",
        first_token_s=arrival_s + ttft_s if done else None,
        finish_s=arrival_s + ttft_s + 0.45 if done else None,
        output_tokens=10,
    )


def test_the_sustained_session_rate_is_read_where_the_share_within_the_slo_crosses_90_percent():
    def stages(*points):
        return [{"qps": q, "slo_attainment": a} for q, a in points]

    assert sustained_rate(stages((2.0, 1.0), (2.2, 0.95), (2.4, 0.85), (2.6, 0.95))) == 2.3  # the first crossing
    assert sustained_rate(stages((2.0, 1.0), (2.2, 0.9), (2.4, 0.5))) == 2.2  # 90 % exactly still passes
    assert sustained_rate(stages((2.0, 0.8))) == 1.0  # below at the first stage: from 0 sessions/s, where all would
    assert sustained_rate(stages((2.0, 1.0), (2.2, 0.99))) == 2.2  # never below: the last stage's rate


def test_a_stage_counts_the_sessions_that_started_in_it_and_each_meets_the_slo_only_with_every_turn():
    turns = [
        *(_turn("a", t, 0.5) for t in (1.0, 12.0, 30.0)),  # starts in [0, 10), every turn within: good
        *(_turn("b", t, ttft) for t, ttft in ((2.0, 0.5), (15.0, 3.0))),  # a late turn (TTFT 3 s): not good
        _turn("c", 4.0, None),  # never served: not good
        *(_turn("d", t, 0.5) for t in (11.0, 19.0)),  # starts in the next stage
    ]
    result = SimResult(requests=turns, replicas=[], end_s=40.0)
    sessions = sessions_of(result)
    assert [s.start_s for s in sessions] == [1.0, 2.0, 4.0, 11.0]
    stage = session_stage_figures(result, sessions, (0.0, 10.0), qps=0.3, slo=(2.0, 0.1))
    assert (stage["requests"], stage["offered_rps"], stage["slo_rps"]) == (3, 0.3, 0.1)
    assert stage["slo_attainment"] == pytest.approx(1 / 3) and stage["turns"] == 6
    assert stage["ttft_p90_s"] == math.inf  # the never-served turn counts as infinitely late
    # The closed-loop figure: turns that arrived in the window (a1, b1, c1), of which two met the SLO.
    assert (stage["turns_offered_rps"], stage["turns_slo_rps"]) == (0.3, 0.2)


def test_unknown_options_are_rejected():
    with pytest.raises(ValueError, match="unknown options"):
        bench.run(quick=True, plot=None, progress=lambda m: None, bogus="1")


@pytest.mark.slow
def test_saturation_stops_the_stages_and_results_are_deterministic():
    setup = bench.Setup(replicas=2, num_gpu_blocks=3000, stages=(5.0, 100.0, 200.0), stage_s=8.0, groups=16)
    first = bench.run_staged(setup, "round_robin")
    # 100 req/s is far beyond 2 replicas: the run stops there and never offers the 200 stage.
    assert first["saturated_at_qps"] == 100.0 and len(first["stages"]) == 2
    assert first["stages"][0]["slo_rps"] > 0.8 * 5
    assert first["stages"][1]["slo_rps"] < 0.5 * 100
    # Arrivals go on at 100 req/s for one unmeasured stage: the saturated stage is not measured on a draining fleet.
    arrivals = [r.arrival_s for r in first["result"].requests]
    assert max(arrivals) > 2.9 * setup.stage_s
    assert sum(r.arrival_s >= 2 * setup.stage_s for r in first["result"].requests) > 0.8 * 100 * setup.stage_s
    again = bench.run_staged(setup, "round_robin")
    assert again["result"].digest() == first["result"].digest()


def test_stage_plan_rises_past_the_configured_stages_until_twice_the_last():
    assert bench.stage_plan(bench.Setup(stages=(10, 20, 25))) == (10, 20, 25, 30, 35, 40, 45, 50)
    assert bench.stage_plan(bench.Setup(stages=(50,)))[:3] == (50, 55, 60)
    with pytest.raises(ValueError, match="at least one"):
        bench.stage_plan(bench.Setup(stages=()))


def test_an_unsaturated_schedule_keeps_rising_until_the_policy_saturates():
    # 2 replicas serve ~30 req/s: a schedule ending at 10 req/s goes on rising by 5 until saturation.
    setup = bench.Setup(replicas=2, num_gpu_blocks=3000, stages=(5.0, 10.0), stage_s=8.0, groups=16)
    data = bench.run_staged(setup, "round_robin")
    assert data["saturated_at_qps"] is not None and data["saturated_at_qps"] > 10.0
    assert [s["qps"] for s in data["stages"]][:3] == [5.0, 10.0, 15.0]


def test_goodput_at_90pct_is_the_highest_stage_meeting_it():
    stages = [
        {"qps": 10.0, "requests": 100, "slo_attainment": 1.0},
        {"qps": 20.0, "requests": 200, "slo_attainment": 0.93},
        {"qps": 30.0, "requests": 300, "slo_attainment": 0.4},
    ]
    assert bench.max_qps_meeting(stages, 0.9) == 20.0
    assert bench.max_qps_meeting(stages, 0.95) == 10.0
    assert bench.max_qps_meeting(stages[2:], 0.9) is None


def test_partition_oracle_pins_each_group_to_one_replica():
    setup = bench.Setup(groups=8, prompts_per_group=4)
    oracle = bench.PartitionOracle(setup, seed=0)
    systems, questions = bench._texts(8, 4, setup.system_tokens, setup.question_tokens, setup.seed)
    replicas = [ReplicaView(replica_id=f"r{i}") for i in (2, 0, 3, 1)]  # any order: placed by id
    for g in range(8):
        picks = {
            oracle.pick(RouteRequest(request_id=f"{g}-{q}", prompt_text=systems[g] + questions[g][q]), replicas, 0.0)
            for q in range(4)
        }
        assert picks == {f"r{g % 4}"}
    replicas[0].healthy = False  # r2 unhealthy: the groups are dealt over the three left (g mod 3, by id)
    assert [oracle.pick(RouteRequest(request_id="x", prompt_text=systems[g]), replicas, 0.0) for g in (1, 2, 3)] == [
        "r1",
        "r3",
        "r0",
    ]


def test_a_plain_run_refuses_every_held_out_seed_and_trains_on_the_protocols_training_seeds():
    quiet = {"quick": True, "progress": lambda m: None, "workloads": "cache_pressure"}
    assert routing_suite.EVAL_SEED in protocol.seeds_for("routing", held_out=False)
    held = protocol.SEEDS["routing"].held_out
    for options in ({"seed": str(held[0])}, {"seeds": f"2,{held[3]}"}, {"seeds": f"{held[0]}-{held[-1]}"}):
        with pytest.raises(ValueError, match="held out"):
            bench.run(**quiet, **options)
    with pytest.raises(ValueError, match="held out"):  # tuning on held-out seeds neither
        bench.run(tune="llmd", seeds=str(held[1]), **quiet)
    options = {"seeds": "training"}
    assert bench.seeds_of_run(options, held_out=False, quick=True, one_seed_only=False) == (
        routing_suite.EVAL_SEED,
        list(protocol.seeds_for("routing", held_out=False)),
    )


def test_held_out_runs_take_only_held_out_seeds_and_say_so():
    quiet = {"quick": True, "progress": lambda m: None, "workloads": "cache_pressure", "held_out": True}
    held = protocol.SEEDS["routing"].held_out
    for options, refusal in (
        ({"seeds": "2"}, "only held-out seeds"),
        ({"seeds": f"{held[0]},3"}, "only held-out seeds"),
        ({"seed": str(held[0])}, "seed="),
        ({"tune": "llmd"}, "tune="),
        ({"plot": "x.svg"}, "--plot"),
    ):
        with pytest.raises(ValueError, match=refusal):
            bench.run(**quiet, **options)
    _, seeds = bench.seeds_of_run({}, held_out=True, quick=True, one_seed_only=False)
    assert seeds == list(held[: bench.QUICK_HELD_OUT_SEEDS])
    assert bench.seeds_of_run({}, held_out=True, quick=False, one_seed_only=False)[1] == list(held)
    figures = bench.run(stage_s="0.5", seeds=f"{held[4]},{held[7]}", ceilings="off", **quiet)
    assert figures["held_out"] is True and figures["seeds"] == [held[4], held[7]]
    w = figures["workloads"]["cache_pressure"]
    assert len(w["paired_diff_vs_best_baseline_per_seed"]) == 2 and w["paired_diff_vs_best_baseline_ci95"]
    plain = bench.run(stage_s="0.5", ceilings="off", quick=True, progress=lambda m: None, workloads="cache_pressure")
    assert plain["held_out"] is False and plain["seed"] == routing_suite.EVAL_SEED


def test_the_command_logs_each_held_out_run(monkeypatch, tmp_path):
    log = tmp_path / "held_out_log.jsonl"
    monkeypatch.setattr(protocol, "HELD_OUT_LOG", log)
    out = StringIO()
    argv = ["bench", "routing", "--smoke", "--held-out", "--opt", "workloads=cache_pressure", "--opt", "ceilings=off"]
    call_command(*argv, stdout=out, stderr=StringIO())
    figures = json.loads(out.getvalue().strip().splitlines()[-1])
    held = list(protocol.SEEDS["routing"].held_out[: bench.QUICK_HELD_OUT_SEEDS])
    assert figures["held_out"] is True and figures["seeds"] == held
    entry = json.loads(log.read_text().strip().splitlines()[-1])
    assert entry["bench"] == "routing" and entry["figures"]["seeds"] == held
    call_command(
        "bench", "routing", "--smoke", "--opt", "workloads=cache_pressure", stdout=StringIO(), stderr=StringIO()
    )
    assert len(log.read_text().strip().splitlines()) == 1  # a training run is not a look
