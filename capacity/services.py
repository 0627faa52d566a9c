"""Writes of the capacity app: selling reservations within the overcommit limit, and benchmark records.

``tenants.services.reservation_create/update`` delegate here (``reservation_sell``, ``reservation_resize``), so the
API, the console and the admin all go through the same overcommit check.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from capacity.ledger import endpoint_sellable_mu_per_min, endpoint_sold_mu_per_min
from capacity.models import CapacityBenchmark, HardwareProfile, ModelProfile
from endpoints.models import Endpoint
from tenants.models import CapacityReservation, Tenant
from tenants.services import audit_log


class OvercommitRefused(ValidationError):
    """A sale that would push sold MU/min beyond the overcommit limit times the endpoint's capacity."""

    def __init__(self, message: str, *, detail: dict):
        self.detail = detail
        super().__init__({"mu_per_min": [message]})


def overcommit_limit() -> float:
    return float(settings.INFERCAP["OVERCOMMIT_LIMIT"])


def _check_overcommit(*, endpoint: Endpoint, sold_others: float, mu_per_min: float) -> dict:
    limit = overcommit_limit()
    sellable, replicas, per_replica = endpoint_sellable_mu_per_min(endpoint)
    sold_after = sold_others + mu_per_min
    detail = {
        "endpoint": endpoint.name,
        "requested_mu_per_min": mu_per_min,
        "sold_before_mu_per_min": sold_others,
        "sold_after_mu_per_min": sold_after,
        "capacity_mu_per_min": sellable,
        "overcommit_limit": limit,
        "available_mu_per_min": max(0.0, limit * sellable - sold_others),
    }
    # A small epsilon so that selling exactly up to the limit is never refused by float rounding.
    if sold_after > limit * sellable * (1 + 1e-9):
        if sellable <= 0:
            message = (
                f"Endpoint {endpoint.name} has no capacity to sell: no ready replica and min_replicas is 0. "
                "Start replicas (or raise min_replicas) first."
            )
        else:
            message = (
                f"Refused: selling {mu_per_min:g} MU/min on {endpoint.name} would bring sold capacity to "
                f"{sold_after:g} MU/min, {sold_after / sellable:.2f}× its capacity of {sellable:g} MU/min "
                f"({replicas} replicas × {per_replica:g} MU/min); the overcommit limit is {limit:g}×, so at most "
                f"{detail['available_mu_per_min']:g} MU/min more can be sold."
            )
        raise OvercommitRefused(message, detail=detail)
    return detail


def reservation_sell(
    *, tenant: Tenant, endpoint: Endpoint, mu_per_min: float, actor=None, **options
) -> CapacityReservation:
    """Sell ``mu_per_min`` on ``endpoint`` to ``tenant``; refused with OvercommitRefused beyond the limit."""
    with transaction.atomic():
        # Lock the endpoint row so two concurrent sales cannot both pass the check.
        endpoint = Endpoint.objects.select_for_update().get(pk=endpoint.pk)
        reservation = CapacityReservation(tenant=tenant, endpoint=endpoint, mu_per_min=mu_per_min, **options)
        reservation.full_clean()
        detail = _check_overcommit(
            endpoint=endpoint, sold_others=endpoint_sold_mu_per_min(endpoint), mu_per_min=mu_per_min
        )
        reservation.save()
        audit_log(actor=actor, action="reservation.create", obj=reservation, tenant=tenant, detail=detail)
    return reservation


def reservation_resize(*, reservation: CapacityReservation, mu_per_min: float, actor=None) -> CapacityReservation:
    """Change a reservation's size; growing it goes through the overcommit check, shrinking always succeeds."""
    with transaction.atomic():
        endpoint = Endpoint.objects.select_for_update().get(pk=reservation.endpoint_id)
        before = CapacityReservation.objects.get(pk=reservation.pk).mu_per_min
        reservation.mu_per_min = mu_per_min
        reservation.full_clean(validate_unique=False)
        detail = {"mu_per_min": [before, mu_per_min]}
        if mu_per_min > before:
            sold_others = endpoint_sold_mu_per_min(endpoint, exclude_reservation_id=reservation.pk)
            detail |= _check_overcommit(endpoint=endpoint, sold_others=sold_others, mu_per_min=mu_per_min)
        reservation.save(update_fields=["mu_per_min", "updated_at"])
        if before != mu_per_min:
            audit_log(actor=actor, action="reservation.resize", obj=reservation, detail=detail)
    return reservation


