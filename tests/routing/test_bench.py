"""``bench routing --quick`` runs through the management command and its JSON shows the issue's goals."""

import json
from io import StringIO

import pytest
from django.core.management import call_command

from endpoints.benchmarks import routing as bench
from endpoints.routing import ReplicaView, RouteRequest


@pytest.mark.slow
def test_quick_benchmark_meets_its_goals(tmp_path):
    out = StringIO()
    svg = tmp_path / "routing.svg"
    call_command("bench", "routing", "--quick", "--plot", str(svg), stdout=out, stderr=StringIO())
    figures = json.loads(out.getvalue().strip().splitlines()[-1])

    policies = figures["policies"]
    assert set(policies) == set(bench.POLICIES)
    for name, p in policies.items():
        assert {
            "slo_rps",
            "ttft_p50_ms",
            "ttft_p95_ms",
            "output_tok_s",
            "prefix_hit_rate",
            "max_over_mean_load",
        } <= set(p)
        assert p["slo_rps"] > 0, name
    # Prefix-aware policies keep far more of the cache than the load-only ones.
    assert policies["infercap"]["prefix_hit_rate"] > policies["round_robin"]["prefix_hit_rate"] + 0.1
    # Every policy is driven to its own saturation (the stages go on rising until it), so its best stage is
    # a knee, not the end of the schedule; and the stage figures behind the best one are in the JSON.
    for name, p in policies.items():
        assert p["saturated_at_qps"] is not None, name
        assert max(s[1] for s in p["stages"]) == p["slo_rps"], name
        assert p["stages"][-1][2] < 0.9, name  # the saturated stage really is past the SLO

    # Prefix affinity roughly doubles SLO-meeting throughput over round robin: the 2.0× is at the edge
    # (~1.95 measured), since the simulated replicas' TPOT ceiling (~14.5 req/s each) is about twice round robin's
    # knee. llm-d's scheduler reaches that ceiling too (as does an oracle partition of the groups, full mode):
    # parity on the best stage, not 1.1×. See the module docstring of endpoints/benchmarks/routing.py.
    assert figures["ratio_vs_round_robin"] >= 1.8
    assert figures["ttft_p50_ratio_vs_round_robin"] <= 0.1
    assert figures["ratio_vs_llmd"] >= 0.95
    goals = figures["goals"]
    assert goals["slo_rps_ge_2x_round_robin"] is (figures["ratio_vs_round_robin"] >= 2.0)
    assert goals["slo_rps_ge_1.1x_llmd"] is (figures["ratio_vs_llmd"] >= 1.1)
    hot = figures["hot_prefix"]
    assert hot["max_over_mean_load"] <= 1.3
    assert hot["hit_rate_vs_affinity"] >= 0.8
    assert hot["affinity"]["max_over_mean_load"] > 2.0  # without the bound, the hot group melts one replica
    assert goals["ttft_p50_le_0.1x_round_robin"]
    assert goals["hot_prefix_max_over_mean_le_1.3"] and goals["hot_prefix_hit_rate_ge_0.8x_affinity"]
    assert svg.read_text().startswith("<svg") and "infercap" in svg.read_text()


def test_unknown_options_are_rejected():
    with pytest.raises(ValueError, match="unknown options"):
        bench.run(quick=True, plot=None, progress=lambda m: None, bogus="1")


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
