"""Prefill/decode disaggregation planning (pure: no Django): two pools against the best aggregated fleet.

docs/disaggregation.md#planning describes the model. In short, for a workload (λ, prompt length mean and spread,
output length) and an SLO (TTFT at a percentile, TPOT):

* **Prefill pool** (P replicas): each prompt is a job of ``S(p) = ⌈p/chunk⌉·overhead + p/rate`` seconds; the pool
  is an M/G/c queue (the proxy sends each prompt to the replica with the least pending prefill), its wait at the
  percentile from the Allen-Cunneen approximation (Erlang C scaled by ``(1 + c_s²)/2``, an exponential tail), so
  a pool of long, uneven prompts queues more than mean throughput says. TTFT = wait + ``S(p_q)`` + the KV
  transfer of ``p_q`` + the decode replica's first step.
* **KV transfer**: ``kv_bytes_per_token · p / link bandwidth``, stretched by ``1/(1 − ρ_link)`` for the transfers
  sharing a prefill replica's link (processor sharing), ρ_link = the link's utilisation; ρ_link ≥ 1 cannot work.
* **Decode pool** (D replicas): the three barriers (``barriers.plan``) over a throughput table computed from the step
  model at the workload's mean context, the SLO's per-stream rate raised by ``tpot_margin`` for the batch's swings.
* **Aggregated** (N replicas doing both): a replica's decode steps carry the prefill chunks of the prompts it takes
  (chunked prefill), so with ρ_p = (λ/N)·E[S] of its time spent on prompts its mean TPOT is
  ``t0 / (1 − ρ_p − k·(λ/N)·ō)`` (``k`` the step's cost per running stream at the mean context, the batch from
  Little's law), plus the tail of the stalls a stream meets (compound Poisson: prefills at rate λ/N, each
  ``S``); TTFT is the same M/G/c wait with each prompt's chunks also paying the decode step they ride on.
  N is the smallest meeting both SLOs and the memory barrier.

* **Selective disaggregation**: the proxy sends a prompt whose uncached part is under ``min_uncached_tokens``
  straight to a decode replica. That share of the traffic leaves the prefill pool (sized on the prompts above the
  threshold) and its prefills ride the decode pool's steps (its TPOT stretched by them, as an aggregated
  replica's), with their own TTFT on the decode replicas. The plan reports the share and the threshold that needs
  the fewest GPUs (``threshold``).

Disaggregation pays when its pools meet the SLO with fewer GPUs (or fewer dollars, when both pools have a price)
than the best aggregated fleet; on a tie, or without a saving, the plan recommends aggregated: a second pool, the
KV link and the pairing are complexity a tie does not buy.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from functools import partial

from capacity.planning.barriers import (
    SLO,
    Hardware,
    ModelShape,
    PlannerInputError,
    ThroughputRow,
    Workload,
    kv_bytes_per_token,
    kv_memory_gb,
    plan,
    wait_at_percentile,
)

_Z = {50: 0.0, 90: 1.2816, 95: 1.6449, 99: 2.3263}
_MAX_REPLICAS = 4096


@dataclass(frozen=True)
class StepModel:
    """One replica's step times (``EngineProfile``'s): a decode step ``t0 + per_seq·B + per_ctx·Σctx``, a prefill
    of ``p`` tokens ``⌈p/chunk⌉·overhead + p/rate``."""

    decode_t0_s: float
    decode_per_seq_s: float
    decode_per_ctx_token_s: float
    prefill_tokens_per_s: float
    prefill_overhead_s: float = 0.0
    chunk_tokens: int = 8192  # max_num_batched_tokens
    max_batch: int = 256  # max_num_seqs

    @classmethod
    def from_profile(cls, profile) -> StepModel:
        """From a ``capacity.hardware.profiles.EngineProfile`` (a calibrated one: docs/algorithms.md)."""
        return cls(
            decode_t0_s=profile.decode_t0_s,
            decode_per_seq_s=profile.decode_per_seq_s,
            decode_per_ctx_token_s=profile.decode_per_ctx_token_s,
            prefill_tokens_per_s=profile.prefill_tokens_per_s,
            prefill_overhead_s=profile.prefill_overhead_s,
            chunk_tokens=profile.max_num_batched_tokens,
            max_batch=profile.max_num_seqs,
        )

    def decode_step_s(self, batch: float, ctx: float) -> float:
        return self.decode_t0_s + batch * (self.decode_per_seq_s + self.decode_per_ctx_token_s * ctx)

    def prefill_s(self, tokens: float, *, shared: bool = False) -> float:
        """A prompt's prefill: its chunks, each a step's fixed cost (overhead and the decode step it rides on), and its
        tokens. ``shared``: under load a step's budget is filled by several prompts, which share its fixed cost."""
        steps = max(tokens, 1) / self.chunk_tokens if shared else math.ceil(max(tokens, 1) / self.chunk_tokens)
        return steps * (self.prefill_overhead_s + self.decode_t0_s) + tokens / self.prefill_tokens_per_s

    def chunk_extra_s(self, tokens: float) -> float:
        """What a prompt adds to the decode steps its chunks ride on in an aggregated replica."""
        return (
            math.ceil(max(tokens, 1) / self.chunk_tokens) * self.prefill_overhead_s
            + tokens / self.prefill_tokens_per_s
        )


