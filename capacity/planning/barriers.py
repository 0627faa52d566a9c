"""The three-barrier capacity planner (pure: no Django): how many replicas a workload needs under an SLO.

Barriers (docs/algorithms.md#capacity-planner): memory ``N_mem = ⌈L·ctx·kv_tok / M_KV⌉``, throughput
``N_thr = ⌈λ·ō / T_dec(B_max)⌉`` and latency ``N_lat = ⌈L / B_max⌉`` with ``L = λ·W`` (Little) and
``W = TTFT + ō / stream_rate``. With a TTFT SLO, a fourth: ``N_ttft``, the fewest replicas whose wait for a
decode slot at the SLO's percentile (M/M/c over N·B_max slots, each held ō / stream_rate: Erlang C with its
exponential tail) plus the TTFT p95 measured at B_max fits the SLO; near ρ = 1 the slots are rarely free and
prompts queue behind them (docs/algorithms.md#capacity-planner). Then headroom, an Erlang-C queue-wait estimate,
dollars per 1M tokens, and a load-spike scenario. 1 GB = 1e9 bytes throughout.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

# Float noise must not push an exact integer (2.0000000001) up to the next replica.
_CEIL_EPS = 1e-9


class PlannerInputError(ValueError):
    """Bad planner input; ``errors`` maps each field to what is wrong with it."""

    def __init__(self, errors: dict[str, str]):
        self.errors = errors
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))


@dataclass(frozen=True)
class ModelShape:
    n_layers: int
    n_kv_heads: int
    d_head: int
    dtype_bytes: int = 2
    weights_gb: float = 0.0


@dataclass(frozen=True)
class Hardware:
    gpu_memory_gb: float
    overhead_gb: float = 0.0  # activations, CUDA graphs, fragmentation: what vLLM does not give the KV cache
    gpus_per_replica: int = 1
    usd_per_gpu_hour: float = 0.0


@dataclass(frozen=True)
class Workload:
    arrival_rate_per_s: float  # λ
    input_tokens: float
    output_tokens: float  # ō
    context_tokens: float | None = None  # KV held per request; defaults to input + output


@dataclass(frozen=True)
class SLO:
    min_stream_tok_s: float  # per-stream decode rate, i.e. 1000 / TPOT_ms
    ttft_s: float | None = None  # TTFT ceiling; rows whose TTFT p95 exceed it are not SLO-compliant


@dataclass(frozen=True)
class ThroughputRow:
    batch: int
    per_stream_tok_s: float
    aggregate_tok_s: float | None = None  # defaults to batch × per_stream
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None

    @property
    def aggregate(self) -> float:
        return self.aggregate_tok_s if self.aggregate_tok_s is not None else self.batch * self.per_stream_tok_s


@dataclass(frozen=True)
class SpikeInput:
    load_multiplier: float = 3.0
    cold_start_s: float = 90.0
    utilization_ceiling: float = 0.8


@dataclass
class SpikeResult:
    load_multiplier: float
    cold_start_s: float
    utilization_ceiling: float
    replicas_needed: int
    replicas_before: int
    extra_replicas: int
    backlog_requests: float
    backlog_tokens: float
    drain_s: float | None  # time to clear the backlog once the new replicas are ready; None if it never drains


@dataclass
class PlanResult:
    feasible: bool
    explanation: str
    binding_barriers: list[str] = field(default_factory=list)
    kv_tok_bytes: float = 0.0
    m_kv_gb: float = 0.0
    kv_tokens_total: float = 0.0
    b_max: int | None = None
    b_max_reason: str = ""
    stream_tok_s_at_b_max: float | None = None
    t_dec_tok_s: float | None = None
    ttft_s: float | None = None
    w_s: float | None = None
    l_in_flight: float | None = None
    n_mem: int | None = None
    n_thr: int | None = None
    n_lat: int | None = None
    n_ttft: int | None = None  # with a TTFT SLO: the fewest replicas whose slot wait p95 + TTFT p95 fits it
    ttft_p95_at_n_base: float | None = None
    n_base: int | None = None
    headroom: float = 0.0
    n_with_headroom: int | None = None
    rho_at_n_base: float | None = None
    rho_at_n: float | None = None
    queue_wait_prob_at_n_base: float | None = None
    queue_wait_s_at_n_base: float | None = None
    queue_wait_s_at_n: float | None = None
    usd_per_1m_tokens_at_b_max: float | None = None
    usd_per_1m_tokens_by_batch: dict[int, float] = field(default_factory=dict)
    usd_per_1m_tokens_at_plan: float | None = None
    usd_per_hour_at_plan: float | None = None
    spike: SpikeResult | None = None

    def as_dict(self) -> dict:
        data = asdict(self)
        data["usd_per_1m_tokens_by_batch"] = {str(k): v for k, v in self.usd_per_1m_tokens_by_batch.items()}
        return data


def _ceil(x: float) -> int:
    return math.ceil(x - _CEIL_EPS) if x > 0 else 0


def kv_bytes_per_token(model: ModelShape) -> float:
    """K and V, for every layer and KV head: ``2·n_layers·n_kv_heads·d_head·bytes``."""
    return 2 * model.n_layers * model.n_kv_heads * model.d_head * model.dtype_bytes


def kv_memory_gb(model: ModelShape, hardware: Hardware) -> float:
    """``M_KV = M_GPU − M_weights − M_overhead`` for one replica (all its GPUs)."""
    return hardware.gpu_memory_gb * hardware.gpus_per_replica - model.weights_gb - hardware.overhead_gb


def usd_per_1m_tokens(*, usd_per_gpu_hour: float, gpus_per_replica: int, goodput_tok_s: float) -> float:
    """``$ per 1M tokens = gpu_hour_cost / (goodput_tok_s · 3600) · 1e6`` for one replica."""
    return usd_per_gpu_hour * gpus_per_replica / (goodput_tok_s * 3600.0) * 1e6


def erlang_c(servers: int, offered_load: float) -> float:
    """Probability that an arrival waits in an M/M/c queue (offered load in Erlangs); 1.0 when unstable.

    Computed through the Erlang-B recursion, which stays finite for thousands of servers.
    """
    if servers <= 0:
        return 1.0
    if offered_load <= 0:
        return 0.0
    if offered_load >= servers:
        return 1.0
    b = 1.0
    for k in range(1, servers + 1):
        b = offered_load * b / (k + offered_load * b)
    return servers * b / (servers - offered_load * (1.0 - b))


def mmc_wait_s(*, servers: int, arrival_rate: float, service_s: float) -> tuple[float, float]:
    """(P(wait), mean wait in seconds) of M/M/c; (1, inf) when the queue is unstable."""
    offered = arrival_rate * service_s
    if arrival_rate <= 0:
        return 0.0, 0.0
    if offered >= servers:
        return 1.0, math.inf
    p_wait = erlang_c(servers, offered)
    return p_wait, p_wait / (servers / service_s - arrival_rate)


def wait_at_percentile(
    *, servers: int, arrival_rate: float, mean_s: float, percentile: float, cs2: float = 1.0
) -> float:
    """The queue wait at the percentile of M/G/c (Allen-Cunneen): P(wait > t) ≈ C·exp(−t·(c/S − λ)·2/(1 + c_s²)),
    C the Erlang-C probability of waiting; 0 when fewer than (100 − percentile) % wait; inf when unstable."""
    offered = arrival_rate * mean_s
    if arrival_rate <= 0:
        return 0.0
    if offered >= servers:
        return math.inf
    c_wait = erlang_c(servers, offered)
    tail = 1 - percentile / 100
    if c_wait <= tail:
        return 0.0
    return math.log(c_wait / tail) / ((servers / mean_s - arrival_rate) * 2 / (1 + cs2))


def validate(model: ModelShape, hardware: Hardware, workload: Workload, slo: SLO, table: list[ThroughputRow]) -> None:
    errors: dict[str, str] = {}

    def positive(name: str, value, allow_zero: bool = False) -> None:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value) or math.isinf(value):
            errors[name] = "must be a finite number"
        elif value < 0 or (value == 0 and not allow_zero):
            errors[name] = "must be " + ("non-negative" if allow_zero else "positive")

    for name in ("n_layers", "n_kv_heads", "d_head", "dtype_bytes"):
        positive(f"model.{name}", getattr(model, name))
    positive("model.weights_gb", model.weights_gb, allow_zero=True)
    positive("hardware.gpu_memory_gb", hardware.gpu_memory_gb)
    positive("hardware.overhead_gb", hardware.overhead_gb, allow_zero=True)
    positive("hardware.gpus_per_replica", hardware.gpus_per_replica)
    positive("hardware.usd_per_gpu_hour", hardware.usd_per_gpu_hour, allow_zero=True)
    positive("workload.arrival_rate_per_s", workload.arrival_rate_per_s, allow_zero=True)
    positive("workload.input_tokens", workload.input_tokens, allow_zero=True)
    positive("workload.output_tokens", workload.output_tokens)
    if workload.context_tokens is not None:
        positive("workload.context_tokens", workload.context_tokens)
    positive("slo.min_stream_tok_s", slo.min_stream_tok_s)
    if slo.ttft_s is not None:
        positive("slo.ttft_s", slo.ttft_s)
    if not table:
        errors["throughput_table"] = "needs at least one row (batch, per_stream_tok_s)"
    seen: set[int] = set()
    for i, row in enumerate(table):
        positive(f"throughput_table[{i}].batch", row.batch)
        positive(f"throughput_table[{i}].per_stream_tok_s", row.per_stream_tok_s)
        if row.aggregate_tok_s is not None:
            positive(f"throughput_table[{i}].aggregate_tok_s", row.aggregate_tok_s)
        for name in ("ttft_p50_s", "ttft_p95_s"):
            if getattr(row, name) is not None:
                positive(f"throughput_table[{i}].{name}", getattr(row, name), allow_zero=True)
        if row.batch in seen:
            errors[f"throughput_table[{i}].batch"] = f"batch {row.batch} appears twice"
        seen.add(row.batch)
    if not errors and kv_memory_gb(model, hardware) <= 0:
        errors["hardware.gpu_memory_gb"] = (
            f"no memory left for the KV cache: {hardware.gpu_memory_gb * hardware.gpus_per_replica:g} GB − weights "
            f"{model.weights_gb:g} GB − overhead {hardware.overhead_gb:g} GB ≤ 0"
        )
    if errors:
        raise PlannerInputError(errors)


def _choose_b_max(table: list[ThroughputRow], slo: SLO) -> tuple[ThroughputRow | None, str]:
    """The largest measured batch meeting the per-stream rate (and TTFT p95, if given).

    KV memory does not cap it here: the memory barrier N_mem spreads the in-flight requests over enough replicas
    that each holds what fits, which keeps the three barriers separate as in the reference formulas.
    """
    rows = sorted(table, key=lambda r: r.batch)
    compliant = [
        r
        for r in rows
        if r.per_stream_tok_s >= slo.min_stream_tok_s
        and (slo.ttft_s is None or r.ttft_p95_s is None or r.ttft_p95_s <= slo.ttft_s)
    ]
    if not compliant:
        best = max(rows, key=lambda r: r.per_stream_tok_s)
        reason = (
            f"SLO unreachable at any measured batch: it needs ≥ {slo.min_stream_tok_s:g} tok/s per stream"
            + (f" and TTFT p95 ≤ {slo.ttft_s:g} s" if slo.ttft_s is not None else "")
            + f"; the best row is batch {best.batch} at {best.per_stream_tok_s:g} tok/s"
            + (f", TTFT p95 {best.ttft_p95_s:g} s" if best.ttft_p95_s is not None else "")
            + ". Loosen the SLO, use faster hardware or a smaller model, or measure smaller batches."
        )
        return None, reason
    reason = f"largest measured batch with ≥ {slo.min_stream_tok_s:g} tok/s per stream"
    if slo.ttft_s is not None:
        reason += f" and TTFT p95 ≤ {slo.ttft_s:g} s"
    return compliant[-1], reason


def plan(
    *,
    model: ModelShape,
    hardware: Hardware,
    workload: Workload,
    slo: SLO,
    throughput_table: list[ThroughputRow],
    headroom: float = 0.0,
    ttft_s: float | None = None,
    spike: SpikeInput | None = None,
) -> PlanResult:
    """Plan replicas for one workload. Raises PlannerInputError on bad input; an unreachable SLO is not an error
    but a result with ``feasible=False`` and an explanation.

    ``ttft_s`` is the time to first token used in W; by default the TTFT p50 measured at B_max, else 0.
    """
    _validate_plan(model, hardware, workload, slo, throughput_table, headroom=headroom, ttft_s=ttft_s, spike=spike)
    result = _memory_and_table_costs(model, hardware, throughput_table, headroom=headroom)
    row, result.b_max_reason = _choose_b_max(throughput_table, slo)
    if row is None:
        result.explanation = result.b_max_reason
        return result
    ctx = (
        workload.context_tokens
        if workload.context_tokens is not None
        else workload.input_tokens + workload.output_tokens
    )
    _size_barriers(result, row, workload, ctx=ctx, ttft_s=ttft_s)
    if slo.ttft_s is not None:
        _ttft_barrier(result, row, workload, slo)
    _queue_waits(result, workload)
    _costs_at_plan(result, hardware, workload)
    result.explanation = _explain(result, workload, slo, ctx)
    if result.b_max * ctx > result.kv_tokens_total:
        result.explanation += (
            f" KV memory holds only {int(result.kv_tokens_total // ctx)} requests of {ctx:g} tokens per replica, "
            f"fewer than B_max = {result.b_max}: replicas run below B_max and faster per stream."
        )
    if spike is not None:
        result.spike = spike_scenario(
            spike=spike,
            arrival_rate_per_s=workload.arrival_rate_per_s,
            output_tokens=workload.output_tokens,
            t_dec_tok_s=result.t_dec_tok_s,
            replicas_before=result.n_with_headroom,
        )
    return result


def _validate_plan(model, hardware, workload, slo, table, *, headroom, ttft_s, spike) -> None:
    validate(model, hardware, workload, slo, table)
    if not isinstance(headroom, (int, float)) or math.isnan(headroom) or headroom < 0:
        raise PlannerInputError({"headroom": "must be a non-negative number"})
    if ttft_s is not None and (math.isnan(ttft_s) or ttft_s < 0):
        raise PlannerInputError({"ttft_s": "must be non-negative"})
    if spike is not None:
        _validate_spike(spike)


def _memory_and_table_costs(
    model: ModelShape, hardware: Hardware, table: list[ThroughputRow], *, headroom: float
) -> PlanResult:
    """The replica's KV memory and, when the GPU has a price, dollars per 1M tokens at every measured batch."""
    kv_tok = kv_bytes_per_token(model)
    m_kv_gb = kv_memory_gb(model, hardware)
    result = PlanResult(
        feasible=False,
        explanation="",
        kv_tok_bytes=kv_tok,
        m_kv_gb=m_kv_gb,
        kv_tokens_total=m_kv_gb * 1e9 / kv_tok,
        headroom=float(headroom),
    )
    if hardware.usd_per_gpu_hour > 0:
        for row in table:
            result.usd_per_1m_tokens_by_batch[row.batch] = usd_per_1m_tokens(
                usd_per_gpu_hour=hardware.usd_per_gpu_hour,
                gpus_per_replica=hardware.gpus_per_replica,
                goodput_tok_s=row.aggregate,
            )
    return result


