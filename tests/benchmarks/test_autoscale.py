"""``bench autoscale --quick`` on the shared engine simulator (docs/algorithms.md#autoscaling-evaluation): a plain run
is on the protocol's training seeds and prints its figures under ``training`` (never ``held_out``); the keys it
documents, the time scale, the oracle as a lower bound, tuning that never makes a baseline worse on its history days,
and the comparisons at equal attainment read off each policy's own frontier."""

import json
from io import StringIO

import pytest
from django.core.management import call_command

from benchmarks import protocol
from benchmarks.capacity.autoscale import ROWS, better
from benchmarks.capacity.autoscale_runs import cost_at_attainment

pytestmark = pytest.mark.slow
TIME_SCALE = 24


@pytest.fixture(scope="module")
def figures(tmp_path_factory):
    out = StringIO()
    plot = tmp_path_factory.mktemp("plot") / "frontier.svg"
    # Days of 3,600 s (a real day compressed 24×, cold starts and spikes with it) rather than quick's 10,800: the
    # same code paths and checks at a third of the CPU (50 s against 150 s on two busy cores).
    argv = ["bench", "autoscale", "--quick", "--opt", f"time_scale={TIME_SCALE}", "--plot", str(plot)]
    call_command(*argv, stdout=out, stderr=StringIO())
    figures = json.loads(out.getvalue().strip().splitlines()[-1])
    figures["_svg"] = plot.read_text()
    return figures


def test_a_plain_run_is_on_training_seeds_and_prints_no_held_out_figures(figures):
    assert "held_out" not in figures and figures["seed_set"] == "training"
    assert set(figures["trace_seeds"]) <= set(protocol.SEEDS["autoscale"].training)
    assert not set(figures["trace_seeds"]) & set(protocol.SEEDS["autoscale"].held_out)
    scale = figures["time_scale"]
    # quick compresses the whole world together: the day and its cold starts by the same factor (the option's)
    assert scale["factor"] == TIME_SCALE
    assert scale["day_length_s"] * scale["factor"] == pytest.approx(86_400)
    assert scale["cold_start_s"] == [
        pytest.approx(60 / scale["factor"], abs=0.01),
        pytest.approx(120 / scale["factor"], abs=0.01),
    ]
    assert figures["training"]["day_length_s"] == scale["day_length_s"]


def test_the_last_line_has_every_documented_key(figures):
    block = figures["training"]
    assert block["days"] and all(isinstance(d, str) for d in block["days"])
    assert set(ROWS) <= set(block["policies"])
    for name in ROWS:
        row = block["policies"][name]
        assert isinstance(row["gpu_hours"], float) and row["gpu_hours"] > 0
        assert 0 <= row["slo_attainment"] <= 1 and isinstance(row["flaps"], int)
    for key in ("infercap_vs_oracle", "equal_attainment_method", "at_equal_slo", "spike_blind_reference"):
        assert block[key] is not None, key
    ours, oracle = block["policies"]["infercap"], block["policies"]["oracle"]
    assert block["infercap_vs_oracle"] == pytest.approx(ours["gpu_hours"] / oracle["gpu_hours"], abs=1e-3)
    # the test days are not the history days the policies learnt from, and static peak was sized on history only
    assert not set(block["days"]) & set(figures["setup"]["history_days"])
    assert figures["setup"]["static_sized_on"] == "history days' peak rate"


def test_equal_attainment_reads_each_policys_own_frontier(figures):
    block = figures["training"]
    ours = block["policies"]["infercap"]
    static = cost_at_attainment(block["frontier"]["static"], ours["slo_attainment"])
    if static["reached"]:
        assert block["savings_vs_static"] == pytest.approx(1 - ours["gpu_hours"] / static["gpu_hours"], abs=1e-3)
    best = block["best_baseline_at_equal_slo"]
    if best["policy"] is not None:
        assert block["at_equal_slo"][best["policy"]]["reached"]
        assert best["gpu_hours"] == min(
            e["gpu_hours"]
            for n, e in block["at_equal_slo"].items()
            if e["reached"] and (n != "static" or best["policy"] == "static")
        )
        assert block["advantage_vs_best_baseline"] == pytest.approx(
            1 - ours["gpu_hours"] / best["gpu_hours"], abs=1e-3
        )


def test_the_oracle_is_a_lower_bound(figures):
    policies = figures["training"]["policies"]
    oracle = policies["oracle"]
    for name, row in policies.items():
        if name != "oracle" and row["slo_attainment"] >= oracle["slo_attainment"]:
            assert row["gpu_hours"] >= oracle["gpu_hours"] * 0.98, name  # 2%: the cold starts' draws
    block = figures["training"]
    for point in block["frontier"]["spike_blind_reference"]:
        if point["slo_attainment"] >= oracle["slo_attainment"]:
            assert point["gpu_hours"] >= oracle["gpu_hours"] * 0.98, point
    reference = block["spike_blind_reference"]
    if reference["cheapest_meeting_target"] is not None:
        cheapest = reference["cheapest_meeting_target"]
        assert cheapest["slo_attainment"] >= 0.99
        assert reference["target_within_1_5x_oracle"] == (cheapest["gpu_hours"] <= 1.5 * oracle["gpu_hours"])


def test_tuning_on_history_never_loses_to_the_default(figures):
    for name, tuning in figures["training"]["tuning"].items():
        assert not better(tuning["default"], tuning["tuned"]), name


def test_ours_does_not_flap_and_the_plot_draws_every_frontier(figures):
    block = figures["training"]
    assert block["policies"]["infercap"]["flaps"] == 0
    assert {"static", "hpa_tuned", "kpa_tuned", "scheduled", "infercap", "oracle"} <= set(block["frontier"])
    assert figures["_svg"].startswith("<svg") and figures["_svg"].count("<polyline") >= 6
