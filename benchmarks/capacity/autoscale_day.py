"""``bench autoscale --opt day=NAME``: one real-length (24 h) test day per seed, end to end.

The full bench tunes every policy on history days and sweeps frontiers over all six training seeds, far more than a
shared machine runs in an hour. This mode runs one named test day of each seed at real length
(docs/algorithms.md#autoscaling-evaluation, "One real-length day"):

- on a training seed (``--opt seeds=N``): infercap (at ``--opt target_utilization``, 0.75 by default: the pick on
  training seed 1's real day) and the oracle, and where infercap's misses fall (by hour of the day, TTFT or TPOT,
  after waiting at the proxy or not, rejected): what the policies are changed on. ``--opt policies=`` picks rows;
  ``--opt tune=1`` runs the baselines' coordinate search on that training day over target and metric and prints
  the knobs it picks, ``--opt tune=2`` its remaining (scale-down) knobs from there (together: ``REAL_DAY_TUNED``);
- with ``--held-out``: the day of every held-out seed (2001-2003), the rows of ``--opt policies`` (all by default)
  with the knobs fixed before the look (infercap's target utilization and the baselines' ``REAL_DAY_TUNED``, both
  chosen on training seed 1's real day; static sized on the held-out seeds' history days), summed over the seeds,
  compared at equal attainment on each policy's frontier (``--opt frontier=1`` adds the frontier points, static's
  first, until ``--opt budget_s`` wall seconds have passed), under ``held_out``; the command logs the look
  (benchmarks/protocol.py).
"""

import time

from django.core.management.base import CommandError

from benchmarks import protocol
from benchmarks.capacity import autoscale_runs as runs
from benchmarks.capacity.autoscale_runs import SLO_TARGET, Spec
from capacity.hardware.profiles import get_profile

ORACLE = Spec("oracle", (("concurrency", 128), ("utilization", 0.9)))
POLICIES = ("infercap", "oracle", "static", "hpa_tuned", "kpa_tuned", "scheduled", "infercap_reactive")
BASELINES = ("hpa_tuned", "kpa_tuned", "scheduled")
# The baselines' knobs at real length: the full bench's coordinate search (autoscale._grids, full mode) run on training
# seed 1's weekday-5, the day infercap's target utilization 0.75 was picked on (docs/experiments/autoscaling.md,
# "real-length held-out days"). Target and metric first (``--opt tune=1``; GPU-hours / SLO attainment): HPA-like
# default 57.13 / 0.97161, target 0.5 64.67 / 0.98811, 0.9 53.35 / 0.88122, in flight at 0.5 63.87 / 0.98804 (kept:
# within half a point, cheaper); KPA-like default 56.10 / 0.90942, target utilization 0.5 61.95 / 0.98675, 0.9 52.69 /
# 0.75308, in flight at 0.5 61.51 / 0.98671 (kept). Then the scale-down knobs from there (``--opt tune=2``): HPA-like
# at 20 % per 60 s 88.77 / 0.99440, and with a 120 s stabilization window 87.54 / 0.99289 (kept: both meet 99 %, it is
# cheaper); KPA-like with a 180 s stable window 62.32 / 0.98174, panic threshold 1.5 64.12 / 0.98571 (neither kept).
REAL_DAY_TUNED = {
    "hpa": (
        ("metric", "in_flight"),
        ("scale_down_percent", 20.0),
        ("scale_down_period_s", 60.0),
        ("stabilization_s", 120.0),
        ("target", 0.5),
    ),
    "kpa": (("metric", "in_flight"), ("target_utilization", 0.5)),
}
TUNED_ON = "training seed 1, weekday-5 (24 h): the baselines' coordinate search and infercap's target utilization"