def _size_barriers(result: PlanResult, row: ThroughputRow, workload: Workload, *, ctx: float, ttft_s) -> None:
    """W and L at B_max, the three barriers, N_base (the largest), N with headroom, and the utilization ρ."""
    lam, out = workload.arrival_rate_per_s, workload.output_tokens
    b_max, stream_rate, t_dec = row.batch, row.per_stream_tok_s, row.aggregate
    ttft = ttft_s if ttft_s is not None else (row.ttft_p50_s or 0.0)
    w = ttft + out / stream_rate
    little_l = lam * w
    n_mem = _ceil(little_l * ctx * result.kv_tok_bytes / (result.m_kv_gb * 1e9))
    n_thr = _ceil(lam * out / t_dec)
    n_lat = _ceil(little_l / b_max)
    n_base = max(n_mem, n_thr, n_lat)
    n = _ceil(n_base * (1 + result.headroom))
    result.feasible = True
    result.b_max, result.stream_tok_s_at_b_max, result.t_dec_tok_s = b_max, stream_rate, t_dec
    result.ttft_s, result.w_s, result.l_in_flight = ttft, w, little_l
    result.n_mem, result.n_thr, result.n_lat, result.n_base, result.n_with_headroom = n_mem, n_thr, n_lat, n_base, n
    result.rho_at_n_base = lam * out / (n_base * t_dec) if n_base else 0.0
    result.rho_at_n = lam * out / (n * t_dec) if n else 0.0
    barriers = {"memory": n_mem, "throughput": n_thr, "latency": n_lat}
    result.binding_barriers = [name for name, value in barriers.items() if value == n_base and n_base > 0]


