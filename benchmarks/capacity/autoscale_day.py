"""``bench autoscale --opt day=NAME``: one real-length (24 h) test day of one training seed, end to end.

The full bench tunes every policy on history days and sweeps frontiers over all six training seeds, far more than a
shared machine runs in an hour; this mode answers the narrower question the policies are changed on: on one day of
real length, what infercap (at ``--opt target_utilization``, 0.75 by default: the pick on training seed 1's real
day) attains and spends against the oracle (concurrency 128 at utilization 0.9, the cheapest grid
point meeting the target on the days looked at so far), and where its misses fall: by hour of the day, TTFT or TPOT,
after waiting at the proxy (its replicas' concurrency slots full) or not, and rejected. Training seeds only (the
protocol's held-out seeds are never run here); progress lines every simulated hour. ``--opt day=weekday-5 --opt seeds=2`` (full mode: 5 history days before it).
"""

import time

from django.core.management.base import CommandError

from benchmarks import protocol
from benchmarks.capacity import autoscale_runs as runs
from benchmarks.capacity.autoscale_runs import SLO_TARGET, Spec
from capacity.hardware.profiles import get_profile

ORACLE = Spec("oracle", (("concurrency", 128), ("utilization", 0.9)))


def run_one_day(o: dict, build_days, progress, *, held_out: bool = False) -> dict:
    """Infercap and the oracle over ``o["day"]`` of ``o["seeds"]``'s one training seed."""
    if held_out:
        raise CommandError("--opt day= runs one training day; --held-out runs the whole bench")
    seeds = [int(x) for x in (o["seeds"] or "1").split(",") if x.strip()]
    training = protocol.seeds_for("autoscale", held_out=False)
    if len(seeds) != 1 or seeds[0] not in training:
        raise CommandError(f"--opt day= runs one training seed (--opt seeds=N, N in {training})")
    seed = seeds[0]
    started = time.perf_counter()
    days, _, test_days, _ = build_days({**o, "trace_seed": seed}, prefix=f"{seed}:")
    key = f"{seed}:{o['day']}"
    if key not in days:
        names = ", ".join(d.name for d in test_days)
        raise CommandError(f"seed {seed} has no day {o['day']!r}; its test days: {names}")
    day = days[key]
    progress(
        f"seed {seed}, {o['day']}: {len(day.requests)} requests over {day.period_s:.0f} s, "
        f"spikes at {', '.join(f'{a / 3600:.2f} h' for a, _ in day.spikes) or 'none'}"
    )
    ours = Spec("infercap", (("target_utilization", o["target_utilization"]),))
    rows = {}
    for name, spec in (("infercap", ours), ("oracle", ORACLE)):
        progress(f"{spec.label()}: simulating")
        row = runs.run_day(
            spec,
            day,
            profile=get_profile(runs.PROFILE),
            max_replicas=o["max_replicas"],
            context={},
            progress=lambda t, spec=spec: progress(f"  {spec.label()}: {t / 3600:.0f} h simulated"),
            detail=name == "infercap",
        )
        rows[name] = _row(row)
        progress(
            f"  {spec.label()}: {rows[name]['gpu_hours']:.2f} GPU-h, SLO {rows[name]['slo_attainment']:.4f}, "
            f"{row['flaps']} flaps ({row['wall_s']} s)"
        )
    ratio = rows["infercap"]["gpu_hours"] / rows["oracle"]["gpu_hours"]
    return {
        "one_day": {
            "seed": seed,
            "day": o["day"],
            "day_length_s": day.period_s,
            "time_scale": o["time_scale"],
            "requests": len(day.requests),
            "spikes_s": [[round(a, 1), round(b, 1)] for a, b in day.spikes],
            "policies": rows,
            "gpu_hours_vs_oracle": round(ratio, 3),
            "goal_met": rows["infercap"]["slo_attainment"] >= SLO_TARGET
            and ratio <= 1.5
            and rows["infercap"]["flaps"] == 0,
        },
        "wall_s": round(time.perf_counter() - started, 1),
    }


def _row(row: dict) -> dict:
    out = {
        "spec": row["spec"],
        "gpu_hours": round(row["gpu_hours"], 3),
        "slo_attainment": round(row["good"] / max(1, row["requests"]), 5),
        "slo_attainment_outside_spikes": round(row["good_calm"] / max(1, row["requests_calm"]), 5),
        "rejected": row["rejected"],
        "flaps": row["flaps"],
        "peak_replicas": row["peak_replicas"],
    }
    if "misses_by_hour" in row:
        out["misses_by_hour"] = row["misses_by_hour"]
    return out
