"""Measure a profile (per-stream decode tok/s at a fixed batch) and fit one to a replica's benchmark runs (pure)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from capacity.hardware.profiles import EngineProfile
from capacity.replica_benchmark.sweep import BenchmarkError, nnls
from simulator.engine import Engine, Sequence
from simulator.tokens import block_hashes, count_tokens, filler_text


def decode_tok_s_per_stream(profile: EngineProfile, batch: int, *, prompt: int = 500, output: int = 300) -> float:
    """Per-stream tokens/s while ``batch`` sequences decode together (prefills excluded), by running the engine.

    All sequences are submitted at once; the rate is taken between the step when the last one got its first
    token and the first finish, so it is the steady decode rate of that batch with 500–800 context tokens.
    """
    engine = Engine(profile)
    seqs = []
    for i in range(batch):
        text = filler_text(prompt, seed=f"calibration-{i}")
        seqs.append(engine.add(Sequence(f"c{i}", count_tokens(text), output, block_hashes(text))))
    now = 0.0
    window_start = None
    while True:
        plan = engine.plan(now, 10**9)
        if plan is None:
            break
        if window_start is None and not plan.admitted and all(s.generated > 0 for s in seqs):
            window_start = (now, seqs[0].generated)
        now += plan.duration()
        finished = engine.commit(plan, plan.steps, now)
        if finished and window_start is not None:
            start_s, start_tokens = window_start
            return (seqs[0].generated - start_tokens) / (now - start_s) if now > start_s else 0.0
    raise RuntimeError(f"batch {batch} never reached a steady decode window (max_num_seqs or KV too small?)")


def profile_fit(profile: EngineProfile, batches=(16, 64, 128)) -> dict[int, float]:
    return {b: round(decode_tok_s_per_stream(profile, b), 2) for b in batches}


# --- A profile from a replica's benchmark -------------------------------------------------------------------------


@dataclass(frozen=True)
class MeasuredLevel:
    """One closed-loop run of a replica, ``concurrency`` requests in flight: what a request cost the replica on
    average (``gpu_s_per_request``: busy time × GPUs / requests finished), its mean token
    counts, and ``decode_batch``, the mean number of sequences decoding together (at most the concurrency: a
    request is prefilling, or on its way to or from the client, part of the time)."""

    concurrency: int
    gpu_s_per_request: float
    uncached_in: float
    cached_in: float
    out: float
    decode_batch: float | None = None

    @classmethod
    def of(cls, stats) -> MeasuredLevel:
        """From a ``replica_benchmark.sweep.LevelStats`` (the decode batch taken to be the concurrency)."""
        return cls(
            stats.concurrency, stats.gpu_s_per_request, stats.mean_uncached_in, stats.mean_cached_in, stats.mean_out
        )

    @classmethod
    def from_samples(cls, concurrency: int, samples, *, gpus: int = 1) -> MeasuredLevel:
        """From a run's requests (``replica_benchmark.sweep.Sample``: start, first token, end, token counts), over the
        whole run: ramp-up and drain included, since the measured decode batch accounts for them, and three times
        the requests of ``summarize``'s steady window. Time when no request was in flight (the replica idle between
        one request and the next) is not cost; the decode batch is the time-weighted number of requests between
        their first token and their end while any request was in flight."""
        ok = [s for s in samples if s.ok]
        if not ok:
            raise BenchmarkError("no request of the run succeeded")
        busy = _covered([(s.start_s, s.end_s) for s in ok])
        decoding = sum(max(0.0, s.end_s - s.first_token_s) for s in ok if s.first_token_s is not None)
        n = len(ok)
        return cls(
            concurrency=concurrency,
            gpu_s_per_request=max(busy, 1e-9) * gpus / n,
            uncached_in=sum(s.prompt_tokens - s.cached_tokens for s in ok) / n,
            cached_in=sum(s.cached_tokens for s in ok) / n,
            out=sum(s.output_tokens for s in ok) / n,
            decode_batch=max(1.0, decoding / busy) if busy > 0 and decoding > 0 else None,
        )


def _covered(intervals: list[tuple[float, float]]) -> float:
    """Total length of the union of intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if a > end:
            total, end = total + b - a, b
        elif b > end:
            total, end = total + b - end, b
    return total


