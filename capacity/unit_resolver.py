"""Which model-unit coefficients an endpoint uses: its pinned benchmark, else the latest succeeded benchmark of its
(model, hardware) pair, else the model profile's defaults. Kept apart from ``capacity.units`` so that stays pure."""

from __future__ import annotations

import math

from capacity.models import CapacityBenchmark, HardwareProfile, ModelProfile
from capacity.units import MUCoefficients, relative_speed


def benchmark_coefficients(benchmark: CapacityBenchmark) -> MUCoefficients:
    return MUCoefficients(
        alpha=benchmark.alpha,
        alpha_cached=benchmark.alpha_cached,
        beta=benchmark.beta,
        gamma=benchmark.gamma,
        mu_per_min=benchmark.mu_per_min,
        source=f"benchmark:{benchmark.pk}",
        lora_overhead=benchmark.lora_overhead,
    )


def profile_coefficients(profile: ModelProfile) -> MUCoefficients:
    return MUCoefficients(
        alpha=profile.alpha,
        alpha_cached=profile.alpha_cached,
        beta=profile.beta,
        gamma=profile.gamma,
        mu_per_min=profile.mu_per_min,
        source="profile",
    )


def _usable(benchmark: CapacityBenchmark | None) -> bool:
    return (
        benchmark is not None
        and benchmark.status == CapacityBenchmark.Status.SUCCEEDED
        and all(
            value is not None
            for value in (
                benchmark.alpha,
                benchmark.alpha_cached,
                benchmark.beta,
                benchmark.gamma,
                benchmark.mu_per_min,
            )
        )
    )


def latest_benchmark_for(*, model_profile_id: int, hardware_profile_id: int) -> CapacityBenchmark | None:
    return (
        CapacityBenchmark.objects.filter(
            model_profile_id=model_profile_id,
            hardware_profile_id=hardware_profile_id,
            status=CapacityBenchmark.Status.SUCCEEDED,
        )
        .order_by("-version")
        .first()
    )


def endpoint_benchmark(endpoint) -> CapacityBenchmark | None:
    """The benchmark an endpoint's model units come from, or None when it runs on profile defaults."""
    pinned = endpoint.pinned_benchmark if endpoint.pinned_benchmark_id else None
    if _usable(pinned):
        return pinned
    latest = latest_benchmark_for(
        model_profile_id=endpoint.model_profile_id, hardware_profile_id=endpoint.hardware_profile_id
    )
    return latest if _usable(latest) else None


def endpoint_coefficients(endpoint) -> MUCoefficients:
    """The MU coefficients for one endpoint (one or two queries; the proxy caches them in its config snapshot)."""
    benchmark = endpoint_benchmark(endpoint)
    if benchmark is not None:
        return benchmark_coefficients(benchmark)
    return profile_coefficients(endpoint.model_profile)


def _latest_benchmarks(pairs: set[tuple[int, int]]) -> dict[tuple[int, int], CapacityBenchmark]:
    """The latest succeeded benchmark of each (model, hardware) pair that has one; one query."""
    latest: dict[tuple[int, int], CapacityBenchmark] = {}
    if pairs:
        candidates = CapacityBenchmark.objects.filter(
            model_profile_id__in={m for m, _ in pairs},
            hardware_profile_id__in={h for _, h in pairs},
            status=CapacityBenchmark.Status.SUCCEEDED,
        ).order_by("model_profile_id", "hardware_profile_id", "-version")
        for bench in candidates:
            latest.setdefault((bench.model_profile_id, bench.hardware_profile_id), bench)
    return latest


def _own_benchmark(pinned: CapacityBenchmark | None, latest: CapacityBenchmark | None) -> CapacityBenchmark | None:
    """The benchmark an endpoint's model units come from, of those already fetched: its pinned one if usable, else
    the latest of its pair (``endpoint_benchmark`` for many endpoints at once)."""
    return pinned if _usable(pinned) else latest


