"""The one-real-day mode's knobs: ``tune=2`` continues the full bench's coordinate search from the knobs
``tune=1`` chose (the scale-down knobs only), and the held-out frontier brackets infercap's attainment from both
sides (a baseline's cheapest point above ours overstates what it costs at ours)."""

from benchmarks.capacity import autoscale, autoscale_day
from benchmarks.capacity.autoscale_runs import Spec


class RecordingRunner:
    """Stands in for the simulator (a real day costs about a minute a run): scores a spec by its knobs."""

    def __init__(self, o, days, schedules, progress):
        self.runs: list[Spec] = []
        RecordingRunner.last = self

    def run(self, specs, day_names):
        self.runs += specs
        return {s: {"gpu_hours": 50.0 + len(s.knobs), "slo_attainment": 0.98, "flaps": 0} for s in specs}


def kit():
    return {"runner": RecordingRunner, "tune": autoscale.tune, "grids": autoscale._grids}


def test_tune_2_searches_the_scale_down_knobs_from_the_chosen_target_and_metric():
    out = autoscale_day._tune({"tune": 2}, kit(), type("Day", (), {"name": "weekday-5"}), progress=lambda *_: None)
    runs = RecordingRunner.last.runs
    assert runs[0] == Spec("hpa", autoscale_day.REAL_DAY_TUNED["hpa"]).with_knobs()  # from where tune=1 left it
    searched = {k for spec in runs for k, _ in spec.knobs} - {k for k, _ in autoscale_day.REAL_DAY_TUNED["kpa"]}
    assert {"stable_window_s", "panic_threshold"} <= searched
    for spec in runs:  # target and metric stay where tune=1 chose them
        tuned = dict(autoscale_day.REAL_DAY_TUNED[spec.policy])
        assert all(dict(spec.knobs)[k] == tuned[k] for k in ("metric", "target", "target_utilization") if k in tuned)
    assert out["kpa"]["tuned_knobs"].startswith("kpa(")
    full = autoscale._grids(False)
    assert [k for k, _ in full["hpa"][2:]] == ["scale_down", "stabilization_s"]  # what tune=1 did not search


def test_tune_1_searches_target_and_metric_from_the_defaults():
    autoscale_day._tune({"tune": 1}, kit(), type("Day", (), {"name": "weekday-5"}), progress=lambda *_: None)
    assert RecordingRunner.last.runs[0] == Spec("hpa")


def test_the_held_out_frontier_brackets_ours_from_both_sides():
    o = autoscale.options(False, {"day": "weekday-5"})
    main = {name: autoscale_day._spec(name, o, static_n=12) for name in ("hpa_tuned", "kpa_tuned")}
    frontier = autoscale_day._frontier_specs(main, 12)
    for name, knob in (("hpa_tuned", "target"), ("kpa_tuned", "target_utilization")):
        values = sorted(dict(s.knobs)[knob] for s in frontier[name])
        assert values[0] < 0.5 < values[-1] and 0.5 in values and main[name] in frontier[name]


def test_a_held_out_day_run_draws_its_frontiers(tmp_path, monkeypatch):
    frontier = {
        "infercap": [{"knobs": "infercap", "gpu_hours": 168.7, "slo_attainment": 0.995}],
        "kpa_tuned": [{"knobs": "kpa", "gpu_hours": 179.0, "slo_attainment": 0.992}],
    }
    monkeypatch.setattr(
        autoscale_day, "run_one_day", lambda o, kit, progress, held_out: {"held_out": {"frontier": frontier}}
    )
    path = tmp_path / "frontier.svg"
    autoscale.run(quick=False, plot=str(path), progress=lambda *_: None, held_out=True, day="weekday-5")
    svg = path.read_text()
    assert svg.startswith("<svg") and "Held-out" in svg and "kpa_tuned" in svg