STEP_FEATURES = ("prefill_s_per_token", "cached_s_per_token", "overhead_s", "t0_s", "per_seq_s", "per_ctx_token_s")


def step_cost_fit(levels: list[MeasuredLevel], *, gpus: int = 1) -> dict[str, float]:
    """The engine's step constants from a replica's benchmark runs: non-negative least squares (relative error,
    ``replica_benchmark.sweep.nnls``, the MU fit's solver) of each run's cost per request on what the simulator
    charges for it,

        gpu_s / gpus = overhead + uncached / prefill_rate + cached · cached_s
                       + (out − 1) · (t0 / B + per_seq + per_ctx · ctx)

    with B the run's decode batch (its concurrency unless measured) and ctx = in + out / 2 a sequence's mean
    context while it decodes. It is the MU fit
    (α, α_c, β, γ) with β split by batch size and context, so the runs must vary both (several concurrencies, short
    and long prompts). ``cached_s`` is fitted so that it does not bias the rest; the simulator charges nothing for
    a prefix-cache hit."""
    usable = [lv for lv in levels if lv.gpu_s_per_request > 0 and lv.out > 1 and lv.concurrency >= 1]
    if len(usable) < len(STEP_FEATURES):
        raise BenchmarkError(f"a profile fit needs at least {len(STEP_FEATURES)} runs, got {len(usable)}")
    rows, targets = [], []
    for lv in usable:
        context = lv.uncached_in + lv.cached_in + lv.out / 2
        decoded = lv.out - 1  # the first token comes out of the prefill step
        batch = lv.decode_batch or lv.concurrency
        rows.append([lv.uncached_in, lv.cached_in, 1.0, decoded / batch, decoded, decoded * context])
        targets.append(lv.gpu_s_per_request / gpus)
    weights = [1.0 / t**2 for t in targets]  # relative error: a 20 ms request weighs as a 2 s one
    return dict(zip(STEP_FEATURES, nnls(rows, targets, weights), strict=True))


def profile_from_levels(base: EngineProfile, levels: list[MeasuredLevel], **changes) -> EngineProfile:
    """``base`` (its batch and KV limits, block size, output lengths) with the step times ``step_cost_fit`` finds
    in a replica's benchmark runs: what ``bench fidelity`` simulates a real engine with."""
    fit = step_cost_fit(levels, gpus=base.gpus)
    prefill_s_per_token = fit["prefill_s_per_token"] or 1e-9  # a fit that finds prefill free: as good as free
    return base.with_options(
        decode_t0_s=fit["t0_s"],
        decode_per_seq_s=fit["per_seq_s"],
        decode_per_ctx_token_s=fit["per_ctx_token_s"],
        prefill_tokens_per_s=1.0 / prefill_s_per_token,
        prefill_overhead_s=fit["overhead_s"],
        **changes,
    )


REFINED_FIELDS = (
    "decode_t0_s",
    "decode_per_seq_s",
    "decode_per_ctx_token_s",
    "prefill_tokens_per_s",
    "prefill_overhead_s",
    "prefill_per_ctx_token_s",
)
# The fields refined by ``refine_profile`` that ``prefill_fit`` measures directly.
PREFILL_FIELDS = ("prefill_tokens_per_s", "prefill_per_ctx_token_s")