@dataclass(frozen=True)
class PDWorkload:
    arrival_rate_per_s: float
    input_tokens: float  # mean prompt tokens (uncached)
    output_tokens: float  # mean output tokens
    input_tokens_sd: float = 0.0  # the prompts' spread: uneven prompts queue more
    # The context a running stream holds, averaged over stream time (a mix's long prompts decode longer and weigh
    # more); None: input + output / 2.
    context_tokens: float | None = None
    # The prompts' lengths as uniform ranges (weight, lowest, highest): what the share under a threshold is read
    # from. None: one uniform range of the mean and spread above.
    prompt_ranges: tuple[tuple[float, float, float], ...] | None = None

    @property
    def decode_context(self) -> float:
        return self.context_tokens if self.context_tokens is not None else self.input_tokens + self.output_tokens / 2

    @classmethod
    def uniform(cls, rate: float, prompt: tuple[int, int], output: tuple[int, int]) -> PDWorkload:
        return cls(rate, (prompt[0] + prompt[1]) / 2, (output[0] + output[1]) / 2, (prompt[1] - prompt[0]) / 12**0.5)

    def ranges(self) -> list[tuple[float, float, float]]:
        if self.prompt_ranges:
            return [(float(w), float(lo), float(hi)) for w, lo, hi in self.prompt_ranges]
        half = 3**0.5 * self.input_tokens_sd
        return [(1.0, max(1.0, self.input_tokens - half), self.input_tokens + half)]

    def split_at(self, threshold: float) -> tuple[float, PDWorkload | None, PDWorkload | None]:
        """The share of prompts under ``threshold`` tokens, and the workloads of those under it (straight to decode)
        and of those at or above it (through the prefill pool); None for an empty side."""
        sides = {True: [0.0, 0.0, 0.0], False: [0.0, 0.0, 0.0]}  # weight, Σ w·mean, Σ w·second moment
        ranges = self.ranges()
        total = sum(w for w, _, _ in ranges)
        for w, lo, hi in ranges:
            pieces = [(lo, min(hi, threshold), True), (max(lo, threshold), hi, False)] if hi > lo else []
            if not pieces:
                pieces = [(lo, hi, lo < threshold)]
            for a, b, below in pieces:
                share = w / total * ((b - a) / (hi - lo) if hi > lo else 1.0)
                if share <= 0 or b < a:
                    continue
                side = sides[below]
                side[0] += share
                side[1] += share * (a + b) / 2
                side[2] += share * (a * a + a * b + b * b) / 3
        out = []
        for below in (True, False):
            weight, first, second = sides[below]
            if weight <= 1e-12:
                out.append(None)
                continue
            mean = first / weight
            sd = max(0.0, second / weight - mean**2) ** 0.5
            rate = self.arrival_rate_per_s * weight
            out.append(PDWorkload(rate, max(1.0, mean), self.output_tokens, sd, self.context_tokens))
        return sides[True][0], out[0], out[1]


@dataclass(frozen=True)
class PDSLO:
    ttft_s: float
    tpot_s: float
    percentile: int = 90  # of TTFT and TPOT over requests


@dataclass
class PoolFigures:
    replicas: int | None
    gpus: int | None
    usd_per_hour: float | None
    ttft_s: float | None = None  # at the SLO's percentile
    tpot_s: float | None = None
    detail: dict = field(default_factory=dict)