# --- Benchmarks ---------------------------------------------------------------------------------------------------


def benchmark_start(
    *, model_profile: ModelProfile, hardware_profile: HardwareProfile, detail: dict | None = None, actor=None
) -> CapacityBenchmark:
    """A new RUNNING benchmark with the next version number of its (model, hardware) pair."""
    with transaction.atomic():
        # Lock the profile so two sweeps of the same pair cannot take the same version.
        ModelProfile.objects.select_for_update().get(pk=model_profile.pk)
        latest = CapacityBenchmark.objects.filter(model_profile=model_profile, hardware_profile=hardware_profile)
        version = (latest.aggregate(v=Max("version"))["v"] or 0) + 1
        benchmark = CapacityBenchmark.objects.create(
            model_profile=model_profile, hardware_profile=hardware_profile, version=version, detail=detail or {}
        )
        audit_log(actor=actor, action="benchmark.start", obj=benchmark, detail={"version": version})
    return benchmark


def benchmark_complete(*, benchmark: CapacityBenchmark, result: dict, actor=None) -> CapacityBenchmark:
    """Store a finished sweep's table and fit (``result`` from ``capacity.benchmarking.run_sweep``)."""
    fit = result["fit"]
    benchmark.status = CapacityBenchmark.Status.SUCCEEDED
    benchmark.finished_at = timezone.now()
    benchmark.throughput_table = result["throughput_table"]
    benchmark.b_max = result["b_max"]
    benchmark.alpha, benchmark.alpha_cached = fit["alpha"], fit["alpha_cached"]
    benchmark.beta, benchmark.gamma = fit["beta"], fit["gamma"]
    benchmark.mu_per_min = result["mu_per_min"]
    benchmark.fit_error = fit["held_out_relative_error"]
    benchmark.detail = {**benchmark.detail, **{k: v for k, v in result.items() if k != "throughput_table"}}
    benchmark.save()
    audit_log(
        actor=actor,
        action="benchmark.complete",
        obj=benchmark,
        detail={"b_max": benchmark.b_max, "mu_per_min": benchmark.mu_per_min, "fit_error": benchmark.fit_error},
    )
    return benchmark


def benchmark_fail(*, benchmark: CapacityBenchmark, reason: str, actor=None) -> CapacityBenchmark:
    benchmark.status = CapacityBenchmark.Status.FAILED
    benchmark.finished_at = timezone.now()
    benchmark.detail = {**benchmark.detail, "error": reason[:2000]}
    benchmark.save(update_fields=["status", "finished_at", "detail"])
    audit_log(actor=actor, action="benchmark.fail", obj=benchmark, detail={"error": reason[:500]})
    return benchmark


def endpoint_pin_benchmark(*, endpoint: Endpoint, benchmark: CapacityBenchmark | None, actor=None) -> Endpoint:
    """Pin an endpoint to one benchmark version (None: follow the latest succeeded one)."""
    if benchmark is not None:
        if benchmark.status != CapacityBenchmark.Status.SUCCEEDED:
            raise ValidationError({"benchmark": ["only a succeeded benchmark can be pinned"]})
        if (benchmark.model_profile_id, benchmark.hardware_profile_id) != (
            endpoint.model_profile_id,
            endpoint.hardware_profile_id,
        ):
            raise ValidationError(
                {"benchmark": ["the benchmark is for another model or hardware than the endpoint's"]}
            )
    endpoint.pinned_benchmark = benchmark
    endpoint.save(update_fields=["pinned_benchmark", "updated_at"])
    audit_log(
        actor=actor,
        action="endpoint.pin_benchmark",
        obj=endpoint,
        tenant=endpoint.owner_tenant,
        detail={"benchmark": benchmark.pk if benchmark else None},
    )
    return endpoint