TTFT_PERCENTILE = 95  # the sweep chooses B_max on TTFT p95; the slot wait is taken at the same percentile


def _ttft_barrier(result: PlanResult, row: ThroughputRow, workload: Workload, slo: SLO) -> None:
    """``N_ttft``: the fewest replicas whose slot wait at p95 plus the TTFT p95 at B_max fits the TTFT
    SLO; it replaces N_base (and N with headroom) when larger, and joins the binding barriers."""
    lam = workload.arrival_rate_per_s
    service_s = workload.output_tokens / row.per_stream_tok_s
    ttft_p95 = row.ttft_p95_s if row.ttft_p95_s is not None else result.ttft_s
    n = int(lam * service_s / row.batch) + 1 if lam > 0 else 0  # the fewest replicas whose slots are stable
    while n and n < max(64, 16 * result.n_base):
        wait = wait_at_percentile(
            servers=n * row.batch, arrival_rate=lam, mean_s=service_s, percentile=TTFT_PERCENTILE
        )
        if wait + ttft_p95 <= slo.ttft_s:
            result.ttft_p95_at_n_base = wait + ttft_p95
            break
        n += 1
    result.n_ttft = n
    if n > result.n_base:
        result.n_base = n
        result.n_with_headroom = _ceil(n * (1 + result.headroom))
        result.rho_at_n_base = lam * workload.output_tokens / (n * result.t_dec_tok_s)
        result.rho_at_n = lam * workload.output_tokens / (result.n_with_headroom * result.t_dec_tok_s)
        result.binding_barriers = ["ttft"]
    elif n == result.n_base and n > 0:
        result.binding_barriers.append("ttft")