@dataclass
class PDPlan:
    recommended: str  # aggregated | disaggregated
    pays: bool
    explanation: str
    aggregated: PoolFigures
    prefill: PoolFigures
    decode: PoolFigures
    disaggregated_gpus: int | None
    disaggregated_usd_per_hour: float | None
    gpu_ratio: float | None  # aggregated GPUs ÷ disaggregated GPUs (> 1: disaggregation needs fewer)
    kv_bytes_per_token: float
    transfer_s_at_percentile: float | None
    # Selective disaggregation: the threshold planned with, the share of requests under it (straight to decode),
    # and the threshold that needs the fewest GPUs among the candidates (``recommend_threshold``).
    min_uncached_tokens: int = 0
    bypass_share: float = 0.0
    threshold: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def _validate(workload: PDWorkload, slo: PDSLO, step: StepModel, link_gbps: float) -> None:
    errors = {}
    for name, value, zero_ok in (
        ("workload.arrival_rate_per_s", workload.arrival_rate_per_s, False),
        ("workload.input_tokens", workload.input_tokens, False),
        ("workload.output_tokens", workload.output_tokens, False),
        ("workload.input_tokens_sd", workload.input_tokens_sd, True),
        ("slo.ttft_s", slo.ttft_s, False),
        ("slo.tpot_s", slo.tpot_s, False),
        ("step_model.prefill_tokens_per_s", step.prefill_tokens_per_s, False),
        ("step_model.decode_t0_s", step.decode_t0_s, False),
        ("step_model.decode_per_seq_s", step.decode_per_seq_s, True),
        ("step_model.decode_per_ctx_token_s", step.decode_per_ctx_token_s, True),
        ("step_model.prefill_overhead_s", step.prefill_overhead_s, True),
        ("hardware.kv_link_gbps", link_gbps, False),
    ):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            errors[name] = "must be a finite number"
        elif value < 0 or (value == 0 and not zero_ok):
            errors[name] = "must be " + ("non-negative" if zero_ok else "positive")
    if slo.percentile not in _Z:
        errors["slo.percentile"] = f"must be one of {', '.join(map(str, _Z))}"
    if step.chunk_tokens < 1 or step.max_batch < 1:
        errors["step_model"] = "chunk_tokens and max_batch must be at least 1"
    if errors:
        raise PlannerInputError(errors)


def _prompt_at(workload: PDWorkload, z: float) -> float:
    return max(1.0, workload.input_tokens + z * workload.input_tokens_sd)


def _service_moments(workload: PDWorkload, service) -> tuple[float, float]:
    """Mean and squared coefficient of variation of ``service(p)`` over the prompt lengths (three-point rule)."""
    m, sd = workload.input_tokens, workload.input_tokens_sd
    points = [(max(1.0, m - 3**0.5 * sd), 1 / 6), (m, 2 / 3), (m + 3**0.5 * sd, 1 / 6)]
    mean = sum(w * service(p) for p, w in points)
    second = sum(w * service(p) ** 2 for p, w in points)
    return mean, max(0.0, second - mean**2) / mean**2


def mgc_wait_s(*, servers: int, arrival_rate: float, mean_s: float, cs2: float, percentile: int) -> float:
    """Queue wait at the percentile of M/G/c (``barriers.wait_at_percentile``); inf when unstable."""
    return wait_at_percentile(
        servers=servers, arrival_rate=arrival_rate, mean_s=mean_s, cs2=cs2, percentile=percentile
    )


def _price(hw: Hardware, replicas: int) -> float | None:
    return replicas * hw.gpus_per_replica * hw.usd_per_gpu_hour if hw.usd_per_gpu_hour > 0 else None


def _decode_table(step: StepModel, ctx: float, tpot_s: float) -> list[ThroughputRow]:
    """Rows at powers of two up to the step model's batch limit, plus the largest batch within the TPOT."""
    per_stream = step.decode_per_seq_s + step.decode_per_ctx_token_s * ctx
    exact = int((tpot_s - step.decode_t0_s) / per_stream) if per_stream > 0 else step.max_batch
    batches = {b for b in (2**i for i in range(16)) if b <= step.max_batch} | {min(max(exact, 1), step.max_batch)}
    return [ThroughputRow(batch=b, per_stream_tok_s=1 / step.decode_step_s(b, ctx)) for b in sorted(batches)]


