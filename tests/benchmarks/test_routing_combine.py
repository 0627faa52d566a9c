"""``bench routing --opt combine=``: saved ``seeds=`` runs judged together over all their seeds."""

import json
import random

import pytest

from benchmarks.routing import routing
from benchmarks.routing.routing_headline import BASELINES, combine
from benchmarks.routing.routing_suite import interval


def _saved(seeds, rng, *, held_out=True):
    """A ``seeds=`` run's last line as the bench saves it, one workload, random figures per seed."""
    policies = {p: [round(rng.uniform(10, 20), 2) for _ in seeds] for p in (*BASELINES, "infercap", "balanced_fleet")}
    workload = {p: {"slo_throughput": sum(v) / len(v), "per_seed": v} for p, v in policies.items()}
    workload |= {"ceiling_per_seed": policies["balanced_fleet"], "ceiling_source": "balanced_fleet", "unit": "req/s"}
    return {"seeds": list(seeds), "held_out": held_out, "workloads": {"cache_pressure": workload}}


def test_runs_combine_into_the_figures_of_one_run_over_all_their_seeds(tmp_path):
    rng = random.Random(5)
    a, b = _saved([1004, 1005, 1006], rng), _saved([1011, 1012], rng)
    w = combine([a, b])["workloads"]["cache_pressure"]
    both = {p: a["workloads"]["cache_pressure"][p]["per_seed"] + b["workloads"]["cache_pressure"][p]["per_seed"]
            for p in (*BASELINES, "infercap")}  # fmt: skip
    assert w["seeds"] == [1004, 1005, 1006, 1011, 1012]
    best = max(BASELINES, key=lambda p: sum(both[p]))
    assert w["best_baseline"]["name"] == best
    paired = [x - y for x, y in zip(both["infercap"], both[best], strict=True)]
    assert w["paired_diff_vs_best_baseline_ci95"] == interval(paired)
    assert w["infercap"]["slo_throughput"] == round(sum(both["infercap"]) / 5, 2)
    with pytest.raises(ValueError, match="more than one"):
        combine([a, _saved([1006, 1007], rng)])
    # Through the command's option: held-out runs only with --held-out.
    paths = []
    for i, run in enumerate((a, b)):
        paths.append(tmp_path / f"run{i}.json")
        paths[-1].write_text(json.dumps(run))
    option = ",".join(map(str, paths))
    with pytest.raises(ValueError, match="--held-out"):
        routing.run(combine=option, progress=lambda *_: None)
    figures = routing.run(combine=option, held_out=True, progress=lambda *_: None)
    assert figures["seeds"] == w["seeds"] and figures["workloads"]["cache_pressure"] == w
