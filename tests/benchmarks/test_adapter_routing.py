"""``bench lora`` reports the figures docs/lora.md#bench-lora describes; infercap keeps far more requests within the
SLO than round robin."""

import json

import pytest

from benchmarks import protocol
from benchmarks.serving import adapter_routing as bench


@pytest.mark.slow
def test_bench_lora_reports_every_policy_and_the_ratios(tmp_path):
    svg = tmp_path / "lora.svg"
    figures = bench.run(
        quick=True, plot=str(svg), progress=lambda msg: None, duration_s="10", warmup_s="5", rates="80", seed="101"
    )
    json.dumps(figures)  # the command prints it as one JSON line
    assert set(figures["policies"]) == {"round_robin", "lora_affinity", "lora_affinity_lfu", "infercap"}
    assert figures["setup"]["seeds"] == [101] and set(figures["per_seed"]) == {101}
    for name, run in figures["policies"].items():
        assert {"slo_throughput", "adapter_loads_per_1k", "ttft_p90_ms"} <= set(run), name
        assert run["stages"][0]["requests"] > 500
    ours, rr = figures["policies"]["infercap"], figures["policies"]["round_robin"]
    assert ours["slo_throughput"] > 1.5 * rr["slo_throughput"]
    assert ours["adapter_loads_per_1k"] < rr["adapter_loads_per_1k"]  # at the low rate
    assert ours["adapter_loads_per_1k_at_reference"] < rr["adapter_loads_per_1k_at_reference"]
    assert figures["ratio_vs_round_robin"] == pytest.approx(ours["slo_throughput"] / rr["slo_throughput"], rel=1e-2)
    assert figures["ratio_vs_lora_affinity"] is not None and figures["ratio_vs_lora_affinity_lfu"] is not None
    lfu = figures["policies"]["lora_affinity_lfu"]
    assert figures["ratio_vs_lora_affinity_lfu"] == pytest.approx(
        ours["slo_throughput"] / lfu["slo_throughput"], rel=1e-2
    )
    # No churn, no load time: the bound serves (nearly) everything at this rate.
    assert figures["upper_bound"]["slo_throughput"] >= ours["slo_throughput"]
    assert svg.read_text().startswith("<svg") and svg.read_text().count("polyline") == 5


def test_bench_lora_rejects_unknown_options():
    with pytest.raises(ValueError, match="unknown options: speed"):
        bench.run(quick=True, progress=lambda msg: None, speed="2")


def test_zipf_catalog_is_seeded_and_skewed():
    cat = bench.catalog(200, 1.0, 0.5, 2.0, 7)
    assert cat == bench.catalog(200, 1.0, 0.5, 2.0, 7) and len(set(cat.names)) == 200
    assert cat.weights[0] / cat.weights[99] == pytest.approx(100)
    assert all(0.5 <= t <= 2.0 for t in cat.load_s.values()) and set(cat.rank.values()) <= {8, 16, 32}


def test_fewest_loads_is_beladys_min():
    # Two slots, a b c a b: at c, a comes back before b, so b leaves; a hits and b loads again: 4 loads. LRU would
    # evict a at c and miss both a and b: 5.
    assert bench.fewest_loads(list("abcab"), 2) == [True, True, True, False, True]
    assert sum(bench.fewest_loads(list("abcabcabc"), 3)) == 3  # everything fits: compulsory loads only
    assert bench.fewest_loads(list("aaa"), 0) == [True, True, True]
    # Never worse than any other eviction rule on the same stream (LRU here), and no fewer loads than adapters.
    stream = [f"a{int(x)}" for x in "0123012401234501234560"]
    lru, held, lru_loads = 3, [], 0
    for name in stream:
        if name in held:
            held.remove(name)
        else:
            lru_loads += 1
            held = held[-(lru - 1) :]
        held.append(name)
    assert len(set(stream)) <= sum(bench.fewest_loads(stream, 3)) <= lru_loads


@pytest.mark.slow
def test_the_loads_bound_is_reported_per_rate_and_against_the_baseline():
    figures = bench.run(quick=True, progress=lambda msg: None, duration_s="10", warmup_s="5", rates="40", seed="101")
    bound = figures["loads_lower_bound_per_1k_at_reference"]
    assert 0 < bound < figures["policies"]["round_robin"]["adapter_loads_per_1k_at_reference"]
    assert figures["policies"]["infercap"]["stages"][0]["loads_lower_bound_per_1k"] == bound
    assert figures["loads_floor_ratio_vs_lora_affinity_at_reference"] == pytest.approx(
        bound / figures["policies"]["lora_affinity"]["adapter_loads_per_1k_at_reference"], rel=1e-2
    )