def plan_disaggregation(
    *,
    model: ModelShape,
    hardware: Hardware,
    step: StepModel,
    workload: PDWorkload,
    slo: PDSLO,
    link_gbps: float,
    prefill_hardware: Hardware | None = None,
    prefill_step: StepModel | None = None,
    link_latency_s: float = 0.0,
    min_uncached_tokens: int = 0,
) -> PDPlan:
    """Size both pools and the best aggregated fleet for the same SLO; recommend the cheaper (aggregated on a tie).
    Prompts under ``min_uncached_tokens`` skip the prefill pool (the proxy's selective disaggregation)."""
    _validate(workload, slo, step, link_gbps)
    if not isinstance(min_uncached_tokens, int) or min_uncached_tokens < 0:
        raise PlannerInputError({"min_uncached_tokens": "must be a non-negative integer"})
    kv_tok = kv_bytes_per_token(model)
    agg = aggregated_pool(model=model, hardware=hardware, step=step, workload=workload, slo=slo)
    design = partial(
        disaggregated_design, model=model, hardware=hardware, step=step, workload=workload, slo=slo,
        link_gbps=link_gbps, prefill_hardware=prefill_hardware or hardware, prefill_step=prefill_step or step,
        link_latency_s=link_latency_s,
    )  # fmt: skip
    chosen = design(min_uncached_tokens)
    prefill, decode, transfer_q = chosen["prefill"], chosen["decode"], chosen["transfer_s"]
    pd_gpus, pd_usd = chosen["gpus"], chosen["usd_per_hour"]
    ratio = agg.gpus / pd_gpus if agg.gpus and pd_gpus else None
    pays, why = _verdict(agg, pd_gpus, pd_usd)
    threshold = recommend_threshold(workload, design, given=chosen)
    return PDPlan(
        recommended="disaggregated" if pays else "aggregated",
        pays=pays,
        explanation=" ".join(
            [why, _figures(agg, prefill, decode, transfer_q, slo), _threshold_note(chosen, threshold)]
        ).strip(),
        aggregated=agg,
        prefill=prefill,
        decode=decode,
        disaggregated_gpus=pd_gpus,
        disaggregated_usd_per_hour=pd_usd,
        gpu_ratio=ratio,
        kv_bytes_per_token=kv_tok,
        transfer_s_at_percentile=transfer_q,
        min_uncached_tokens=min_uncached_tokens,
        bypass_share=chosen["bypass_share"],
        threshold=threshold,
    )


def disaggregated_design(
    threshold: int, *, model, hardware, step, workload: PDWorkload, slo: PDSLO, link_gbps, prefill_hardware,
    prefill_step, link_latency_s,
) -> dict:  # fmt: skip
    """Both pools when prompts under ``threshold`` tokens go straight to the decode pool."""
    share, direct, through = workload.split_at(threshold) if threshold > 0 else (0.0, None, workload)
    decode = decode_pool(model=model, hardware=hardware, step=step, workload=workload, slo=slo, direct=direct)
    prefill, transfer_q = PoolFigures(None, None, None), None
    if decode.replicas is not None and through is None:  # every prompt bypasses it: the pool's one replica idles
        prefill, transfer_q = PoolFigures(1, prefill_hardware.gpus_per_replica, _price(prefill_hardware, 1)), 0.0
        prefill.ttft_s, prefill.detail = decode.detail.get("direct_ttft_s"), {"reason": "every prompt bypasses it"}
    elif decode.replicas is not None:
        prefill, transfer_q = prefill_pool(
            hardware=prefill_hardware, step=prefill_step, workload=through, slo=slo, kv_tok=kv_bytes_per_token(model),
            link_gbps=link_gbps, link_latency_s=link_latency_s, decode_replicas=decode.replicas,
            z=_Z[slo.percentile], first_step_s=decode.tpot_s,
        )  # fmt: skip
    gpus = usd = None
    if prefill.replicas is not None and decode.replicas is not None:
        gpus = prefill.gpus + decode.gpus
        if prefill.usd_per_hour is not None and decode.usd_per_hour is not None:
            usd = prefill.usd_per_hour + decode.usd_per_hour
    return {"threshold": threshold, "bypass_share": share, "prefill": prefill, "decode": decode, "gpus": gpus,
            "usd_per_hour": usd, "transfer_s": transfer_q}  # fmt: skip


