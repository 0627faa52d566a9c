"""``bench pd``'s TPOT ceiling: every split of the GPUs with clairvoyant pairings, against the aggregated fleet at the
comparison's load, and whether any split meets both goals (benchmarks/serving/pd_tpot.py)."""

from types import SimpleNamespace

import pytest

from benchmarks.serving import pd as pd_bench
from benchmarks.serving.pd_tpot import tpot_ceiling, tpot_ceiling_summary, tpot_ratios

PLAN = SimpleNamespace(kv_bytes_per_token=2 * 32 * 8 * 128 * 2)


def row(prefill, decode, *, goodput, attainment=1.0, tpot=0.010, router="oracle_overlap"):
    """An oracle fleet's figures as the ceiling loop leaves them: its highest rate's goodput per GPU, and its
    latencies at the comparison's load."""
    return {
        "prefill_replicas": prefill,
        "decode_replicas": decode,
        "router": router,
        "goodput_per_gpu": goodput,
        "same_load": {"attainment": attainment, "tpot_p90_s": tpot},
    }


AGGREGATED = {"goodput_per_gpu": 1.0}
AGGREGATED_AT_LOAD = {"attainment": 0.93, "tpot_p90_s": 0.015}


def test_the_oracle_fleets_are_every_split_with_each_clairvoyant_pairing():
    fleets = pd_bench.oracle_fleets(PLAN, 6, ("oracle_overlap", "oracle"))
    assert [(f.prefill_replicas, f.replicas, f.router) for f in fleets] == [
        (p, 6 - p, router) for p in range(1, 6) for router in ("oracle_overlap", "oracle")
    ]
    assert {f.mode for f in fleets} == {"disaggregated"} and {f.gpus for f in fleets} == {6}
    # the proxy's pairing (least_loaded) would make it a ceiling that contains the policy it judges
    with pytest.raises(ValueError, match="clairvoyant"):
        pd_bench.oracle_fleets(PLAN, 6, ("oracle_overlap", "least_loaded"))


def test_a_fleet_missing_the_slo_at_the_comparison_load_is_not_the_ceiling():
    # Given 1 + 5 with the lowest TPOT but only 40 % of requests within the SLO at that load (its prefill queues)
    rows = tpot_ratios(
        [
            row(1, 5, goodput=0.5, attainment=0.4, tpot=0.007),
            row(2, 4, goodput=1.05, attainment=0.97, tpot=0.0093),
            row(3, 3, goodput=1.65, tpot=0.0110),
        ],
        aggregated=AGGREGATED,
        same_load=AGGREGATED_AT_LOAD,
    )
    assert [r["tpot_p90_ratio"] for r in rows] == [None, 0.62, pytest.approx(0.7333, abs=1e-4)]
    assert [r["goodput_ratio"] for r in rows] == [0.5, 1.05, 1.65]
    # Then the ceiling is 2 + 4's ratio, and no split meets both goals (2 + 4 lacks goodput, 3 + 3 the TPOT)
    ceiling = tpot_ceiling(rows)
    assert (ceiling["tpot_p90_ratio"], ceiling["split"], ceiling["meeting_both"]) == (0.62, "2 + 4", [])


def test_a_split_meeting_both_goals_is_named():
    rows = tpot_ratios(
        [row(2, 4, goodput=1.2, tpot=0.009), row(3, 3, goodput=1.6, tpot=0.0104)],
        aggregated=AGGREGATED,
        same_load=AGGREGATED_AT_LOAD,
    )
    assert tpot_ceiling(rows)["meeting_both"] == ["3 + 3"]  # 1.6x and 0.693x
    # an aggregated fleet that missed its SLO at its own highest rate leaves nothing to compare with
    missed = tpot_ratios(rows, aggregated=AGGREGATED, same_load={"attainment": 0.8, "tpot_p90_s": 0.015})
    assert tpot_ceiling(missed) == {"tpot_p90_ratio": None, "split": None, "router": None, "meeting_both": []}


def seed_block(*rows):
    splits = tpot_ratios(list(rows), aggregated=AGGREGATED, same_load=AGGREGATED_AT_LOAD)
    return {"splits": splits, "tpot_ceiling": tpot_ceiling(splits)}


def test_the_summary_judges_each_split_on_its_means_over_the_seeds():
    per_seed = [
        seed_block(row(2, 4, goodput=1.05, tpot=0.009), row(3, 3, goodput=1.6, tpot=0.0100)),
        seed_block(row(2, 4, goodput=1.0, attainment=0.85, tpot=0.008), row(3, 3, goodput=1.5, tpot=0.0106)),
    ]
    figures = tpot_ceiling_summary("long_rag", per_seed)
    # The ceiling is each seed's lowest among the fleets meeting the SLO there: 2 + 4 on seed 1, 3 + 3 on seed 2
    assert figures["pd.long_rag.tpot_p90_ceiling_split"] == ["2 + 4", "3 + 3"]
    assert figures["pd.long_rag.tpot_p90_ratio_ceiling"] == pytest.approx((0.6 + 0.7067) / 2, abs=1e-4)
    # 3 + 3 meets both on its means (1.55x, 0.687x); 2 + 4, short of the SLO on seed 2, has no TPOT mean
    assert figures["pd.long_rag.split_meeting_both"] == "3 + 3"
    table = {r["split"]: r for r in figures["pd.long_rag.oracle_splits"]}
    assert (table["2 + 4"]["tpot_p90_ratio"], table["2 + 4"]["seeds_meeting_slo"]) == (None, 1)
    assert table["3 + 3"]["tpot_p90_ratio"] == pytest.approx((0.0100 + 0.0106) / 2 / 0.015, abs=1e-4)
    # a TPOT 0.73x on the means misses the goal, even where one seed met it
    per_seed[1] = seed_block(row(3, 3, goodput=1.5, tpot=0.0119))
    assert tpot_ceiling_summary("long_rag", per_seed)["pd.long_rag.split_meeting_both"] is None


def test_the_ceiling_loop_simulates_every_split_with_clairvoyant_pairings_at_the_comparison_load(monkeypatch):
    # Given the bench's long-RAG workload on 4 GPUs, its runs recorded
    runs = []
    simulate = pd_bench._simulate

    def recorded(spec, fleet, rate, duration_s, seed):
        runs.append((fleet.prefill_replicas, fleet.replicas, fleet.router, rate))
        return simulate(spec, fleet, rate, duration_s, seed)

    monkeypatch.setattr(pd_bench, "_simulate", recorded)
    spec = pd_bench.WORKLOADS["long_rag"]
    best, rows = pd_bench._ceiling(
        spec, PLAN, 4, routers=("oracle_overlap",), at_rate=3.0, duration_s=6.0, seed=1, steps=1
    )
    # Then every split ran at the comparison's rate with the clairvoyant pairing, beside its own bisection
    at_load = [(p, d, router) for p, d, router, rate in runs if rate == 3.0]
    assert at_load == [(1, 3, "oracle_overlap"), (2, 2, "oracle_overlap"), (3, 1, "oracle_overlap")]
    assert [(r["prefill_replicas"], r["decode_replicas"]) for r in rows] == [(1, 3), (2, 2), (3, 1)]
    assert all({"attainment", "tpot_p90_s"} <= set(r["same_load"]) for r in rows)
    assert best["goodput_per_gpu"] == max(r["goodput_per_gpu"] for r in rows)