def test_a_rate_draws_one_stream_however_it_is_spelled():
    setup = bench.QUICK
    assert [r.adapter for r in bench.requests(setup, 80)] == [r.adapter for r in bench.requests(setup, 80.0)]


def test_popular_first_evicts_the_least_popular_and_sits_between_min_and_lru():
    share = {"a": 3.0, "b": 2.0, "c": 1.0}.__getitem__
    # Two slots, a b c a b: at c the least popular held adapter (b) leaves... c loads; at a hit; at b, c leaves.
    assert bench.popular_first_loads(list("abcab"), 2, share) == [True, True, True, False, True]
    assert bench.popular_first_loads(list("aa"), 0, share) == [True, True]
    setup = bench.Setup(seed=5, warmup_s=5.0, duration_s=30.0)
    assert bench.loads_lower_bound(setup, 10) <= bench.loads_online_bound(setup, 10)


@pytest.mark.slow
def test_the_low_rate_compares_loads_with_the_books_history_and_without():
    figures = bench.run(
        quick=True,
        progress=lambda msg: None,
        duration_s="10",
        warmup_s="5",
        rates="80",
        low_qps="10",
        low_duration_s="30",
        seed="101",
    )
    low = figures["low_rate"]
    assert low["qps"] == 10.0
    ours = figures["policies"]["infercap"]["low_rate"]["adapter_loads_per_1k"]
    baseline = figures["policies"]["lora_affinity"]["low_rate"]["adapter_loads_per_1k"]
    assert low["loads_ratio_vs_lora_affinity"] == pytest.approx(ours / baseline, rel=1e-2)
    assert figures["policies"]["infercap"]["adapter_loads_per_1k"] == ours  # the headline key is the low rate's
    assert figures["loads_ratio_vs_lora_affinity"] == low["loads_ratio_vs_lora_affinity"]
    for variant in ("without_history", "with_wrong_history"):
        assert low[f"loads_ratio_{variant}"] == pytest.approx(
            low[f"infercap_{variant}"]["adapter_loads_per_1k"] / baseline, rel=1e-2
        )
    # The right history beats a wrong one (another catalog's popularity) on the same requests.
    assert ours < low["infercap_with_wrong_history"]["adapter_loads_per_1k"]
    assert 0 < low["loads_lower_bound_per_1k"] <= low["loads_online_bound_per_1k"] < baseline
    assert figures["goals_met"]["loads_half_of_lora_affinity"] == (figures["loads_ratio_vs_lora_affinity"] <= 0.5)
    # Against the baseline given the same history too, and at the rate the goal was first set (the reference rate).
    lfu = figures["policies"]["lora_affinity_lfu"]["low_rate"]["adapter_loads_per_1k"]
    assert low["loads_ratio_vs_lora_affinity_lfu"] == pytest.approx(ours / lfu, rel=1e-2)
    goals = figures["goals_met"]
    assert {f"loads_half_of_{b}{at}" for b in bench.BASELINES for at in ("", "_at_reference")} <= set(goals)
    assert goals["loads_half_of_lora_affinity_lfu_at_reference"] == (
        figures["loads_ratio_vs_lora_affinity_lfu_at_reference"] <= 0.5
    )


def test_over_several_seeds_figures_are_the_seeds_means_and_booleans_all_of_them():
    rows = [
        {"a": 1.0, "ok": True, "stages": [1], "n": None, "sub": {"b": 2}},
        {"a": 2.0, "ok": False, "stages": [2], "n": 3, "sub": {"b": 4}},
    ]
    assert bench.mean_figures(rows) == {"a": 1.5, "ok": False, "stages": [1], "n": None, "sub": {"b": 3.0}}


def test_seeds_come_from_the_protocol_unless_one_is_named():
    assert bench.HELD_OUT and not set(protocol.SEEDS["lora"].held_out) & set(protocol.SEEDS["lora"].training)
    assert bench.EVAL_SEED in protocol.SEEDS["lora"].training  # 101 took part in decisions: no longer held out


def test_the_history_is_another_draw_of_the_catalog():
    setup = bench.QUICK
    rates = bench.history_rates(setup, 10)
    assert sum(rates.values()) == pytest.approx(10, rel=1e-6)
    cat = bench._catalog(setup)
    top = cat.names[0]  # the largest Zipf share
    assert rates[top] == max(rates.values())
    # Not the measured stream's counts.
    measured = [r.adapter for r in bench.requests(setup, 10)]
    assert rates != {a: measured.count(a) / setup.history_s for a in set(measured)}