def threshold_candidates(workload: PDWorkload) -> list[int]:
    """0 (every prompt through the prefill pool) and powers of two from 64 tokens, while some prompts remain above."""
    longest = max(hi for _, _, hi in workload.ranges())
    return [0] + [2**k for k in range(6, 24) if 2**k <= longest]


def recommend_threshold(workload: PDWorkload, design, *, given: dict) -> dict:
    """The candidate threshold whose pools cost least (dollars when priced, else GPUs); on a tie the lower
    threshold, whose decode pool carries fewer prefills."""
    rows = {t: design(t) for t in threshold_candidates(workload) if t != given["threshold"]}
    rows[given["threshold"]] = given

    def cost(row):
        return row["usd_per_hour"] if row["usd_per_hour"] is not None else row["gpus"]

    feasible = sorted((t for t, r in rows.items() if r["gpus"] is not None), key=lambda t: (cost(rows[t]), t))
    best = rows[feasible[0]] if feasible else None
    return {
        "recommended_min_uncached_tokens": best["threshold"] if best else None,
        "bypass_share": best["bypass_share"] if best else None,
        "gpus": best["gpus"] if best else None,
        "usd_per_hour": best["usd_per_hour"] if best else None,
        "candidates": [
            {
                "min_uncached_tokens": t,
                "bypass_share": round(r["bypass_share"], 4),
                "gpus": r["gpus"],
                "prefill_replicas": r["prefill"].replicas,
                "decode_replicas": r["decode"].replicas,
            }  # fmt: skip
            for t, r in sorted(rows.items())
        ],
    }


def _threshold_note(chosen: dict, threshold: dict) -> str:
    parts = []
    if chosen["threshold"] > 0:
        parts.append(
            f"{chosen['bypass_share']:.0%} of prompts (under {chosen['threshold']} uncached tokens) skip the prefill pool."
        )
    best = threshold.get("recommended_min_uncached_tokens")
    if (
        best is not None
        and best != chosen["threshold"]
        and (chosen["gpus"] is None or threshold["gpus"] < chosen["gpus"])
    ):
        parts.append(
            f"A pd_min_uncached_tokens of {best} ({threshold['bypass_share']:.0%} straight to decode) needs "
            f"{threshold['gpus']} GPUs."
        )
    return " ".join(parts)


def _verdict(agg: PoolFigures, pd_gpus: int | None, pd_usd: float | None) -> tuple[str, str]:
    if pd_gpus is None and agg.gpus is None:
        return False, "Neither plan meets the SLO with the modelled replicas: loosen the SLO or use faster hardware."
    if pd_gpus is None:
        return False, "Disaggregation cannot meet the SLO (prefill, link or decode pool); aggregated can."
    if agg.gpus is None:
        return True, "Disaggregation pays: no aggregated fleet meets the SLO, the two pools do."
    if pd_usd is not None and agg.usd_per_hour is not None:
        if pd_usd < agg.usd_per_hour:
            return True, f"Disaggregation pays: ${pd_usd:.2f}/h against ${agg.usd_per_hour:.2f}/h aggregated."
        return False, (
            f"Disaggregation does not pay: ${pd_usd:.2f}/h against ${agg.usd_per_hour:.2f}/h aggregated; "
            "recommend aggregated."
        )
    if pd_gpus < agg.gpus:
        return True, f"Disaggregation pays: {pd_gpus} GPUs against {agg.gpus} aggregated."
    return False, f"Disaggregation does not pay: {pd_gpus} GPUs against {agg.gpus} aggregated; recommend aggregated."


def _figures(agg, prefill, decode, transfer_q, slo: PDSLO) -> str:
    p = f"p{slo.percentile}"
    parts = []
    if agg.replicas is not None:
        parts.append(
            f"Aggregated: {agg.replicas} replicas, TTFT {p} {agg.ttft_s:.2f} s, TPOT {p} {agg.tpot_s * 1000:.1f} ms."
        )
    if prefill.replicas is not None and decode.replicas is not None:
        parts.append(
            f"Disaggregated: {prefill.replicas} prefill + {decode.replicas} decode replicas, TTFT {p} "
            f"{prefill.ttft_s:.2f} s (KV transfer {transfer_q * 1000:.0f} ms), decode TPOT {decode.tpot_s * 1000:.1f} ms."
        )
    return " ".join(parts)


