"""Automatic benchmark of one replica (pure: no Django): a closed-loop load sweep and the model-unit fit.

1. **Concurrency sweep** with a reference shape: per level the throughput-table row (per-stream tok/s, aggregate
   tok/s, TTFT p50/p95); the SLO-compliant maximum batch B_max is the largest level (refined by bisection) whose
   median per-stream rate meets the TPOT SLO and whose TTFT p95 meets the TTFT SLO.
2. **Shape grid at B_max**: for each (input, output, shared-prefix) shape, the replica's GPU-seconds per request
   in the steady window (window length × GPUs / requests finished in it): at full SLO-compliant load the replica
   is always busy, so that is what one request of that shape really costs.
3. **Fit**: non-negative least squares (relative error) of GPU-seconds per request on (uncached in, cached in,
   out, 1) gives α, α_c, β, γ; divided by ``GPU_SECONDS_PER_MU`` they are model units. The error on held-out shapes
   (never fitted) says how far to trust them; the capacity is the MU/min the replica served at B_max.
4. **LoRA overhead** (when given an adapter driver, whose requests name an adapter as ``model``): paired passes of
   the reference shape at B_max, base model and adapter in turn (ABBA, so a drift cancels); the overhead is the
   ratio of GPU-seconds per request, each over the fit's prediction for the tokens it served, minus one
   (``fit_lora_overhead``).

A ``LoadDriver`` runs one closed loop: ``http_driver.HttpReplicaDriver`` over HTTP against a live
replica (simulated or real vLLM), ``sim_driver.EngineDriver`` against the simulator's engine in
virtual time.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Protocol

from capacity.percentiles import percentile
from capacity.units import GPU_SECONDS_PER_MU

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Shape:
    input_tokens: int
    output_tokens: int
    shared_prefix_tokens: int = 0  # the first tokens of every prompt in a run are identical (prefix-cache hits)

    @property
    def label(self) -> str:
        prefix = f"+{self.shared_prefix_tokens}p" if self.shared_prefix_tokens else ""
        return f"{self.input_tokens}{prefix}/{self.output_tokens}"


@dataclass
class Sample:
    """One finished request, times in replica seconds (drivers undo any simulator speed-up)."""

    start_s: float
    end_s: float
    first_token_s: float | None  # None when the request was not streamed
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    ok: bool = True
    error: str = ""
    # When the replica answered the request's headers (streamed requests over HTTP; vLLM's API server sends them
    # before the request reaches its engine): ``first_token_s - accepted_s`` is the engine's part of the TTFT.
    accepted_s: float | None = None


class LoadDriver(Protocol):
    name: str

    def run(self, shape: Shape, concurrency: int, requests: int, run_id: str) -> list[Sample]:
        """Keep ``concurrency`` requests of ``shape`` in flight until ``requests`` have finished."""
        ...


@dataclass
class LevelStats:
    shape: Shape
    concurrency: int
    requests: int
    failed: int
    window_s: float
    window_requests: int
    gpu_s_per_request: float
    req_per_s: float
    aggregate_tok_s: float
    per_stream_tok_s: float | None
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    mean_uncached_in: float
    mean_cached_in: float
    mean_out: float

    def table_row(self) -> dict:
        return {
            "batch": self.concurrency,
            "per_stream_tok_s": _round(self.per_stream_tok_s),
            "aggregate_tok_s": _round(self.aggregate_tok_s),
            "ttft_p50_s": _round(self.ttft_p50_s, 4),
            "ttft_p95_s": _round(self.ttft_p95_s, 4),
            "req_per_s": _round(self.req_per_s, 3),
        }


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


class BenchmarkError(RuntimeError):
    pass


def summarize(shape: Shape, concurrency: int, samples: list[Sample], *, gpus: int = 1) -> LevelStats:
    """Steady-state figures of one closed-loop run: the first and last ``concurrency`` finishes are ramp-up and
    drain-down (fewer requests in flight), so the window runs from the c-th to the (n−c)-th finish."""
    ok = sorted((s for s in samples if s.ok), key=lambda s: s.end_s)
    failed = len(samples) - len(ok)
    if len(ok) < max(2, len(samples) // 2):
        errors = sorted({s.error for s in samples if not s.ok})[:3]
        raise BenchmarkError(f"{failed} of {len(samples)} requests failed at {shape.label} ×{concurrency}: {errors}")
    n, c = len(ok), concurrency
    if n >= 3 * c and ok[n - c - 1].end_s > ok[c - 1].end_s:
        t_a, t_b = ok[c - 1].end_s, ok[n - c - 1].end_s
        window = ok[c : n - c]
    else:  # too few requests for a steady window: the whole run
        t_a, t_b = min(s.start_s for s in ok), ok[-1].end_s
        window = ok
    span = max(t_b - t_a, 1e-9)
    streams = [
        (s.output_tokens - 1) / (s.end_s - s.first_token_s)
        for s in window
        if s.first_token_s is not None and s.output_tokens > 1 and s.end_s > s.first_token_s
    ]
    ttfts = [s.first_token_s - s.start_s for s in window if s.first_token_s is not None]
    return LevelStats(
        shape=shape,
        concurrency=c,
        requests=len(samples),
        failed=failed,
        window_s=span,
        window_requests=len(window),
        gpu_s_per_request=span * gpus / len(window),
        req_per_s=len(window) / span,
        aggregate_tok_s=sum(s.output_tokens for s in window) / span,
        per_stream_tok_s=statistics.median(streams) if streams else None,
        ttft_p50_s=percentile(ttfts, 50),
        ttft_p95_s=percentile(ttfts, 95),
        mean_uncached_in=statistics.fmean(s.prompt_tokens - s.cached_tokens for s in window),
        mean_cached_in=statistics.fmean(s.cached_tokens for s in window),
        mean_out=statistics.fmean(s.output_tokens for s in window),
    )


# --- Non-negative least squares -----------------------------------------------------------------------------------


def _solve(matrix: list[list[float]], rhs: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when singular."""
    n = len(rhs)
    a = [row[:] + [rhs[i]] for i, row in enumerate(matrix)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-12:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(n):
            if r != col:
                factor = a[r][col] / a[col][col]
                for k in range(col, n + 1):
                    a[r][k] -= factor * a[col][k]
    return [a[i][n] / a[i][i] for i in range(n)]


def nnls(rows: list[list[float]], targets: list[float], weights: list[float] | None = None) -> list[float]:
    """Exact non-negative least squares for a handful of variables: the best unconstrained solution over every
    subset of free variables that comes out non-negative (2^k small solves; k = 4 here)."""
    if not rows:
        raise BenchmarkError("nothing to fit")
    k = len(rows[0])
    w = weights or [1.0] * len(rows)
    # Scale columns to unit RMS so token counts (hundreds) and the intercept (1) condition alike.
    scale = [math.sqrt(sum(r[j] ** 2 for r in rows) / len(rows)) or 1.0 for j in range(k)]
    xs = [[r[j] / scale[j] for j in range(k)] for r in rows]
    best, best_err = [0.0] * k, math.inf
    for size in range(1, k + 1):
        for free in itertools.combinations(range(k), size):
            gram = [[sum(wi * x[i] * x[j] for x, wi in zip(xs, w, strict=True)) for j in free] for i in free]
            rhs = [sum(wi * x[i] * t for x, t, wi in zip(xs, targets, w, strict=True)) for i in free]
            solution = _solve(gram, rhs)
            if solution is None or min(solution) < 0:
                continue
            theta = [0.0] * k
            for index, value in zip(free, solution, strict=True):
                theta[index] = value
            err = sum(
                wi * (sum(t * x for t, x in zip(theta, xrow, strict=True)) - y) ** 2
                for xrow, y, wi in zip(xs, targets, w, strict=True)
            )
            if err < best_err - 1e-15:
                best, best_err = theta, err
    return [best[j] / scale[j] for j in range(k)]


@dataclass
class CostFit:
    """GPU-seconds per uncached input token, cached input token, output token and request."""

    alpha_s: float
    alpha_cached_s: float
    beta_s: float
    gamma_s: float

    def gpu_seconds(self, uncached: float, cached: float, out: float) -> float:
        return self.alpha_s * uncached + self.alpha_cached_s * cached + self.beta_s * out + self.gamma_s

    def in_mu(self) -> dict:
        return {
            "alpha": self.alpha_s / GPU_SECONDS_PER_MU,
            "alpha_cached": self.alpha_cached_s / GPU_SECONDS_PER_MU,
            "beta": self.beta_s / GPU_SECONDS_PER_MU,
            "gamma": self.gamma_s / GPU_SECONDS_PER_MU,
        }


def fit_costs(levels: list[LevelStats]) -> CostFit:
    rows = [[lv.mean_uncached_in, lv.mean_cached_in, lv.mean_out, 1.0] for lv in levels]
    targets = [lv.gpu_s_per_request for lv in levels]
    # Relative error: a 10 ms request and a 2 s request should weigh alike.
    weights = [1.0 / max(t, 1e-12) ** 2 for t in targets]
    alpha, alpha_cached, beta, gamma = nnls(rows, targets, weights)
    return CostFit(alpha, alpha_cached, beta, gamma)


def relative_errors(fit: CostFit, levels: list[LevelStats]) -> list[float]:
    return [
        abs(fit.gpu_seconds(lv.mean_uncached_in, lv.mean_cached_in, lv.mean_out) - lv.gpu_s_per_request)
        / lv.gpu_s_per_request
        for lv in levels
    ]


# --- The sweep ----------------------------------------------------------------------------------------------------

DEFAULT_LEVELS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DEFAULT_REFERENCE = Shape(512, 128)
DEFAULT_FIT_SHAPES = (
    Shape(128, 32),
    Shape(1024, 32),
    Shape(128, 256),
    Shape(1024, 256),
    Shape(1024, 64, shared_prefix_tokens=768),
    Shape(512, 160, shared_prefix_tokens=384),
)
DEFAULT_HELD_OUT = (
    Shape(384, 96),
    Shape(768, 192, shared_prefix_tokens=512),
    Shape(256, 200, shared_prefix_tokens=128),
)


@dataclass
class SweepConfig:
    tpot_slo_ms: float
    ttft_slo_ms: float
    gpus_per_replica: int = 1
    levels: tuple[int, ...] = DEFAULT_LEVELS
    max_concurrency: int = 256
    reference_shape: Shape = DEFAULT_REFERENCE
    fit_shapes: tuple[Shape, ...] = DEFAULT_FIT_SHAPES
    held_out_shapes: tuple[Shape, ...] = DEFAULT_HELD_OUT
    requests_per_stream: int = 3  # closed-loop requests = this × concurrency (≥ 3 for a steady window)
    min_requests: int = 12
    bisect_steps: int = 2
    # Per-shape throughput tables at these multiples of B_max (B_max itself is measured anyway): the shapes ×
    # concurrency grid the planner picks the table nearest its workload from. Empty: no grid (quick sweeps).
    grid_multipliers: tuple[float, ...] = (0.5, 2.0)
    lora_pairs: int = 2  # paired base/adapter passes for the LoRA overhead (only with an adapter driver)

    def __post_init__(self) -> None:
        if self.tpot_slo_ms <= 0 or self.ttft_slo_ms <= 0:
            raise ValueError("SLOs must be positive")
        if self.max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        if self.lora_pairs < 1:
            raise ValueError("lora_pairs must be at least 1")
        if not self.fit_shapes or len(self.fit_shapes) < 4:
            raise ValueError("the fit needs at least 4 shapes for 4 coefficients")

    @property
    def min_stream_tok_s(self) -> float:
        return 1000.0 / self.tpot_slo_ms

    def requests_for(self, concurrency: int) -> int:
        return max(self.min_requests, self.requests_per_stream * concurrency)


def compliant(stats: LevelStats, cfg: SweepConfig) -> bool:
    stream_ok = stats.per_stream_tok_s is None or stats.per_stream_tok_s >= cfg.min_stream_tok_s
    ttft_ok = stats.ttft_p95_s is None or stats.ttft_p95_s * 1000 <= cfg.ttft_slo_ms
    return stream_ok and ttft_ok


def run_sweep(
    driver: LoadDriver,
    cfg: SweepConfig,
    progress: Progress = lambda _msg: None,
    *,
    adapter_driver: LoadDriver | None = None,
) -> dict:
    """The whole benchmark; returns a JSON-able result (table, B_max, fit, held-out error, capacity, and with
    ``adapter_driver`` (the same replica, requests naming an adapter) the LoRA overhead; else that is None)."""
    runs = itertools.count(1)

    def measure(shape: Shape, concurrency: int, *, on: LoadDriver = driver, pair: str = "") -> LevelStats:
        run_id = f"{pair}:run{next(runs)}" if pair else f"run{next(runs)}"
        samples = on.run(shape, concurrency, cfg.requests_for(concurrency), run_id)
        return summarize(shape, concurrency, samples, gpus=cfg.gpus_per_replica)

    sweep, first_bad = _concurrency_sweep(measure, cfg, progress)
    good = [c for c, s in sweep.items() if compliant(s, cfg)]
    if not good:
        return _infeasible(sweep, cfg)
    b_max = _bisect_b_max(measure, sweep, cfg, progress, lo=max(good), hi=first_bad)
    progress(f"B_max = {b_max}; fitting costs on {len(cfg.fit_shapes)} shapes, {len(cfg.held_out_shapes)} held out")
    fit_levels = []
    for shape in cfg.fit_shapes:
        fit_levels.append(measure(shape, b_max))
        progress(f"fit {shape.label} ×{b_max}: {fit_levels[-1].gpu_s_per_request * 1000:.1f} GPU-ms per request")
    fit = fit_costs(fit_levels)
    held_levels = []
    for shape in cfg.held_out_shapes:
        held_levels.append(measure(shape, b_max))
        progress(f"held out {shape.label}: {held_levels[-1].gpu_s_per_request * 1000:.1f} GPU-ms per request")
    tables = _shape_tables(measure, sweep, fit_levels + held_levels, cfg, progress, b_max=b_max)
    capacity = _capacity(fit, sweep[b_max], cfg)
    lora = None
    if adapter_driver is not None:
        lora = _lora_pass(measure, adapter_driver, fit, cfg, progress, b_max=b_max)
    return {
        "feasible": True,
        "driver": driver.name,
        "slo": {"tpot_ms": cfg.tpot_slo_ms, "ttft_ms": cfg.ttft_slo_ms, "min_stream_tok_s": cfg.min_stream_tok_s},
        "throughput_table": [sweep[c].table_row() for c in sorted(sweep)],
        "b_max": b_max,
        "fit": _fit_result(fit, fit_levels, held_levels),
        "mu_per_min": capacity["mu_per_min"],
        "tables": tables,
        "capacity": capacity,
        "lora_overhead": lora,
    }


def _lora_pass(measure, adapter_driver: LoadDriver, fit: CostFit, cfg: SweepConfig, progress: Progress, *, b_max):
    """Paired passes of the reference shape at B_max, base model then adapter, then adapter then base (ABBA). The
    two passes of a pair send the same output lengths (``output_lengths`` seeds on the run id before ``:``) and
    prompts of the same length but other text (no pass warms the other's prefix cache)."""
    pairs = []
    for i in range(cfg.lora_pairs):
        pair = f"lora{i + 1}"
        if i % 2 == 0:
            base = measure(cfg.reference_shape, b_max, pair=pair)
            lora = measure(cfg.reference_shape, b_max, on=adapter_driver, pair=pair)
        else:
            lora = measure(cfg.reference_shape, b_max, on=adapter_driver, pair=pair)
            base = measure(cfg.reference_shape, b_max, pair=pair)
        pairs.append((base, lora))
        progress(
            f"lora pair {i + 1} ×{b_max}: {base.gpu_s_per_request * 1000:.1f} vs "
            f"{lora.gpu_s_per_request * 1000:.1f} GPU-ms per request (base vs adapter)"
        )
    result = fit_lora_overhead(pairs, fit)
    progress(f"lora overhead {100 * result['overhead']:+.1f} % from {result['samples']} adapter requests")
    return {**result, "concurrency": b_max, "shape": cfg.reference_shape.label}


def fit_lora_overhead(pairs: list[tuple[LevelStats, LevelStats]], fit: CostFit) -> dict:
    """The LoRA overhead from paired (base, adapter) passes of one shape and concurrency: the adapter's GPU-seconds
    per request over the base model's, minus one. Each side is first divided by what ``fit`` predicts for the
    tokens it served (equal in a perfect pair; a replica's prefix cache or short answers may make them differ), so
    the ratio is one of cost per unit of work. ``samples``: requests in the adapter passes' steady windows."""
    if not pairs:
        raise BenchmarkError("no LoRA passes to fit")

    def work(lv: LevelStats) -> float:
        predicted = fit.gpu_seconds(lv.mean_uncached_in, lv.mean_cached_in, lv.mean_out)
        return predicted if predicted > 0 else 1.0

    def ratio(chosen: list[tuple[LevelStats, LevelStats]]) -> float:
        base = sum(b.gpu_s_per_request * b.window_requests for b, _ in chosen) / sum(
            work(b) * b.window_requests for b, _ in chosen
        )
        lora = sum(a.gpu_s_per_request * a.window_requests for _, a in chosen) / sum(
            work(a) * a.window_requests for _, a in chosen
        )
        return lora / base

    per_pair = [ratio([pair]) - 1 for pair in pairs]
    return {
        "overhead": ratio(pairs) - 1,
        "samples": sum(a.window_requests for _, a in pairs),
        "base_samples": sum(b.window_requests for b, _ in pairs),
        "pairs": [round(value, 5) for value in per_pair],
        "spread": max(per_pair) - min(per_pair),
    }


def _concurrency_sweep(measure, cfg: SweepConfig, progress: Progress) -> tuple[dict[int, LevelStats], int | None]:
    """The reference shape at rising concurrency until a level misses the SLO: (stats per level, that level)."""
    sweep: dict[int, LevelStats] = {}
    for c in (c for c in cfg.levels if c <= cfg.max_concurrency):
        stats = sweep[c] = measure(cfg.reference_shape, c)
        ok = compliant(stats, cfg)
        progress(
            f"sweep ×{c}: {stats.per_stream_tok_s or 0:.1f} tok/s per stream, {stats.aggregate_tok_s:.0f} aggregate, "
            f"TTFT p95 {1000 * (stats.ttft_p95_s or 0):.0f} ms — {'meets' if ok else 'misses'} the SLO"
        )
        if not ok:
            return sweep, c
    return sweep, None


def _infeasible(sweep: dict[int, LevelStats], cfg: SweepConfig) -> dict:
    best = next(iter(sweep.values()))  # the lowest concurrency measured
    return {
        "feasible": False,
        "explanation": (
            f"No concurrency meets the SLO: even ×{best.concurrency} streams at "
            f"{best.per_stream_tok_s or 0:.1f} tok/s (needs {cfg.min_stream_tok_s:.1f}) with TTFT p95 "
            f"{1000 * (best.ttft_p95_s or 0):.0f} ms (SLO {cfg.ttft_slo_ms:g} ms)."
        ),
        "throughput_table": [s.table_row() for s in sweep.values()],
    }


def _bisect_b_max(
    measure, sweep: dict[int, LevelStats], cfg: SweepConfig, progress: Progress, *, lo: int, hi: int | None
) -> int:
    """Refine B_max between the last compliant level and the first that missed (adding the levels to ``sweep``)."""
    for _ in range(cfg.bisect_steps):
        if hi is None or hi - lo <= max(1, lo // 10):
            break
        mid = (lo + hi) // 2
        stats = sweep[mid] = measure(cfg.reference_shape, mid)
        if compliant(stats, cfg):
            lo = mid
        else:
            hi = mid
        progress(f"bisect ×{mid}: {stats.per_stream_tok_s or 0:.1f} tok/s per stream → B_max in [{lo}, {hi})")
    return lo


def _shape_tables(
    measure, sweep: dict[int, LevelStats], levels: list[LevelStats], cfg: SweepConfig, progress: Progress, *, b_max
) -> dict:
    """Throughput tables per shape: the reference sweep, and each fitted or held-out shape at B_max and at the
    grid's multiples of it (what the planner picks the table nearest its workload from)."""
    tables = {
        cfg.reference_shape.label: {
            "shape": asdict(cfg.reference_shape),
            "rows": [sweep[c].table_row() for c in sorted(sweep)],
        }
    }
    for lv in levels:
        rows = {b_max: lv}
        for multiplier in cfg.grid_multipliers:
            c = max(1, round(b_max * multiplier))
            if c not in rows and c <= cfg.max_concurrency:
                rows[c] = measure(lv.shape, c)
                progress(f"grid {lv.shape.label} ×{c}: {rows[c].per_stream_tok_s or 0:.1f} tok/s per stream")
        tables[lv.shape.label] = {"shape": asdict(lv.shape), "rows": [rows[c].table_row() for c in sorted(rows)]}
    return tables


def _fit_result(fit: CostFit, fit_levels: list[LevelStats], held_levels: list[LevelStats]) -> dict:
    train_err = relative_errors(fit, fit_levels)
    held_err = relative_errors(fit, held_levels) if held_levels else []
    return {
        **fit.in_mu(),
        "gpu_seconds": asdict(fit),
        "output_to_input_ratio": (fit.beta_s / fit.alpha_s) if fit.alpha_s else None,
        "train_relative_error": statistics.fmean(train_err),
        "held_out_relative_error": statistics.fmean(held_err) if held_err else None,
        "held_out_max_relative_error": max(held_err) if held_err else None,
        "shapes": [_shape_row(lv, fit, held=False) for lv in fit_levels]
        + [_shape_row(lv, fit, held=True) for lv in held_levels],
    }


def _capacity(fit: CostFit, at_b_max: LevelStats, cfg: SweepConfig) -> dict:
    """The replica's capacity in MU/min: the fitted cost of the reference request times the rate served at B_max."""
    mu_per_request = fit.gpu_seconds(at_b_max.mean_uncached_in, at_b_max.mean_cached_in, at_b_max.mean_out) / (
        GPU_SECONDS_PER_MU
    )
    return {
        "reference_shape": asdict(cfg.reference_shape),
        "req_per_s": at_b_max.req_per_s,
        "output_tok_s": at_b_max.aggregate_tok_s,
        "mu_per_request": mu_per_request,
        "mu_per_min": at_b_max.req_per_s * 60 * mu_per_request,
    }


def _shape_row(lv: LevelStats, fit: CostFit, *, held: bool) -> dict:
    predicted = fit.gpu_seconds(lv.mean_uncached_in, lv.mean_cached_in, lv.mean_out)
    return {
        "shape": lv.shape.label,
        "held_out": held,
        "uncached_in": round(lv.mean_uncached_in, 1),
        "cached_in": round(lv.mean_cached_in, 1),
        "out": round(lv.mean_out, 1),
        "measured_gpu_ms": round(lv.gpu_s_per_request * 1000, 3),
        "predicted_gpu_ms": round(predicted * 1000, 3),
    }


# --- Prompts shared by the drivers --------------------------------------------------------------------------------

_WORDS = ("data", "node", "gpus", "fast", "slow", "tick", "rack", "warm", "cold", "load", "unit", "page")


def prompt_text(tokens: int, *, prefix_tokens: int, run_id: str, index: int) -> str:
    """A prompt of ``tokens`` 4-character words whose first ``prefix_tokens`` are the same for every request of
    one run (and differ between runs, so one run never warms the next one's cache)."""
    prefix_tokens = min(prefix_tokens, tokens)
    shared = random.Random(f"{run_id}-prefix")
    own = random.Random(f"{run_id}-{index}")
    words = [shared.choice(_WORDS) for _ in range(prefix_tokens)]
    words += [own.choice(_WORDS) for _ in range(tokens - prefix_tokens)]
    return "".join(words)


def output_lengths(shape: Shape, count: int, run_id: str, jitter: float = 0.25) -> list[int]:
    """Output lengths spread ±25 % around the shape's mean, so closed-loop streams do not finish in lockstep. Runs
    ``PAIR:x`` and ``PAIR:y`` draw the same lengths (the LoRA pass's base and adapter runs: their windows then hold
    the same work, and the cost ratio no window noise)."""
    rng = random.Random(f"{run_id.split(':', 1)[0]}-out")
    low, high = max(1, round(shape.output_tokens * (1 - jitter))), round(shape.output_tokens * (1 + jitter))
    lengths = [rng.randint(low, max(low, high)) for _ in range(count)]
    # Re-centre on the exact mean so the shape's output length is what was asked for.
    drift = shape.output_tokens * count - sum(lengths)
    for i in range(abs(drift)):
        j = i % count
        lengths[j] = max(1, lengths[j] + (1 if drift > 0 else -1))
    return lengths


def measure_table(
    driver: LoadDriver, shape: Shape, levels: tuple[int, ...], *, gpus: int = 1, requests_per_stream: int = 3
) -> list[LevelStats]:
    """The throughput table of one shape at every given concurrency (the planner's input), without stopping at
    the SLO: rows beyond B_max show what overloading a replica would cost."""
    rows = []
    for i, c in enumerate(levels):
        samples = driver.run(shape, c, max(12, requests_per_stream * c), f"table-{shape.label}-{i}")
        rows.append(summarize(shape, c, samples, gpus=gpus))
    return rows