def run_one_day(o: dict, kit: dict, progress, *, held_out: bool = False) -> dict:
    """``o["day"]`` of the training seed of ``--opt seeds`` (or, held out, of every held-out seed)."""
    if held_out:
        return _held_out(o, kit, progress)
    seeds = [int(x) for x in (o["seeds"] or "1").split(",") if x.strip()]
    training = protocol.seeds_for("autoscale", held_out=False)
    if len(seeds) != 1 or seeds[0] not in training:
        raise CommandError(f"--opt day= runs one training seed (--opt seeds=N, N in {training}) or --held-out")
    seed = seeds[0]
    started = time.perf_counter()
    day = _day(o, kit, seed, progress)[0]
    if o["tune"]:
        return {"tuning": _tune(o, kit, day, progress), "wall_s": round(time.perf_counter() - started, 1)}
    rows = {}
    for name in _policies(o, default="infercap,oracle"):
        if name not in ("infercap", "oracle", "infercap_reactive"):
            raise CommandError("a training day runs infercap, infercap_reactive and the oracle")
        row = _run(name, _spec(name, o), day, o, progress, detail=name == "infercap")
        rows[name] = _row(row)
    ratio = (
        rows["infercap"]["gpu_hours"] / rows["oracle"]["gpu_hours"] if {"infercap", "oracle"} <= set(rows) else None
    )
    return {
        "one_day": {
            "seed": seed,
            "day": o["day"],
            "day_length_s": day.period_s,
            "time_scale": o["time_scale"],
            "requests": len(day.requests),
            "spikes_s": [[round(a, 1), round(b, 1)] for a, b in day.spikes],
            "policies": rows,
            "gpu_hours_vs_oracle": None if ratio is None else round(ratio, 3),
            "goal_met": ratio is not None
            and rows["infercap"]["slo_attainment"] >= SLO_TARGET
            and ratio <= 1.5
            and rows["infercap"]["flaps"] == 0,
        },
        "wall_s": round(time.perf_counter() - started, 1),
    }


def _policies(o: dict, *, default: str) -> list[str]:
    names = [n.strip() for n in (o["policies"] or default).split(",") if n.strip()]
    unknown = [n for n in names if n not in POLICIES]
    if unknown:
        raise CommandError(f"--opt policies: unknown {unknown}; known: {', '.join(POLICIES)}")
    return names


def _day(o: dict, kit: dict, seed: int, progress):
    """The named test day of ``seed`` and that seed's history days (for static's size and the cron schedule)."""
    days, history, test_days, hist_requests = kit["build_days"]({**o, "trace_seed": seed}, prefix=f"{seed}:")
    key = f"{seed}:{o['day']}"
    if key not in days:
        names = ", ".join(d.name for d in test_days)
        raise CommandError(f"seed {seed} has no day {o['day']!r}; its test days: {names}")
    day = days[key]
    progress(
        f"seed {seed}, {o['day']}: {len(day.requests)} requests over {day.period_s:.0f} s, "
        f"spikes at {', '.join(f'{a / 3600:.2f} h' for a, _ in day.spikes) or 'none'}"
    )
    return day, history, hist_requests


def _spec(name: str, o: dict, *, static_n: int = 0) -> Spec:
    ours = Spec("infercap", _ours_knobs(o))
    if name == "infercap":
        return ours
    if name == "infercap_reactive":
        return Spec("infercap_reactive", ours.knobs)
    if name == "oracle":
        return ORACLE
    if name == "static":
        return Spec("static", (("replicas", static_n),))
    if name == "hpa_tuned":
        return _tuned("hpa")
    if name == "kpa_tuned":
        return _tuned("kpa")
    return Spec("scheduled", (("reactive", REAL_DAY_TUNED["hpa"]), ("statistic", "median")))


def _tuned(name: str) -> Spec:
    return Spec(name, REAL_DAY_TUNED[name])


def _ours_knobs(o: dict) -> tuple:
    knobs = {"target_utilization": o["target_utilization"]}
    if o["onset"] == "off":
        knobs["onset"] = False
    elif o["onset_max_growth"] != 2.0:
        knobs["onset_max_growth"] = o["onset_max_growth"]
    if o["vertical_sample"]:
        knobs["vertical_sample"] = o["vertical_sample"]
    return tuple(sorted(knobs.items()))


def _run(name: str, spec: Spec, day, o: dict, progress, *, context=None, detail: bool = False) -> dict:
    progress(f"{spec.label()} on {day.name}: simulating")
    row = runs.run_day(
        spec,
        day,
        profile=get_profile(runs.PROFILE),
        max_replicas=o["max_replicas"],
        context=context or {},
        progress=lambda t: progress(f"  {spec.label()}: {t / 3600:.0f} h simulated"),
        detail=detail,
    )
    progress(
        f"  {spec.label()} on {day.name}: {row['gpu_hours']:.2f} GPU-h, SLO {row['good'] / max(1, row['requests']):.4f}"
        f", {row['flaps']} flaps ({row['wall_s']} s)"
    )
    return row


def _tune(o: dict, kit: dict, day, progress) -> dict:
    """The full bench's coordinate search for HPA-like and KPA-like on this one training day. ``tune=1``: over their
    first two knobs (target and metric) from the defaults; ``tune=2``: the search's remaining knobs (how fast and
    after how long they scale down) from where the first two left it, ``REAL_DAY_TUNED``."""
    runner = kit["runner"]({**o, "jobs": 1}, {day.name: day}, {}, progress)
    grids = kit["grids"](False)
    out = {}
    for name in ("hpa", "kpa"):
        start, grid = (Spec(name), grids[name][:2]) if o["tune"] == 1 else (_tuned(name), grids[name][2:])
        best, best_row, tried = kit["tune"](runner, start, grid, [day.name])
        out[name] = {"tuned_knobs": best.label(), "knobs": list(best.knobs), "tuned": best_row, "tried": tried}
        progress(f"{name} tuned on {day.name}: {best.label()}")
    return out