def coefficients_by_endpoint(endpoints) -> dict[int, MUCoefficients]:
    """Coefficients for many endpoints with a fixed number of queries (for config snapshots and the ledger)."""
    endpoints = list(endpoints)
    latest = _latest_benchmarks({(e.model_profile_id, e.hardware_profile_id) for e in endpoints})
    pinned_ids = {e.pinned_benchmark_id for e in endpoints if e.pinned_benchmark_id}
    pinned = CapacityBenchmark.objects.in_bulk(pinned_ids) if pinned_ids else {}
    profiles = ModelProfile.objects.in_bulk({e.model_profile_id for e in endpoints})
    result: dict[int, MUCoefficients] = {}
    for endpoint in endpoints:
        pair = (endpoint.model_profile_id, endpoint.hardware_profile_id)
        chosen = _own_benchmark(pinned.get(endpoint.pinned_benchmark_id), latest.get(pair))
        if _usable(chosen):
            result[endpoint.pk] = benchmark_coefficients(chosen)
        else:
            result[endpoint.pk] = profile_coefficients(profiles[endpoint.model_profile_id])
    return result


def hardware_speeds(triples: set[tuple[int, int, int, int | None]]) -> dict[tuple[int, int, int, int | None], float]:
    """(model, endpoint's hardware, replica's hardware, endpoint's pinned benchmark or None) → how fast a replica on
    the second hardware serves that model against one on the first, in two or three queries whatever the number of
    triples (the proxy's config snapshot: a replica of a mixed fleet weighs its load by its own speed,
    docs/algorithms.md#routing).

    From benchmarks where both pairs have one (``units.relative_speed``: their rates of the reference request): the
    endpoint's own is the one its model units come from (``endpoint_benchmark``: the pinned one, else the latest),
    the replica's hardware's the latest. Else from the roofline of decode, which reads the weights and the KV cache
    once per step (memory bandwidth × GPUs per replica, ``HardwareProfile``), else 1."""
    pairs = {(m, h) for m, a, b, _ in triples for h in (a, b)}
    latest = _latest_benchmarks(pairs)
    pinned_ids = {pin for *_, pin in triples if pin}
    pinned = CapacityBenchmark.objects.in_bulk(pinned_ids) if pinned_ids else {}
    hardware = HardwareProfile.objects.in_bulk({h for _, h in pairs}) if pairs else {}
    speeds = {}
    for triple in triples:
        model, reference, other, pin = triple
        measured = [_own_benchmark(pinned.get(pin), latest.get((model, reference))), latest.get((model, other))]
        if reference == other:
            speed = 1.0
        elif all(_usable(b) for b in measured):
            speed = relative_speed(*(benchmark_coefficients(b) for b in measured))
        else:
            bandwidth = [
                hardware[h].memory_bandwidth_gbps * hardware[h].gpus_per_replica if h in hardware else 0.0
                for h in (reference, other)
            ]
            speed = bandwidth[1] / bandwidth[0] if min(bandwidth) > 0 else 1.0
        speeds[triple] = speed if math.isfinite(speed) and speed > 0 else 1.0  # a benchmark that served nothing
    return speeds


def prefill_coefficients(endpoint) -> MUCoefficients:
    """The MU coefficients of a disaggregated endpoint's prefill pool: its pinned prefill benchmark, else the latest
    of its model on the prefill pool's hardware (the endpoint's when it names none), else the model's defaults."""
    pinned = endpoint.prefill_pinned_benchmark if endpoint.prefill_pinned_benchmark_id else None
    if _usable(pinned):
        return benchmark_coefficients(pinned)
    latest = latest_benchmark_for(
        model_profile_id=endpoint.model_profile_id,
        hardware_profile_id=endpoint.prefill_hardware_profile_id or endpoint.hardware_profile_id,
    )
    return benchmark_coefficients(latest) if _usable(latest) else profile_coefficients(endpoint.model_profile)