def _queue_waits(result: PlanResult, workload: Workload) -> None:
    """M/M/c over decode slots: N·B_max servers, each serving one stream for ō / stream_rate seconds."""
    lam = workload.arrival_rate_per_s
    service_s = workload.output_tokens / result.stream_tok_s_at_b_max
    result.queue_wait_prob_at_n_base, result.queue_wait_s_at_n_base = mmc_wait_s(
        servers=result.n_base * result.b_max, arrival_rate=lam, service_s=service_s
    )
    _, result.queue_wait_s_at_n = mmc_wait_s(
        servers=result.n_with_headroom * result.b_max, arrival_rate=lam, service_s=service_s
    )


def _costs_at_plan(result: PlanResult, hardware: Hardware, workload: Workload) -> None:
    if hardware.usd_per_gpu_hour <= 0:
        return
    lam, out = workload.arrival_rate_per_s, workload.output_tokens
    result.usd_per_1m_tokens_at_b_max = result.usd_per_1m_tokens_by_batch[result.b_max]
    result.usd_per_hour_at_plan = result.n_with_headroom * hardware.gpus_per_replica * hardware.usd_per_gpu_hour
    if lam > 0:
        result.usd_per_1m_tokens_at_plan = result.usd_per_hour_at_plan / (lam * out * 3600.0) * 1e6