def _row(row: dict) -> dict:
    out = {
        "spec": row["spec"],
        "requests": row["requests"],
        "gpu_hours": round(row["gpu_hours"], 3),
        "slo_attainment": round(row["good"] / max(1, row["requests"]), 5),
        "slo_attainment_outside_spikes": round(row["good_calm"] / max(1, row["requests_calm"]), 5),
        "rejected": row["rejected"],
        "flaps": row["flaps"],
        "peak_replicas": row["peak_replicas"],
        "reasons": row["reasons"],  # how often each kind of reason moved the replica count
    }
    if "misses_by_hour" in row:
        out["misses_by_hour"] = row["misses_by_hour"]
    return out


def _held_out(o: dict, kit: dict, progress) -> dict:
    """The named day of every held-out seed: each row of ``--opt policies`` over the three days, then (``--opt
    frontier=1``) each policy's frontier points, compared at equal attainment (``runs.EQUAL_ATTAINMENT_METHOD``)."""
    if o["seeds"] or o["tune"]:
        raise CommandError("--held-out runs every held-out seed with knobs fixed beforehand; drop seeds and tune")
    started = time.perf_counter()
    seeds = protocol.seeds_for("autoscale", held_out=True)
    names = _policies(o, default=",".join(POLICIES))
    days, history, schedules = {}, [], {}
    for seed in seeds:
        day, seed_history, hist_requests = _day(o, kit, seed, progress)
        days[seed], history = day, history + list(seed_history)
        schedules[seed] = kit["schedules"](o, hist_requests)
    profile = get_profile(runs.PROFILE)
    # Sized on the history days' peak (what an operator provisioning for the peak knows), never on the test days.
    static_n = min(o["max_replicas"], runs.static_replicas(history, profile=profile))
    progress(f"static peak (held-out seeds' history days) = {static_n} replicas; rows: {', '.join(names)}")
    context = {"schedules": schedules}
    cache: dict = {}

    def over_days(spec: Spec) -> dict:
        for seed in seeds:
            if (spec, seed) not in cache:
                cache[(spec, seed)] = _run(spec.policy, spec, days[seed], o, progress, context=context)
        return kit["aggregate"]([cache[(spec, seed)] for seed in seeds])

    main = {name: _spec(name, o, static_n=static_n) for name in names}
    policies = {name: dict(over_days(spec), knobs=spec.label()) for name, spec in main.items()}
    frontier_specs = _frontier_specs(main, static_n) if o["frontier"] else {name: [s] for name, s in main.items()}
    frontier, skipped = {name: [] for name in frontier_specs}, []
    # Frontier points in order of use (static's first: savings at equal attainment), while the wall budget lasts.
    for name, spec in sorted(
        dict.fromkeys((n, s) for n, specs in frontier_specs.items() for s in specs), key=_frontier_order
    ):
        if spec not in main.values() and o["budget_s"] and time.perf_counter() - started > o["budget_s"]:
            skipped.append(spec.label())
            continue
        frontier[name].append({"knobs": spec.label(), **_point(over_days(spec))})
    frontier = {name: sorted(points, key=lambda p: p["gpu_hours"]) for name, points in frontier.items()}
    summary = _compare(policies, frontier)
    summary.update(
        policies=policies,
        per_seed={
            name: {str(seed): _row(cache[(spec, seed)]) for seed in seeds if (spec, seed) in cache}
            for name, spec in main.items()
        },
        days=[days[seed].name for seed in seeds],
        seeds=list(seeds),
        day_length_s=o["period_s"],
        time_scale=o["time_scale"],
        knobs_chosen_on=TUNED_ON,
        static_replicas=static_n,
        static_sized_on="the held-out seeds' history days' peak rate",
        not_run=[name for name in POLICIES if name not in names],
        frontier_skipped=skipped,  # frontier points left out when the wall budget (--opt budget_s) ran out
    )
    return {
        "held_out": summary,
        "seed_set": "held_out",
        "trace_seeds": list(seeds),
        "wall_s": round(time.perf_counter() - started, 1),
    }


def _point(row: dict) -> dict:
    return {"gpu_hours": row["gpu_hours"], "slo_attainment": row["slo_attainment"]}


