"""The held-out protocol: seed sets are disjoint, a bench without held-out seeds refuses ``--held-out``, and every
held-out run is appended to the log with its commit, command line and figures."""

import json
import types

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from benchmarks import protocol
from benchmarks.management.commands import bench


def test_held_out_seeds_never_were_training_seeds():
    for name, seeds in protocol.SEEDS.items():
        assert seeds.held_out, name
        assert not set(seeds.held_out) & set(seeds.training), name
        assert protocol.seeds_for(name, held_out=True) == seeds.held_out
        assert all(protocol.is_held_out(name, s) for s in seeds.held_out)
    with pytest.raises(ValueError, match="no seed sets"):
        protocol.seeds_for("no-such-bench", held_out=True)


def test_a_bench_without_held_out_seeds_refuses_to_look(capsys):
    with pytest.raises(CommandError, match="no held-out seeds"):
        call_command("bench", "sim", "--held-out")


def test_a_held_out_run_is_logged_with_its_commit_and_figures(monkeypatch, tmp_path, capsys):
    seen = {}

    def run(*, quick, plot, live, progress, held_out=False, **options):
        seen["held_out"] = held_out
        return {"seeds": list(protocol.seeds_for("routing", held_out=held_out)), "ratio": 1.23}

    suite = types.SimpleNamespace(HELD_OUT=True, SMOKE={}, run=run)
    monkeypatch.setitem(bench.BENCHMARKS, "routing", suite)
    log = tmp_path / "held_out_log.jsonl"
    monkeypatch.setattr(protocol, "HELD_OUT_LOG", log)

    call_command("bench", "routing", "--quick")
    assert seen["held_out"] is False and not log.exists()  # a training run leaves no record

    call_command("bench", "routing", "--quick", "--held-out")
    assert seen["held_out"] is True
    (entry,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert entry["bench"] == "routing" and entry["figures"]["ratio"] == 1.23
    assert entry["figures"]["seeds"] == list(protocol.SEEDS["routing"].held_out) == entry["held_out_seeds"]
    assert len(entry["commit"].split("+")[0]) == 40 and entry["time"].endswith("Z")


def test_a_held_out_run_that_ends_early_is_logged_and_a_partial_one_names_its_seeds(monkeypatch, tmp_path):
    """A held-out run that fails or is stopped may have printed held-out figures on its progress lines: it is a
    look, logged as ending early; a run that used only some held-out seeds logs those."""
    log = tmp_path / "held_out_log.jsonl"
    monkeypatch.setattr(protocol, "HELD_OUT_LOG", log)

    def failing(**_):
        raise RuntimeError("the engine died")

    monkeypatch.setitem(bench.BENCHMARKS, "routing", types.SimpleNamespace(HELD_OUT=True, SMOKE={}, run=failing))
    with pytest.raises(RuntimeError, match="engine died"):
        call_command("bench", "routing", "--quick", "--held-out")
    (entry,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert entry["figures"] == {"ended_early": "RuntimeError"}
    partial = types.SimpleNamespace(HELD_OUT=True, SMOKE={}, run=lambda **_: {"held_out_seeds_used": [1001, 1002]})
    monkeypatch.setitem(bench.BENCHMARKS, "routing", partial)
    call_command("bench", "routing", "--quick", "--held-out")
    assert json.loads(log.read_text().splitlines()[-1])["held_out_seeds"] == [1001, 1002]