def decode_pool(
    *, model, hardware, step: StepModel, workload: PDWorkload, slo: PDSLO, direct: PDWorkload | None = None
) -> PoolFigures:
    """The decode pool: the three barriers at the SLO's per-stream rate, then as many more replicas as the batch's
    swings need. Continuous batching queues no stream, it slows them all: the running streams of a replica are
    M/G/∞ (Poisson, mean m = λ·ō·TPOT / D by Little), and TPOT at the percentile is the step at m + z·√m streams.
    ``direct``: the prompts that skip the prefill pool; their prefills ride these replicas' steps as in an aggregated
    replica (the TPOT stretched by their share of time, with the stalls' spread), and their TTFT is met here."""
    lam, out = workload.arrival_rate_per_s, workload.output_tokens
    ctx_mean = workload.decode_context
    result = plan(
        model=model,
        hardware=hardware,
        workload=Workload(lam, workload.input_tokens, out, ctx_mean + out / 2),
        slo=SLO(min_stream_tok_s=1 / slo.tpot_s),
        throughput_table=_decode_table(step, ctx_mean, slo.tpot_s),
        ttft_s=0.0,
    )
    if not result.feasible:
        return PoolFigures(None, None, None, detail={"reason": result.explanation})
    k = step.decode_per_seq_s + step.decode_per_ctx_token_s * ctx_mean
    z = _Z[slo.percentile]
    lam_d = direct.arrival_rate_per_s if direct is not None else 0.0
    d_mean, d_cs2 = _service_moments(direct, step.chunk_extra_s) if direct is not None else (0.0, 0.0)
    for n in range(max(1, result.n_base), min(_MAX_REPLICAS, 4 * max(1, result.n_base) + 16)):
        rho_d = lam_d / n * d_mean
        slack = 1 - rho_d - k * lam * out / n
        if slack <= 0:
            continue
        tpot_mean = step.decode_t0_s / slack
        mean_batch = lam * out * tpot_mean / n
        stall_sd = math.sqrt(lam_d / n * tpot_mean * d_mean**2 * (1 + d_cs2) / out)
        tpot_q = step.decode_step_s(mean_batch + z * math.sqrt(mean_batch), ctx_mean) / (1 - rho_d) + z * stall_sd
        direct_ttft = _direct_ttft(step, direct, n, mean_batch, ctx_mean, slo) if direct is not None else 0.0
        if tpot_q <= slo.tpot_s and direct_ttft <= slo.ttft_s:
            detail = {"b_max": result.b_max, "binding": result.binding_barriers, "n_base": result.n_base,
                      "mean_batch": mean_batch, "tpot_mean_s": tpot_mean, "rho_direct": rho_d}  # fmt: skip
            if direct is not None:
                detail["direct_ttft_s"] = direct_ttft
            return PoolFigures(n, n * hardware.gpus_per_replica, _price(hardware, n), tpot_s=tpot_q, detail=detail)
    return PoolFigures(None, None, None, detail={"reason": "the batch's swings exceed the TPOT at every pool size"})


def _direct_ttft(step: StepModel, direct: PDWorkload, n: int, batch: float, ctx: float, slo: PDSLO) -> float:
    """TTFT at the percentile of a prompt prefilled on a decode replica: its chunks, each riding a decode step."""
    step_s = step.decode_step_s(batch, ctx)

    def service(p):
        return step.chunk_extra_s(p) + math.ceil(p / step.chunk_tokens) * step_s

    mean_s, cs2 = _service_moments(direct, service)
    wait = mgc_wait_s(
        servers=n, arrival_rate=direct.arrival_rate_per_s, mean_s=mean_s, cs2=cs2, percentile=slo.percentile
    )
    return wait + service(_prompt_at(direct, _Z[slo.percentile]))