def _validate_spike(spike: SpikeInput) -> None:
    errors = {}
    if not spike.load_multiplier >= 1:
        errors["spike.load_multiplier"] = "must be at least 1"
    if not spike.cold_start_s >= 0:
        errors["spike.cold_start_s"] = "must be non-negative"
    if not 0 < spike.utilization_ceiling <= 1:
        errors["spike.utilization_ceiling"] = "must lie in (0, 1]"
    if errors:
        raise PlannerInputError(errors)


def spike_scenario(
    *,
    spike: SpikeInput,
    arrival_rate_per_s: float,
    output_tokens: float,
    t_dec_tok_s: float,
    replicas_before: int,
    replica_req_s: float | None = None,
) -> SpikeResult:
    """Load jumps ×m: replicas to stay under the utilization ceiling, and the backlog while new ones cold-start.

    The replicas already running serve ``replica_req_s`` each (default T_dec(B_max) / ō); the rest queues up
    until the new ones are ready, then drains at the surplus rate.
    """
    spiked_tok_s = spike.load_multiplier * arrival_rate_per_s * output_tokens
    needed = _ceil(spiked_tok_s / (t_dec_tok_s * spike.utilization_ceiling))
    if replica_req_s is None:
        replica_req_s = t_dec_tok_s / output_tokens
    excess_req_s = max(0.0, spike.load_multiplier * arrival_rate_per_s - replicas_before * replica_req_s)
    backlog_requests = excess_req_s * spike.cold_start_s
    drain_rate = max(needed, replicas_before) * replica_req_s - spike.load_multiplier * arrival_rate_per_s
    if backlog_requests == 0:
        drain_s: float | None = 0.0
    else:
        drain_s = backlog_requests / drain_rate if drain_rate > 0 else None
    return SpikeResult(
        load_multiplier=spike.load_multiplier,
        cold_start_s=spike.cold_start_s,
        utilization_ceiling=spike.utilization_ceiling,
        replicas_needed=needed,
        replicas_before=replicas_before,
        extra_replicas=max(0, needed - replicas_before),
        backlog_requests=backlog_requests,
        backlog_tokens=backlog_requests * output_tokens,
        drain_s=drain_s,
    )