def prefill_fit(probes: Iterable[tuple[int, int, float]], *, token_budget: int) -> dict[str, float]:
    """Prefill's constants from requests sent one at a time to an idle engine: (uncached prompt tokens, cached
    prompt tokens, seconds from the engine taking the request to its first token). Non-negative least squares
    (relative error) of

        t = fixed · chunks + u / prefill_rate + per_ctx · Σ over chunks of u_k · (c_k + u_k / 2)

    the simulator's prefill steps (``EngineProfile.prefill_s``) for u computed tokens after c cached, in chunks of
    at most ``token_budget`` tokens (the engine's ``max_num_batched_tokens``: a longer prompt takes several
    steps), ``fixed`` taking a step's overhead, the decode step it rides on and the first token's way out. Alone on the engine,
    a request's time to its first token is its prefill and nothing else; under load (the sweep) that time also
    holds queueing and the other streams' decode steps, and the API server's per-token work trades against the
    prefill rate and attention's term in ``refine_profile`` (full runs found rates of 17-122 k tok/s), so these
    two are measured here and held while the rest is refined (docs/algorithms.md, "Calibration against real
    vLLM"). The probes must vary u and c: cold prompts of several lengths and prompts behind a cached prefix."""
    by_shape: dict[tuple[int, int], list[float]] = {}
    for uncached, cached, seconds in probes:
        if seconds > 0 and uncached > 0:
            by_shape.setdefault((uncached, cached), []).append(seconds)
    if len(by_shape) < 3:
        raise BenchmarkError(f"a prefill fit needs probes of at least three shapes, got {len(by_shape)}")
    rows, targets = [], []
    for (uncached, cached), times in sorted(by_shape.items()):
        chunks, attended, done = 0, 0.0, cached
        while done < cached + uncached:
            take = min(token_budget, cached + uncached - done)
            chunks, attended, done = chunks + 1, attended + take * (done + take / 2), done + take
        rows.append([float(chunks), float(uncached), attended])
        targets.append(statistics.median(times))  # one request a neighbour stalled cannot drag the fit
    fixed, per_token, per_ctx = nnls(rows, targets, [1.0 / t**2 for t in targets])
    return {
        "fixed_s": fixed,
        "prefill_tokens_per_s": 1.0 / max(per_token, 1e-9),  # prefill found free: as good as free
        "prefill_per_ctx_token_s": per_ctx,
    }


def with_probed_overhead(profile: EngineProfile, fixed_s: float, *, per_token_s: float = 0.0) -> EngineProfile:
    """``profile`` with the prefill step's overhead that makes a prompt alone on an idle engine take the time the
    prefill probes measured: ``prefill_fit``'s fixed part (``fixed_s``) is, in the simulator, that overhead, the
    decode step the prefill rides on (``decode_t0_s``: nothing else runs) and the first token's way through the
    API server (``per_token_s``, ``ApiServerCost``). Refined from a start near 0 instead, the overhead stayed near
    0 and the simulator prefilled a lone prompt 4-5 ms faster than the probes measured it (docs/experiments/
    simulator.md, 2026-12-06 night)."""
    return profile.with_options(prefill_overhead_s=max(0.0, fixed_s - profile.decode_t0_s - per_token_s))


