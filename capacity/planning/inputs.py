"""Planner inputs from stored objects: an endpoint, model and hardware profiles, a benchmark's throughput table.

Shared by ``POST /api/v1/capacity/plan`` and ``python manage.py plan_capacity``. Anything given explicitly in the
request wins over what is looked up; whatever is still missing is reported field by field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from capacity.hardware.profiles import get_profile
from capacity.models import CapacityBenchmark, HardwareProfile, ModelProfile
from capacity.planning import mix
from capacity.planning.barriers import (
    SLO,
    Hardware,
    ModelShape,
    PlannerInputError,
    PlanResult,
    SpikeInput,
    Workload,
    plan,
    table_from_dicts,
)
from capacity.planning.tensor_parallel import Topology, choose_tp, topology_answer
from capacity.unit_resolver import endpoint_benchmark, latest_benchmark_for


@dataclass
class PlanRequest:
    """Already type-checked input (the API serializer or the command's arguments produce it)."""

    workload: dict
    endpoint: object | None = None  # endpoints.models.Endpoint
    model_profile: ModelProfile | None = None
    hardware_profile: HardwareProfile | None = None
    benchmark: CapacityBenchmark | None = None
    model: dict | None = None
    hardware: dict | None = None
    throughput_table: list[dict] | None = None
    slo: dict | None = None
    headroom: float = 0.0
    ttft_s: float | None = None
    spike: dict | None = None
    choose_tp: bool = False  # plan at the TP size needing the fewest GPUs (capacity.planning.tensor_parallel)


TOPOLOGY_FIELDS = {
    "gpus_per_node": "gpus_per_node",
    "interconnect_domain_gpus": "domain_gpus",
    "domain_link_gb_s": "domain_link_gb_s",
    "cross_link_gb_s": "cross_link_gb_s",
    "mig_profile": "mig_profile",
}


def _model_shape(req: PlanRequest) -> ModelShape:
    given = dict(req.model or {})
    profile = req.model_profile or (req.endpoint.model_profile if req.endpoint else None)
    if profile is not None:
        for name in ("n_layers", "n_kv_heads", "d_head", "dtype_bytes", "weights_gb"):
            given.setdefault(name, getattr(profile, name))
    missing = [n for n in ("n_layers", "n_kv_heads", "d_head") if n not in given]
    if missing:
        raise PlannerInputError({"model": f"give model_profile, endpoint or model fields ({', '.join(missing)})"})
    return ModelShape(
        **{k: given[k] for k in ("n_layers", "n_kv_heads", "d_head", "dtype_bytes", "weights_gb") if k in given}
    )


def _topology(req: PlanRequest) -> Topology:
    """The shape and links a replica is placed on: the hardware profile's, with explicit ``hardware`` fields winning."""
    given = {TOPOLOGY_FIELDS[k]: v for k, v in (req.hardware or {}).items() if k in TOPOLOGY_FIELDS}
    profile = req.hardware_profile or (req.endpoint.hardware_profile if req.endpoint else None)
    if profile is not None:
        given.setdefault("gpus_per_node", profile.gpus_per_node)
        given.setdefault("domain_gpus", profile.interconnect_domain_gpus)
        given.setdefault("domain_node_label", profile.domain_node_label)
        given.setdefault("mig_profile", profile.mig_profile)
    return Topology(**given)


def _hardware(req: PlanRequest) -> Hardware:
    given = {k: v for k, v in (req.hardware or {}).items() if k not in TOPOLOGY_FIELDS}
    profile = req.hardware_profile or (req.endpoint.hardware_profile if req.endpoint else None)
    if profile is not None:
        given.setdefault("gpu_memory_gb", profile.gpu_memory_gb)
        given.setdefault("overhead_gb", profile.memory_overhead_gb)
        given.setdefault("gpus_per_replica", profile.gpus_per_replica)
        if profile.usd_per_gpu_hour is not None:
            given.setdefault("usd_per_gpu_hour", profile.usd_per_gpu_hour)
    if "gpu_memory_gb" not in given:
        raise PlannerInputError({"hardware": "give hardware_profile, endpoint or hardware.gpu_memory_gb"})
    return Hardware(**given)


def _benchmark(req: PlanRequest) -> CapacityBenchmark | None:
    if req.benchmark is not None:
        return req.benchmark
    if req.endpoint is not None:
        return endpoint_benchmark(req.endpoint)
    if req.model_profile is not None and req.hardware_profile is not None:
        return latest_benchmark_for(model_profile_id=req.model_profile.pk, hardware_profile_id=req.hardware_profile.pk)
    return None


def _slo(req: PlanRequest) -> SLO:
    given = dict(req.slo or {})
    if "tpot_ms" in given:
        tpot = given.pop("tpot_ms")
        given.setdefault("min_stream_tok_s", 1000.0 / tpot if tpot else 0.0)
    if "ttft_ms" in given:
        given.setdefault("ttft_s", given.pop("ttft_ms") / 1000.0)
    if req.endpoint is not None:
        given.setdefault("min_stream_tok_s", 1000.0 / req.endpoint.tpot_slo_ms)
        given.setdefault("ttft_s", req.endpoint.ttft_slo_ms / 1000.0)
    if "min_stream_tok_s" not in given:
        raise PlannerInputError({"slo": "give slo.min_stream_tok_s or slo.tpot_ms (or an endpoint)"})
    return SLO(**given)


def table_for_workload(benchmark: CapacityBenchmark, workload: dict) -> tuple[list[dict], str]:
    """The benchmark's throughput table measured with the shape nearest the workload's (input, output lengths):
    per-stream rates at a batch depend on the shape (long prompts interrupt decoding for longer)."""
    tables = (benchmark.detail or {}).get("tables") or {}
    best, best_distance = None, math.inf
    for label, table in tables.items():
        shape, rows = table.get("shape") or {}, table.get("rows") or []
        if not rows or "input_tokens" not in shape or "output_tokens" not in shape:
            continue
        distance = abs(math.log((1 + workload["input_tokens"]) / (1 + shape["input_tokens"]))) + abs(
            math.log((1 + workload["output_tokens"]) / (1 + shape["output_tokens"]))
        )
        if distance < best_distance:
            best, best_distance = (rows, label), distance
    return best or (benchmark.throughput_table, "reference")


def plan_from_request(req: PlanRequest) -> tuple[PlanResult, dict]:
    """Run the planner; returns the result and where each input came from, with the topology the plan assumed
    (``topology``) and, when the request asks the planner to choose the TP size, every size's figures
    (``tensor_parallel``)."""
    benchmark = None
    table = req.throughput_table
    if table is None:
        benchmark = _benchmark(req)
        if benchmark is None or not benchmark.throughput_table:
            raise PlannerInputError(
                {
                    "throughput_table": "give throughput_table, a benchmark, or an endpoint/profiles with a stored benchmark"
                }
            )
    workload = dict(req.workload)
    shape_label = None
    if benchmark is not None:
        table, shape_label = table_for_workload(benchmark, workload)
    hardware, topology = _hardware(req), _topology(req)
    args = {
        "model": _model_shape(req),
        "workload": Workload(**workload),
        "slo": _slo(req),
        "throughput_table": table_from_dicts(table),
        "headroom": req.headroom,
        "ttft_s": req.ttft_s,
        "spike": SpikeInput(**req.spike) if req.spike is not None else None,
    }
    extra = {}
    if req.choose_tp:
        choice = choose_tp(hardware=hardware, topology=topology, **args)
        result = choice.chosen_plan or PlanResult(feasible=False, explanation=choice.explanation)
        if choice.chosen is not None:
            result.explanation = f"{choice.explanation} {result.explanation}"
        extra["tensor_parallel"] = choice.as_dict()
        tp = choice.chosen or hardware.gpus_per_replica
    else:
        result = plan(hardware=hardware, **args)
        tp = hardware.gpus_per_replica
    extra["topology"] = topology_answer(topology, tp)
    sources = {
        "endpoint": req.endpoint.name if req.endpoint else None,
        "throughput_table": f"benchmark:{benchmark.pk} v{benchmark.version} shape {shape_label}"
        if benchmark
        else "given",
        **extra,
    }
    return result, sources


def plan_mix_from_profiles(
    *,
    profiles: list[tuple[HardwareProfile, str]],
    buckets: list[dict],
    ttft_s: float,
    tpot_s: float,
    time_limit_s: float = 10.0,
) -> dict:
    """The heterogeneous planner (``capacity.planning.mix``) over stored hardware profiles, each paired with the
    simulator roofline profile that gives its per-bucket capacity (``capacity/hardware/profiles.py``): the
    cheapest mix, the best single type beside it, and why. Raises ``mix.PlanError`` naming the field."""
    slo = mix.Slo(ttft_s=ttft_s, tpot_s=tpot_s)
    items = [mix.Bucket(**b) for b in buckets]
    for hardware, _ in profiles:
        if hardware.usd_per_gpu_hour is None:
            raise mix.PlanError("usd_per_gpu_hour", f"hardware profile {hardware.name!r} has no price per GPU-hour")
    types = [
        mix.ReplicaType(
            name=hardware.name,
            usd_per_gpu_hour=hardware.usd_per_gpu_hour,
            gpus_per_replica=hardware.gpus_per_replica,
            capacity_type=hardware.capacity_type,
            max_replicas=hardware.max_replicas,
        )
        for hardware, _ in profiles
    ]
    engines = {hardware.name: get_profile(sim_profile) for hardware, sim_profile in profiles}
    types = mix.with_capacities(types, engines, items, slo)
    plan_ = mix.plan_mix(items, types, time_limit_s=time_limit_s)
    try:
        single_name, single = mix.best_single_type(items, types)
        baseline = {"type": single_name, **single.as_dict()}
    except mix.PlanError as exc:
        baseline = {"type": None, "reason": exc.message}
    capacities = {t.name: {b: round(v, 4) for b, v in t.capacity_rps.items()} for t in types}
    # What the cost_aware router needs to route a fleet of these types (Endpoint.routing_plan; its shape:
    # gateway.routing.cost_aware.plan_figures): per type, its price and each bucket's SLO-compliant batch and rate.
    routing_plan = {
        "buckets": [
            {"name": b.name, "prompt_tokens": b.prompt_tokens, "output_tokens": b.output_tokens} for b in items
        ],
        "types": {
            t.name: {
                "usd_per_hour": round(t.usd_per_replica_hour, 6),
                "batch": {b.name: mix.bucket_fit(engines[t.name], b, slo)[0] for b in items},
                "rate_rps": capacities[t.name],
            }
            for t in types
        },
        "shares": plan_.shares,
    }
    return {
        **plan_.as_dict(),
        "capacity_rps": capacities,
        "best_single_type": baseline,
        "routing_plan": routing_plan,
    }