def prefill_pool(
    *, hardware, step: StepModel, workload: PDWorkload, slo: PDSLO, kv_tok: float, link_gbps: float,
    link_latency_s: float, decode_replicas: int, first_step_s: float, z: float,
) -> tuple[PoolFigures, float | None]:  # fmt: skip
    """The fewest prefill replicas whose TTFT at the percentile (queue, prefill, transfer, first decode step) fits."""
    lam = workload.arrival_rate_per_s
    mean_s, cs2 = _service_moments(workload, lambda p: step.prefill_s(p, shared=True))
    p_q = _prompt_at(workload, z)
    link_bps = link_gbps * 1e9 / 8
    start = max(1, math.ceil(lam * mean_s))
    for n in range(start, min(_MAX_REPLICAS, 50 * start + 64)):
        # Each transfer leaves over its prefill replica's link and lands on one decode replica's: the busier binds.
        rho_link = lam / min(n, decode_replicas) * workload.input_tokens * kv_tok / link_bps
        if rho_link >= 1:
            continue
        transfer = p_q * kv_tok / link_bps / (1 - rho_link) + link_latency_s
        wait = mgc_wait_s(servers=n, arrival_rate=lam, mean_s=mean_s, cs2=cs2, percentile=slo.percentile)
        ttft = wait + step.prefill_s(p_q) + transfer + first_step_s
        if ttft <= slo.ttft_s:
            detail = {"wait_s": wait, "prefill_s": step.prefill_s(p_q), "rho": lam * mean_s / n, "rho_link": rho_link}
            return PoolFigures(
                n, n * hardware.gpus_per_replica, _price(hardware, n), ttft_s=ttft, detail=detail
            ), transfer
        if rho_link < 0.5 and wait == 0.0:
            break  # more replicas no longer shorten TTFT: the prompt, its transfer and first step alone exceed it
    return PoolFigures(None, None, None, detail={"reason": "no prefill pool meets the TTFT SLO"}), None


def aggregated_pool(*, model, hardware, step: StepModel, workload: PDWorkload, slo: PDSLO) -> PoolFigures:
    """The fewest mixed replicas meeting TTFT, TPOT (with the prefill stalls) and memory at the percentile."""
    lam, out = workload.arrival_rate_per_s, workload.output_tokens
    z = _Z[slo.percentile]
    ctx_mean = workload.decode_context
    k = step.decode_per_seq_s + step.decode_per_ctx_token_s * ctx_mean
    prefill_mean, prefill_cs2 = _service_moments(workload, step.chunk_extra_s)
    prefill_second = prefill_mean**2 * (1 + prefill_cs2)
    p_q = _prompt_at(workload, z)
    kv_tokens = kv_memory_gb(model, hardware) * 1e9 / kv_bytes_per_token(model)
    start = max(1, math.ceil(lam * prefill_mean))
    for n in range(start, min(_MAX_REPLICAS, 50 * start + 64)):
        r = lam / n
        rho_p = r * prefill_mean
        slack = 1 - rho_p - k * r * out
        if slack <= 0:
            continue
        tpot_mean = step.decode_t0_s / slack
        batch = min(r * out * tpot_mean, step.max_batch)
        # A stream of ō tokens meets Poisson(r·ō·TPOT) prompts, each stalling it S: the spread per token.
        tpot_sd = math.sqrt(r * tpot_mean * prefill_second / out)
        tpot_q = tpot_mean + z * tpot_sd
        step_s = step.decode_step_s(batch, ctx_mean)

        def service(p, step_s=step_s):
            return step.chunk_extra_s(p) + math.ceil(p / step.chunk_tokens) * step_s

        mean_s, cs2 = _service_moments(workload, service)
        wait = mgc_wait_s(servers=n, arrival_rate=lam, mean_s=mean_s, cs2=cs2, percentile=slo.percentile)
        ttft_q = wait + service(p_q)
        in_flight = r * (ttft_q + out * tpot_mean)
        memory_ok = in_flight * (ctx_mean + out / 2) <= kv_tokens
        if tpot_q <= slo.tpot_s and ttft_q <= slo.ttft_s and memory_ok:
            detail = {"rho_prefill": rho_p, "tpot_mean_s": tpot_mean, "batch": batch, "wait_s": wait}
            return PoolFigures(n, n * hardware.gpus_per_replica, _price(hardware, n), ttft_q, tpot_q, detail)
        if tpot_mean > slo.tpot_s and step.decode_step_s(0, ctx_mean) >= slo.tpot_s:
            break  # even an idle replica's step exceeds the TPOT
    return PoolFigures(None, None, None, detail={"reason": "no aggregated fleet meets the SLO"})