FRONTIER_ORDER = ("static", "kpa_tuned", "hpa_tuned", "scheduled", "infercap")


def _frontier_order(item: tuple) -> int:
    """Static's points first, then the baselines', then ours' (what the equal-attainment figures need most)."""
    return FRONTIER_ORDER.index(item[0]) if item[0] in FRONTIER_ORDER else len(FRONTIER_ORDER)


def _frontier_specs(main: dict, static_n: int) -> dict:
    """Each run policy's frontier: its row and its main knob moved (static: 0.25-0.75 of the peak size)."""
    out = {name: [spec] for name, spec in main.items()}
    if "static" in main:
        # Down to a quarter: the held-out look of 2026-12-06 swept 0.5-1.0 and all three met the SLO fully, so the
        # comparison could only take the cheapest point above ours (docs/experiments/autoscaling.md).
        sizes = (0.25, 0.375, 0.5, 0.75, 1.0)
        out["static"] = [main["static"].with_knobs(replicas=max(1, round(static_n * f))) for f in sizes]
    for name, knob in (("hpa_tuned", "target"), ("kpa_tuned", "target_utilization")):
        if name in main:  # tuned at 0.5: more and less headroom, to bracket ours' attainment from both sides
            out[name] = [main[name], *(main[name].with_knobs(**{knob: v}) for v in (0.4, 0.6, 0.7))]
    if "infercap" in main:
        out["infercap"] = [main["infercap"], main["infercap"].with_knobs(target_utilization=0.6)]
    return out


def _compare(policies: dict, frontier: dict) -> dict:
    """The held-out figures: infercap against the oracle, and at equal attainment against each run baseline's
    frontier and static's (each interpolated to infercap's attainment; a policy not run is left out, and said)."""
    ours, oracle, static = policies.get("infercap"), policies.get("oracle"), policies.get("static")
    if ours is None:
        return {"equal_attainment_method": runs.EQUAL_ATTAINMENT_METHOD}
    target = ours["slo_attainment"]
    equal = {
        name: runs.cost_at_attainment(frontier[name], target) for name in (*BASELINES, "static") if name in frontier
    }
    reaching = [n for n in BASELINES if n in equal and equal[n]["reached"]]
    best_name = min(reaching, key=lambda n: equal[n]["gpu_hours"]) if reaching else None
    best_h = equal[best_name]["gpu_hours"] if best_name else None
    static_h = equal["static"]["gpu_hours"] if "static" in equal else None
    oracle_h = oracle["gpu_hours"] if oracle else None
    advantage = round(1 - ours["gpu_hours"] / best_h, 4) if best_h else None
    savings = round(1 - ours["gpu_hours"] / static_h, 4) if static_h else None
    return {
        "infercap_vs_oracle": round(ours["gpu_hours"] / oracle_h, 3) if oracle_h else None,
        "savings_vs_static": savings,
        "savings_vs_static_peak_row": (
            {
                "savings": round(1 - ours["gpu_hours"] / static["gpu_hours"], 4),
                "static_slo_attainment": static["slo_attainment"],
            }
            if static
            else None
        ),
        "advantage_vs_best_baseline": advantage,
        "best_baseline_at_equal_slo": {"policy": best_name, "gpu_hours": best_h, "slo_attainment": target},
        "at_equal_slo": {name: _brief(e) for name, e in equal.items()},
        "equal_attainment_method": runs.EQUAL_ATTAINMENT_METHOD,
        "ceilings": {
            "advantage_vs_best_baseline": round(1 - oracle_h / best_h, 4) if best_h and oracle_h else None,
            "savings_vs_static": round(1 - oracle_h / static_h, 4) if static_h and oracle_h else None,
        },
        "ratios_to_oracle": (
            {name: round(row["gpu_hours"] / oracle_h, 3) for name, row in policies.items()} if oracle_h else {}
        ),
        "goals": {
            "slo_ge_99pct": target >= SLO_TARGET,
            "le_1_5x_oracle": oracle_h is not None and ours["gpu_hours"] <= 1.5 * oracle_h,
            "ge_25pct_fewer_than_best_baseline_at_equal_slo": advantage is not None and advantage >= 0.25,
            "ge_70pct_saved_vs_static_at_equal_slo": savings is not None and savings >= 0.70,
            "no_flaps": ours["flaps"] == 0,
        },
        "frontier": frontier,
    }


def _brief(equal: dict) -> dict:
    out = {k: v for k, v in equal.items() if k not in ("between", "best_point")}
    if "between" in equal:
        out["between"] = [p["knobs"] for p in equal["between"]]
    if equal.get("best_point"):
        out["best_point"] = equal["best_point"]
    return out
