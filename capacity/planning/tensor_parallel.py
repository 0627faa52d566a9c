"""The planner chooses the tensor-parallel size (pure: no Django): the three barriers per TP size (1, 2, 4, 8) with
an interconnect term, and the cheapest TP that holds the model and meets the TPOT SLO (docs/algorithms.md,
"Choosing the TP size").

A throughput table is measured at one TP size (the hardware's ``gpus_per_replica``); the table at another size comes
from the measured decode step, ``1 / per_stream_tok_s``, split into a fixed part (``STEP_OVERHEAD_S``: scheduling,
sampling, launches), the all-reduces of the measured size, and the rest, which reads weights and KV and divides over
the GPUs::

    step_t(b) = overhead + (step_0(b) − overhead − allreduce_t0(b)) · t0 / t + allreduce_t(b)
    allreduce_t(b) = 2 · n_layers · (latency + 2·(t − 1)/t · b · d_model · dtype_bytes / link_bandwidth)

two ring all-reduces per layer (after attention and after the MLP) of the batch's activations, over NVLink inside an
interconnect domain and over the slower link across domains. TTFT scales with the step. Memory per TP size: ``t``
GPUs hold the weights once, each GPU its own overhead (the profile's overhead is its replica's, spread over its
GPUs), and the rest is KV cache, which must hold one request's context at least. Cost is GPUs: replicas with
headroom × TP; ties go to the smaller TP (fewer all-reduces, more replicas to lose one of).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

from capacity.planning.barriers import (
    SLO,
    Hardware,
    ModelShape,
    PlanResult,
    SpikeInput,
    ThroughputRow,
    Workload,
    kv_bytes_per_token,
    plan,
)
from placement import mig
from placement.cluster import Cluster, Node
from placement.policies import Fit, group_fit

TP_SIZES = (1, 2, 4, 8)
STEP_OVERHEAD_S = 0.0005  # per decode step, whatever the TP size (capacity/hardware/roofline.py's Efficiency)


@dataclass(frozen=True)
class Topology:
    """The shape a TP group is placed on and its links. Bandwidths are one direction, per GPU: NVLink 4 (H100) moves
    450 GB/s each way; across domains a 400 Gb/s NIC per GPU, 50 GB/s."""

    gpus_per_node: int = 8
    domain_gpus: int = 8
    domain_node_label: str = "kubernetes.io/hostname"
    domain_link_gb_s: float = 450.0
    domain_latency_s: float = 8e-6
    cross_link_gb_s: float = 50.0
    cross_latency_s: float = 25e-6
    mig_profile: str = ""  # a MIG slice (placement/mig.py): a replica is one slice, TP 1 only

    def fit(self, tp: int) -> Fit:
        """Where a TP-``tp`` group goes on this shape (one MIG slice where the hardware is sliced), or why nowhere."""
        return mig.slice_fit(self.mig_profile, tp) if self.mig_profile else group_fit(self.shape(), tp)

    def link_name(self, tp: int) -> str:
        if tp <= 1:
            return "none (one MIG slice)" if self.mig_profile else "none (one GPU)"
        return self.link(tp)[0]

    def link(self, tp: int) -> tuple[str, float, float]:
        """(name, GB/s, latency s) of the link a TP group's all-reduces cross."""
        if tp <= self.domain_gpus:
            return "NVLink inside one domain", self.domain_link_gb_s, self.domain_latency_s
        return "the link across domains", self.cross_link_gb_s, self.cross_latency_s

    def shape(self) -> Cluster:
        """One interconnect domain (HardwareProfile.domain_shape): a node of islands, or a rack-scale domain."""
        per_node, domain = self.gpus_per_node, self.domain_gpus
        if domain <= per_node:
            return Cluster([Node("node", per_node, island=domain if per_node % domain == 0 else None)])
        return Cluster([Node(f"node-{i}", per_node, domain="domain") for i in range(max(1, domain // per_node))])


def d_model(model: ModelShape) -> float:
    """The hidden size, from the weights: a dense transformer has ≈ 12·n_layers·d_model² parameters."""
    params = model.weights_gb * 1e9 / model.dtype_bytes
    return math.sqrt(params / (12 * model.n_layers)) if params > 0 else 0.0


def allreduce_s(model: ModelShape, topology: Topology, tp: int, batch: int, hidden: float | None = None) -> float:
    """All-reduce time of one decode step of ``batch`` sequences on a TP-``tp`` group; 0 for one GPU."""
    if tp <= 1:
        return 0.0
    _, gb_s, latency = topology.link(tp)
    hidden = d_model(model) if hidden is None else hidden
    message = batch * hidden * model.dtype_bytes
    return 2 * model.n_layers * (latency + 2 * (tp - 1) / tp * message / (gb_s * 1e9))


def table_at_tp(
    table: list[ThroughputRow], *, base_tp: int, tp: int, model: ModelShape, topology: Topology, hidden=None
) -> list[ThroughputRow]:
    """The throughput table at ``tp`` GPUs from one measured at ``base_tp`` (the module's step formula)."""
    rows = []
    for row in table:
        step0 = 1.0 / row.per_stream_tok_s
        split = max(0.0, step0 - STEP_OVERHEAD_S - allreduce_s(model, topology, base_tp, row.batch, hidden))
        step = min(STEP_OVERHEAD_S, step0) + split * base_tp / tp + allreduce_s(model, topology, tp, row.batch, hidden)
        ratio = step0 / step
        rows.append(
            ThroughputRow(
                batch=row.batch,
                per_stream_tok_s=row.per_stream_tok_s * ratio,
                aggregate_tok_s=row.aggregate_tok_s * ratio if row.aggregate_tok_s is not None else None,
                ttft_p50_s=row.ttft_p50_s / ratio if row.ttft_p50_s is not None else None,
                ttft_p95_s=row.ttft_p95_s / ratio if row.ttft_p95_s is not None else None,
            )
        )
    return rows


@dataclass
class TpCandidate:
    tp: int
    link: str
    placement: str  # the topology assumed: where a group of tp GPUs goes (group_fit's reason)
    placeable: bool
    nodes: int
    kv_gb: float
    fits_memory: bool
    meets_slo: bool = False
    allreduce_ms_at_b_max: float | None = None
    replicas: int | None = None
    gpus: int | None = None
    usd_per_hour: float | None = None
    reason: str = ""
    plan: PlanResult | None = None


@dataclass
class TpChoice:
    chosen: int | None
    base_tp: int
    topology: dict
    candidates: list[TpCandidate] = field(default_factory=list)
    explanation: str = ""

    @property
    def chosen_plan(self) -> PlanResult | None:
        return next((c.plan for c in self.candidates if c.tp == self.chosen), None)

    def as_dict(self) -> dict:
        data = asdict(self)
        for row in data["candidates"]:
            row.pop("plan")
        return data


def choose_tp(
    *,
    model: ModelShape,
    hardware: Hardware,
    workload: Workload,
    slo: SLO,
    throughput_table: list[ThroughputRow],
    topology: Topology,
    headroom: float = 0.0,
    ttft_s: float | None = None,
    spike: SpikeInput | None = None,
    sizes: tuple[int, ...] = TP_SIZES,
    hidden: float | None = None,
) -> TpChoice:
    """Plan at every TP size in ``sizes`` and choose the one needing the fewest GPUs among those whose group fits one
    domain, whose memory holds the weights and one request's KV, and whose table meets the SLO. ``hardware`` is the
    measured replica's (its ``gpus_per_replica`` is the table's TP size)."""
    base_tp = hardware.gpus_per_replica
    ctx = (
        workload.context_tokens
        if workload.context_tokens is not None
        else workload.input_tokens + workload.output_tokens
    )
    choice = TpChoice(chosen=None, base_tp=base_tp, topology=asdict(topology))
    for tp in sorted(set(sizes) | {base_tp}):
        choice.candidates.append(
            _candidate(tp, model, hardware, workload, slo, throughput_table, topology, ctx,
                       headroom=headroom, ttft_s=ttft_s, spike=spike, hidden=hidden)
        )  # fmt: skip
    ok = [c for c in choice.candidates if c.placeable and c.fits_memory and c.meets_slo]
    if ok:
        best = min(ok, key=lambda c: (c.gpus, c.tp))
        choice.chosen = best.tp
        choice.explanation = (
            f"TP {best.tp}: {best.replicas} replica{'s' if best.replicas != 1 else ''} × {best.tp} GPU"
            f"{'s' if best.tp != 1 else ''} = {best.gpus} GPUs, the fewest of the TP sizes that hold the model and "
            f"meet the SLO; {best.placement}."
        )
    else:
        choice.explanation = "No TP size fits: " + "; ".join(f"TP {c.tp}: {c.reason}" for c in choice.candidates)
    return choice


def _candidate(tp, model, hardware, workload, slo, table, topology, ctx, **plan_args) -> TpCandidate:
    hidden = plan_args.pop("hidden")
    fit = topology.fit(tp)
    per_gpu_overhead = hardware.overhead_gb / hardware.gpus_per_replica
    at_tp = replace(hardware, gpus_per_replica=tp, overhead_gb=per_gpu_overhead * tp)
    kv_gb = at_tp.gpu_memory_gb * tp - model.weights_gb - at_tp.overhead_gb
    need_gb = ctx * kv_bytes_per_token(model) / 1e9
    candidate = TpCandidate(
        tp=tp,
        link=topology.link_name(tp),
        placement=fit.reason
        if fit.fits or topology.mig_profile
        else f"{fit.reason} (domains of {topology.domain_gpus} GPUs)",
        placeable=fit.fits,
        nodes=fit.nodes,
        kv_gb=kv_gb,
        fits_memory=kv_gb >= need_gb and kv_gb > 0,
    )
    if not candidate.fits_memory:
        candidate.reason = (
            f"{tp} × {at_tp.gpu_memory_gb:g} GB − weights {model.weights_gb:g} GB − overhead {at_tp.overhead_gb:g} GB "
            f"leaves {kv_gb:.1f} GB of KV, under one request's {need_gb:.2f} GB"
        )
        return candidate
    derived = table_at_tp(
        table, base_tp=hardware.gpus_per_replica, tp=tp, model=model, topology=topology, hidden=hidden
    )
    result = plan(model=model, hardware=at_tp, workload=workload, slo=slo, throughput_table=derived, **plan_args)
    candidate.plan = result
    candidate.meets_slo = result.feasible
    if not result.feasible:
        candidate.reason = result.b_max_reason
        return candidate
    candidate.allreduce_ms_at_b_max = allreduce_s(model, topology, tp, result.b_max, hidden) * 1e3
    candidate.replicas = result.n_with_headroom
    candidate.gpus = result.n_with_headroom * tp
    candidate.usd_per_hour = candidate.gpus * hardware.usd_per_gpu_hour
    candidate.reason = (
        f"B_max {result.b_max} at {result.stream_tok_s_at_b_max:.1f} tok/s per stream, {candidate.replicas} "
        f"replicas, {candidate.gpus} GPUs" + ("" if fit.fits else "; not placeable: no domain holds the group")
    )
    return candidate


def topology_answer(topology: Topology, tp: int) -> dict:
    """What a plan's "fits" assumed: the shape, and where one replica of ``tp`` GPUs goes on it."""
    fit = topology.fit(tp)
    return {
        "gpus_per_node": topology.gpus_per_node,
        "interconnect_domain_gpus": topology.domain_gpus,
        "domain_node_label": topology.domain_node_label,
        "gpus_per_replica": tp,
        "fits": fit.fits,
        "nodes": fit.nodes,
        "reason": fit.reason,
        "mig_profile": topology.mig_profile,
        "link": topology.link_name(tp),
    }