def _explain(r: PlanResult, workload: Workload, slo: SLO, ctx: float) -> str:
    if r.n_base == 0:
        return "No load (λ = 0): no replica is needed for traffic; keep min_replicas for availability."
    names = {
        "memory": f"memory (N_mem = ⌈L·ctx·kv_tok / M_KV⌉ = ⌈{r.l_in_flight:.1f}·{ctx:g}·{r.kv_tok_bytes:,.0f} B / "
        f"{r.m_kv_gb:g} GB⌉ = {r.n_mem})",
        "throughput": f"throughput (N_thr = ⌈λ·ō / T_dec(B_max)⌉ = ⌈{workload.arrival_rate_per_s:g}·"
        f"{workload.output_tokens:g} / {r.t_dec_tok_s:,.0f}⌉ = {r.n_thr})",
        "latency": f"latency (N_lat = ⌈L / B_max⌉ = ⌈{r.l_in_flight:.1f} / {r.b_max}⌉ = {r.n_lat})",
        "ttft": f"TTFT (N_ttft = {r.n_ttft}: slot wait p95 + TTFT p95 at B_max = "
        f"{(r.ttft_p95_at_n_base or 0.0):.2f} s within {slo.ttft_s if slo.ttft_s is not None else 0:g} s)",
    }
    binding = " and ".join(names[b] for b in r.binding_barriers)
    verb = "binds" if len(r.binding_barriers) == 1 else "bind together"
    text = (
        f"B_max = {r.b_max} ({r.b_max_reason}); W = {r.ttft_s:g} + {workload.output_tokens:g}/"
        f"{r.stream_tok_s_at_b_max:g} = {r.w_s:.2f} s, L = λ·W = {r.l_in_flight:.1f} in flight. "
        f"The {binding} {verb}: N_base = {r.n_base}, ρ = {r.rho_at_n_base:.2f}; with headroom r = {r.headroom:g}, "
        f"N = {r.n_with_headroom}."
    )
    if r.queue_wait_s_at_n_base is not None and math.isfinite(r.queue_wait_s_at_n_base):
        text += f" Erlang-C mean queue wait at N_base: {r.queue_wait_s_at_n_base * 1000:.1f} ms."
    if slo.ttft_s is not None and r.ttft_s is not None and r.queue_wait_s_at_n_base is not None:
        if r.ttft_s + r.queue_wait_s_at_n_base > slo.ttft_s:
            text += (
                f" Warning: TTFT {r.ttft_s:g} s plus queue wait exceeds the TTFT SLO of {slo.ttft_s:g} s at N_base."
            )
    return text


