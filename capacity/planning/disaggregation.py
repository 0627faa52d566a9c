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

Disaggregation pays when its pools meet the SLO with fewer GPUs (or fewer dollars, when both pools have a price)
than the best aggregated fleet; on a tie, or without a saving, the plan recommends aggregated: a second pool, the
KV link and the pairing are complexity a tie does not buy.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

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

    @property
    def decode_context(self) -> float:
        return self.context_tokens if self.context_tokens is not None else self.input_tokens + self.output_tokens / 2

    @classmethod
    def uniform(cls, rate: float, prompt: tuple[int, int], output: tuple[int, int]) -> PDWorkload:
        return cls(rate, (prompt[0] + prompt[1]) / 2, (output[0] + output[1]) / 2, (prompt[1] - prompt[0]) / 12**0.5)


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
) -> PDPlan:
    """Size both pools and the best aggregated fleet for the same SLO; recommend the cheaper (aggregated on a tie)."""
    _validate(workload, slo, step, link_gbps)
    prefill_hardware = prefill_hardware or hardware
    prefill_step = prefill_step or step
    z = _Z[slo.percentile]
    kv_tok = kv_bytes_per_token(model)
    agg = aggregated_pool(model=model, hardware=hardware, step=step, workload=workload, slo=slo)
    decode = decode_pool(model=model, hardware=hardware, step=step, workload=workload, slo=slo)
    prefill = PoolFigures(None, None, None)
    transfer_q = None
    if decode.replicas is not None:
        prefill, transfer_q = prefill_pool(
            hardware=prefill_hardware, step=prefill_step, workload=workload, slo=slo, kv_tok=kv_tok,
            link_gbps=link_gbps, link_latency_s=link_latency_s, decode_replicas=decode.replicas, z=z,
            first_step_s=decode.tpot_s,
        )  # fmt: skip
    pd_gpus = pd_usd = None
    if prefill.replicas is not None and decode.replicas is not None:
        pd_gpus = prefill.gpus + decode.gpus
        if prefill.usd_per_hour is not None and decode.usd_per_hour is not None:
            pd_usd = prefill.usd_per_hour + decode.usd_per_hour
    ratio = agg.gpus / pd_gpus if agg.gpus and pd_gpus else None
    pays, why = _verdict(agg, pd_gpus, pd_usd)
    return PDPlan(
        recommended="disaggregated" if pays else "aggregated",
        pays=pays,
        explanation=why + " " + _figures(agg, prefill, decode, transfer_q, slo),
        aggregated=agg,
        prefill=prefill,
        decode=decode,
        disaggregated_gpus=pd_gpus,
        disaggregated_usd_per_hour=pd_usd,
        gpu_ratio=ratio,
        kv_bytes_per_token=kv_tok,
        transfer_s_at_percentile=transfer_q,
    )


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


def decode_pool(*, model, hardware, step: StepModel, workload: PDWorkload, slo: PDSLO) -> PoolFigures:
    """The decode pool: the three barriers at the SLO's per-stream rate, then as many more replicas as the batch's
    swings need. Continuous batching queues no stream, it slows them all: the running streams of a replica are
    M/G/∞ (Poisson, mean m = λ·ō·TPOT / D by Little), and TPOT at the percentile is the step at m + z·√m streams."""
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
    for n in range(max(1, result.n_base), min(_MAX_REPLICAS, 4 * max(1, result.n_base) + 16)):
        slack = 1 - k * lam * out / n
        if slack <= 0:
            continue
        mean_batch = lam * out * step.decode_t0_s / slack / n
        tpot_q = step.decode_step_s(mean_batch + z * math.sqrt(mean_batch), ctx_mean)
        if tpot_q <= slo.tpot_s:
            detail = {"b_max": result.b_max, "binding": result.binding_barriers, "n_base": result.n_base,
                      "mean_batch": mean_batch, "tpot_mean_s": step.decode_t0_s / slack}  # fmt: skip
            return PoolFigures(n, n * hardware.gpus_per_replica, _price(hardware, n), tpot_s=tpot_q, detail=detail)
    return PoolFigures(None, None, None, detail={"reason": "the batch's swings exceed the TPOT at every pool size"})


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