def refine_profile(
    profile: EngineProfile,
    targets: list[dict[str, float | None]],
    simulate: Callable[[EngineProfile, dict[str, float], int], dict[str, float | None]],
    *,
    extras: dict[str, tuple[float, float]] | None = None,
    max_evaluations: int = 120,
    trim: float = 0.0,
    held: Collection[str] = (),
) -> tuple[EngineProfile, dict[str, float], float]:
    """``profile``'s step times adjusted until the simulator reproduces measured runs: the closed form of
    ``step_cost_fit`` leaves a few per cent of bias (prefill steps stretch the decode batch, chunks share their
    overhead), so the fit's profile is the start of a Nelder-Mead search, in log space, for the step times that
    minimise the mean squared log-ratio between ``simulate(profile, extras, i)`` and ``targets[i]`` over every
    figure both have (throughput, TTFT, TPOT). ``extras`` are further positive parameters of ``simulate`` that
    are not the engine's (name → (start, scale)), searched alike; ``held`` names fields of ``REFINED_FIELDS``
    kept at the profile's values (measured elsewhere: ``prefill_fit``). ``trim`` drops that fraction of the
    largest squared log-ratios from the mean (least trimmed squares): a measurement the engine's host distorted
    (a stream its API server held back and then sent at once) then cannot drag the fit. Deterministic; returns
    the profile, the extras and the root-mean-square log error (over the terms kept)."""
    if not 0 <= trim < 1:
        raise ValueError("trim must be in [0, 1)")
    if unknown := set(held) - set(REFINED_FIELDS):
        raise ValueError(f"held fields must be refined fields, not {sorted(unknown)}")
    extras = extras or {}
    t0 = profile.decode_t0_s
    # A scale per parameter, so that one the fit found to be 0 can still grow: for the step's parts, 1 % of its
    # fixed cost. Attention's prefill term: a 1,000-token chunk over 1,000 tokens of context at a fixed cost's 1 %.
    floors = {
        "decode_t0_s": 1e-4,
        "decode_per_seq_s": 0.01 * t0,
        "decode_per_ctx_token_s": 1e-5 * t0,
        "prefill_tokens_per_s": 1.0,
        "prefill_overhead_s": 0.01 * t0,
        "prefill_per_ctx_token_s": 1e-8 * t0,
    }
    searched = [f for f in REFINED_FIELDS if f not in held]
    names = searched + list(extras)
    start = [getattr(profile, f) for f in searched] + [value for value, _ in extras.values()]
    scales = [max(value, floors[f]) for value, f in zip(start, searched, strict=False)]
    scales += [scale for _, scale in extras.values()]

    def decode(z: list[float]) -> tuple[EngineProfile, dict[str, float]]:
        values = {n: s * math.exp(min(max(v, -6.0), 6.0)) for n, s, v in zip(names, scales, z, strict=True)}
        fields = {n: values[n] for n in searched}
        return profile.with_options(**fields), {n: values[n] for n in extras}

    def loss(z: list[float]) -> float:
        trial, trial_extras = decode(z)
        terms = []
        for i, target in enumerate(targets):
            predicted = simulate(trial, trial_extras, i)
            for key, measured in target.items():
                value = predicted.get(key)
                if measured and value and measured > 0 and value > 0:
                    terms.append(math.log(value / measured) ** 2)
        kept = sorted(terms)[: len(terms) - int(trim * len(terms))]
        return sum(kept) / len(kept) if kept else math.inf

    z0 = [math.log(v / s) if v > 0 else 0.0 for v, s in zip(start, scales, strict=True)]
    best, best_loss = _nelder_mead(loss, z0, step=0.25, max_evaluations=max_evaluations)
    refined, refined_extras = decode(best)
    return refined, refined_extras, math.sqrt(best_loss)


def _nelder_mead(f, x0: list[float], *, step: float, max_evaluations: int) -> tuple[list[float], float]:
    """Minimise ``f`` from ``x0`` (the textbook reflect / expand / contract / shrink simplex)."""
    n = len(x0)
    simplex = [list(x0)] + [[x + (step if i == j else 0.0) for j, x in enumerate(x0)] for i in range(n)]
    values = [f(x) for x in simplex]
    evaluations = n + 1
    while evaluations < max_evaluations:
        order = sorted(range(n + 1), key=values.__getitem__)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if values[-1] - values[0] < 1e-6:
            break
        centroid = [sum(p[j] for p in simplex[:-1]) / n for j in range(n)]
        worst = simplex[-1]

        def towards(t: float, worst=worst, centroid=centroid) -> list[float]:
            return [c + t * (w - c) for c, w in zip(centroid, worst, strict=True)]

        reflected = towards(-1.0)
        fr = f(reflected)
        evaluations += 1
        if fr < values[0]:
            expanded = towards(-2.0)
            fe = f(expanded)
            evaluations += 1
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = towards(0.5)
            fc = f(contracted)
            evaluations += 1
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:  # shrink towards the best
                for i in range(1, n + 1):
                    simplex[i] = [b + 0.5 * (x - b) for b, x in zip(simplex[0], simplex[i], strict=True)]
                    values[i] = f(simplex[i])
                evaluations += n
    best = min(range(n + 1), key=values.__getitem__)
    return simplex[best], values[best]