def table_from_dicts(rows: list[dict]) -> list[ThroughputRow]:
    """Throughput rows from JSON (a stored benchmark's table or an API body); unknown keys are ignored."""
    parsed = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or "batch" not in row or "per_stream_tok_s" not in row:
            raise PlannerInputError({f"throughput_table[{i}]": "needs batch and per_stream_tok_s"})
        try:
            parsed.append(
                ThroughputRow(
                    batch=int(row["batch"]),
                    per_stream_tok_s=float(row["per_stream_tok_s"]),
                    aggregate_tok_s=_opt_float(row.get("aggregate_tok_s")),
                    ttft_p50_s=_opt_float(row.get("ttft_p50_s")),
                    ttft_p95_s=_opt_float(row.get("ttft_p95_s")),
                )
            )
        except (TypeError, ValueError) as exc:
            raise PlannerInputError({f"throughput_table[{i}]": f"not a number: {exc}"}) from None
    return parsed


def _opt_float(value) -> float | None:
    return None if value is None else float(value)


WORKED_EXAMPLE = {
    "model": ModelShape(n_layers=40, n_kv_heads=8, d_head=128, dtype_bytes=2, weights_gb=26.0),
    "hardware": Hardware(gpu_memory_gb=80.0, overhead_gb=10.0, gpus_per_replica=1, usd_per_gpu_hour=2.5),
    "workload": Workload(arrival_rate_per_s=20.0, input_tokens=500, output_tokens=300, context_tokens=800),
    "slo": SLO(min_stream_tok_s=60.0),
    "throughput_table": [
        ThroughputRow(batch=16, per_stream_tok_s=105, aggregate_tok_s=1680),
        ThroughputRow(batch=64, per_stream_tok_s=68, aggregate_tok_s=4352),
        ThroughputRow(batch=128, per_stream_tok_s=44, aggregate_tok_s=5632),
    ],
    "headroom": 0.5,
    "ttft_s": 0.3,
    "spike": SpikeInput(load_multiplier=3.0, cold_start_s=90.0, utilization_ceiling=0.8),
}
"""docs/algorithms.md#the-worked-example: a 13B dense FP16 model on one 80 GB GPU at λ = 20 req/s, 500 in / 300 out,
≥ 60 tok/s per stream."""
