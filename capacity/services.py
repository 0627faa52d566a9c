"""Writes of the capacity app: selling reservations within the overcommit limit, and benchmark records.

Every sale and resize (the REST API's ``reservation_create/update``, the console, the admin) goes through
``reservation_sell`` and ``reservation_resize``, so all of them meet the same overcommit check.
"""

from __future__ import annotations

from pathlib import Path

from celery import signature
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Max, Q
from django.utils import timezone

from capacity.ledger import endpoint_sellable_mu_per_min, endpoint_sold_mu_per_min
from capacity.models import CapacityBenchmark, HardwareProfile, ModelProfile
from capacity.replica_benchmark.http_driver import HttpReplicaDriver
from capacity.replica_benchmark.sweep import BenchmarkError, Progress, Shape, SweepConfig, run_sweep
from capacity.runtimes.lora_artifacts import (
    ArtifactError,
    artifact_fingerprint,
    engine_name,
    owner_root,
    resolve_under_root,
)
from endpoints.models import (
    ROLLOUT_ACTIVE_STATES,
    Adapter,
    Endpoint,
    EndpointVersion,
    Replica,
    ReplicaRole,
    ReplicaState,
    Rollout,
    Runtime,
    ServingMode,
)
from tenants.models import CapacityReservation, Tenant
from tenants.services import audit_log, field_changes, validated_save


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
        if reservation.adapter_id is not None:
            detail = {"adapter": reservation.adapter.name, **detail}
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


def _check_reservation_unique(reservation: CapacityReservation) -> None:
    """One base-model reservation per (tenant, endpoint) and one per (tenant, endpoint, adapter), as the two
    constraints say, with a message that says what to do."""
    clash = CapacityReservation.objects.filter(
        tenant_id=reservation.tenant_id, endpoint_id=reservation.endpoint_id, adapter_id=reservation.adapter_id
    )
    if reservation.pk:
        clash = clash.exclude(pk=reservation.pk)
    if not clash.exists():
        return
    if reservation.adapter_id is not None:
        raise ValidationError(
            {"adapter": ["this tenant already holds a reservation for this adapter; change that one"]}
        )
    raise ValidationError({"endpoint": ["this tenant already holds a reservation on this endpoint; change that one"]})


def reservation_create(*, tenant: Tenant, endpoint, mu_per_min: float, actor=None, **options) -> CapacityReservation:
    """Sell capacity (the REST API): field errors first, then ``reservation_sell`` and its overcommit check."""
    reservation = CapacityReservation(tenant=tenant, endpoint=endpoint, mu_per_min=mu_per_min, **options)
    _check_reservation_unique(reservation)
    reservation.full_clean(validate_unique=False)
    return reservation_sell(tenant=tenant, endpoint=endpoint, mu_per_min=mu_per_min, actor=actor, **options)


def reservation_update(*, reservation: CapacityReservation, actor=None, **changes) -> CapacityReservation:
    """Change a reservation; a new MU/min goes through ``reservation_resize`` (a larger one, the overcommit check)."""
    if "mu_per_min" in changes:
        reservation = reservation_resize(reservation=reservation, mu_per_min=changes.pop("mu_per_min"), actor=actor)
    with transaction.atomic():
        diff = field_changes(reservation, changes)
        _check_reservation_unique(reservation)
        validated_save(reservation)
        if diff:
            audit_log(actor=actor, action="reservation.update", obj=reservation, detail={"changes": diff})
    return reservation


@transaction.atomic
def reservation_delete(*, reservation: CapacityReservation, actor=None) -> None:
    detail = {"endpoint": reservation.endpoint_id, "mu_per_min": reservation.mu_per_min}
    if reservation.adapter_id is not None:
        detail["adapter"] = reservation.adapter.name
    audit_log(actor=actor, action="reservation.delete", obj=reservation, detail=detail)
    reservation.delete()


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
    """Store a finished sweep's table and fit (``result`` from ``capacity.replica_benchmark.sweep.run_sweep``)."""
    fit = result["fit"]
    benchmark.status = CapacityBenchmark.Status.SUCCEEDED
    benchmark.finished_at = timezone.now()
    benchmark.throughput_table = result["throughput_table"]
    benchmark.b_max = result["b_max"]
    benchmark.alpha, benchmark.alpha_cached = fit["alpha"], fit["alpha_cached"]
    benchmark.beta, benchmark.gamma = fit["beta"], fit["gamma"]
    benchmark.mu_per_min = result["mu_per_min"]
    benchmark.fit_error = fit["held_out_relative_error"]
    lora = result.get("lora_overhead")
    if lora is not None:
        benchmark.lora_overhead, benchmark.lora_overhead_samples = lora["overhead"], lora["samples"]
    benchmark.detail = {**benchmark.detail, **{k: v for k, v in result.items() if k != "throughput_table"}}
    benchmark.save()
    audit_log(
        actor=actor,
        action="benchmark.complete",
        obj=benchmark,
        detail={
            "b_max": benchmark.b_max,
            "mu_per_min": benchmark.mu_per_min,
            "fit_error": benchmark.fit_error,
            "lora_overhead": benchmark.lora_overhead,
        },
    )
    return benchmark


def benchmark_fail(*, benchmark: CapacityBenchmark, reason: str, actor=None) -> CapacityBenchmark:
    benchmark.status = CapacityBenchmark.Status.FAILED
    benchmark.finished_at = timezone.now()
    benchmark.detail = {**benchmark.detail, "error": reason[:2000]}
    benchmark.save(update_fields=["status", "finished_at", "detail", "throughput_table"])
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


# A short sweep for tests, demos and `--quick`: fewer levels and shapes, shorter outputs.
QUICK_SWEEP = {
    "levels": (1, 8, 16),
    "reference_shape": Shape(512, 64),
    "fit_shapes": (Shape(128, 32), Shape(1024, 32), Shape(128, 128), Shape(768, 128, shared_prefix_tokens=512)),
    "held_out_shapes": (Shape(512, 96), Shape(640, 64, shared_prefix_tokens=256)),
    "requests_per_stream": 6,
    "grid_multipliers": (),
}


# The shortest sweep that still fits the four coefficients and measures two held-out shapes (`--smoke`): a CPU
# engine in CI, or a first look at a replica just attached. Two levels, short outputs, one shape with a shared
# prefix (so α_c is measured, not guessed), ~50 requests in all; its figures are rough, its shape is the full one's.
SMOKE_SWEEP = {
    "levels": (1, 2),
    "reference_shape": Shape(128, 8),
    "fit_shapes": (Shape(32, 4), Shape(384, 4), Shape(32, 16), Shape(384, 16, shared_prefix_tokens=256)),
    "held_out_shapes": (Shape(128, 8), Shape(256, 12, shared_prefix_tokens=128)),
    "requests_per_stream": 3,
    "min_requests": 6,
    "bisect_steps": 0,
    "grid_multipliers": (),
}


def endpoint_sweep_config(endpoint: Endpoint, *, quick: bool = False, **overrides) -> SweepConfig:
    """The sweep for an endpoint: its SLOs, its hardware's GPUs, at most its concurrency ceiling."""
    options = {
        "tpot_slo_ms": float(endpoint.tpot_slo_ms),
        "ttft_slo_ms": float(endpoint.ttft_slo_ms),
        "gpus_per_replica": endpoint.hardware_profile.gpus_per_replica,
        "max_concurrency": endpoint.concurrency_max,
        **(QUICK_SWEEP if quick else {}),
        **overrides,
    }
    return SweepConfig(**options)


def benchmark_target(
    endpoint: Endpoint, *, replica: Replica | None = None, url: str | None = None
) -> tuple[str, float]:
    """(URL, time scale) of the replica to measure: the given one, else the endpoint's first ready replica.

    A simulated replica runs ``launch_options["speed"]`` times faster than modeled; times are scaled back.
    """
    if url is None:
        if replica is None:
            replica = endpoint.replicas.filter(state=ReplicaState.READY, is_standby=False).exclude(url="").first()
        if replica is None or not replica.url:
            raise ValidationError(
                {"replica": [f"endpoint {endpoint.name} has no ready replica with a URL to benchmark"]}
            )
        url = replica.url
    speed = 1.0
    if endpoint.runtime == Runtime.SIM:
        try:
            speed = float((endpoint.launch_options or {}).get("speed", 1.0))
        except (TypeError, ValueError):
            speed = 1.0
    return url, speed if speed > 0 else 1.0


def benchmark_run(
    *,
    endpoint: Endpoint,
    replica: Replica | None = None,
    url: str | None = None,
    time_scale: float | None = None,
    quick: bool = False,
    pin: bool = False,
    overrides: dict | None = None,
    progress: Progress | None = None,
    actor=None,
    driver=None,
    adapter_driver=None,
) -> CapacityBenchmark:
    """Benchmark one live replica of ``endpoint`` and store the result as the next version of its (model,
    hardware) pair. A failure is stored too (status failed, with the reason) and re-raised as BenchmarkError.

    An endpoint with LoRA on and an adapter registered also gets the LoRA pass (``sweep.fit_lora_overhead``): its
    highest-rank adapter is loaded on the replica (and left there, the least recently used for the proxy) and named
    as ``model``. An adapter that cannot be loaded leaves the overhead unmeasured, not the benchmark failed."""
    target, speed = benchmark_target(endpoint, replica=replica, url=url) if driver is None else ("", 1.0)
    scale = time_scale if time_scale is not None else speed
    cfg = endpoint_sweep_config(endpoint, quick=quick, **(overrides or {}))
    benchmark = benchmark_start(
        model_profile=endpoint.model_profile,
        hardware_profile=endpoint.hardware_profile,
        detail={"endpoint": endpoint.name, "url": target, "time_scale": scale, "quick": quick, "progress": []},
        actor=actor,
    )
    lines: list[str] = []

    def report(message: str) -> None:
        lines.append(message)
        if progress is not None:
            progress(message)
        # The admin and console show how far a running benchmark got.
        CapacityBenchmark.objects.filter(pk=benchmark.pk).update(detail={**benchmark.detail, "progress": lines[-50:]})

    try:
        if driver is None:
            driver = HttpReplicaDriver(target, time_scale=scale)
            adapter_driver = _adapter_driver(endpoint, driver, report)
        result = run_sweep(driver, cfg, report, adapter_driver=adapter_driver)
    except Exception as exc:
        # Whatever went wrong, the record must not stay "running" forever.
        benchmark.detail["progress"] = lines[-50:]
        benchmark_fail(benchmark=benchmark, reason=f"{type(exc).__name__}: {exc}", actor=actor)
        if isinstance(exc, (BenchmarkError, ValueError, OSError)):
            raise BenchmarkError(str(exc)) from exc
        raise
    benchmark.detail["progress"] = lines[-50:]
    if not result["feasible"]:
        benchmark.throughput_table = result["throughput_table"]
        benchmark_fail(benchmark=benchmark, reason=result["explanation"], actor=actor)
        raise BenchmarkError(result["explanation"])
    benchmark_complete(benchmark=benchmark, result=result, actor=actor)
    if pin:
        endpoint_pin_benchmark(endpoint=endpoint, benchmark=benchmark, actor=actor)
    return benchmark


def _lora_root() -> Path:
    # endpoints.adapters.lora_root's rule; that module sits above this one in the services contract (pyproject.toml).
    return Path(settings.INFERCAP.get("LORA_ROOT") or Path(settings.BASE_DIR) / "var" / "lora")


def _adapter_driver(endpoint: Endpoint, driver: HttpReplicaDriver, report: Progress) -> HttpReplicaDriver | None:
    """The driver for the LoRA pass (requests naming the endpoint's highest-rank adapter), after loading it on the
    replica; None when the endpoint serves no adapter or the load fails (reported)."""
    if endpoint.lora[0] <= 0:
        return None
    adapter = Adapter.objects.filter(endpoint=endpoint).order_by("-rank", "name").first()
    if adapter is None:
        return None
    try:
        path = resolve_under_root(adapter.artifact_path, root=owner_root(_lora_root(), adapter.owner_tenant_id))
        # Under the engine name the proxies use for this artifact version (docs/lora-serving.md), so they count it.
        name = engine_name(
            adapter_id=adapter.pk, owner_tenant_id=adapter.owner_tenant_id, fingerprint=artifact_fingerprint(path)
        )
        driver.load_adapter(name, str(path))
    except (ArtifactError, BenchmarkError) as exc:
        report(f"LoRA overhead not measured: adapter {adapter.name}: {exc}")
        return None
    report(f"LoRA pass with adapter {adapter.name} (rank {adapter.rank})")
    return driver.for_model(name)


def benchmark_enqueue(
    *, endpoint: Endpoint, replica: Replica | None = None, quick: bool = False, pin: bool = False, actor=None
) -> None:
    """Run the benchmark in a worker, once the caller's transaction commits; the sweep takes minutes."""
    benchmark_target(endpoint, replica=replica)  # refuse now, not in the worker, when there is nothing to measure
    audit_log(
        actor=actor,
        action="benchmark.enqueue",
        obj=endpoint,
        tenant=endpoint.owner_tenant,
        detail={"replica": replica.pk if replica else None, "quick": quick, "pin": pin},
    )
    # By name (workers.tasks.capacity.benchmark_endpoint): the task module imports this one.
    task = signature(
        "capacity.benchmark_endpoint",
        args=[endpoint.pk, replica.pk if replica else None],
        kwargs={"quick": quick, "pin": pin},
    )
    transaction.on_commit(task.delay)


def simulated_profiles_get_or_create() -> tuple[HardwareProfile, ModelProfile]:
    """The (hardware, model) pair of the simulator's default profile: the 13B dense FP16 model on an 80 GB GPU of
    docs/algorithms.md#the-worked-example.

    Shared by the demo world (``seed_demo``) and the reliability harness, so both describe the same replicas.
    """
    hardware, _ = HardwareProfile.objects.get_or_create(
        name="sim-a100-80g",
        defaults=dict(
            gpu_type="A100-80GB (simulated)",
            gpus_per_replica=1,
            gpu_memory_gb=80,
            memory_bandwidth_gbps=2039,
            usd_per_gpu_hour=2.5,
        ),
    )
    model, _ = ModelProfile.objects.get_or_create(
        name="llama-13b-sim",
        defaults=dict(
            parameters_b=13, n_layers=40, n_kv_heads=8, d_head=128, dtype_bytes=2, weights_gb=26, max_model_len=4096
        ),
    )
    return hardware, model


# -- profiles: the platform's catalogue of hardware and models, the same for every tenant ----------------------------
Profile = HardwareProfile | ModelProfile


def _profile_action(profile: Profile, verb: str) -> str:
    return f"{profile._meta.model_name}.{verb}"


@transaction.atomic
def profile_create(*, model: type[HardwareProfile] | type[ModelProfile], actor=None, **fields) -> Profile:
    """Create a hardware or model profile after the model's own validation (a bad value is a field error)."""
    profile = model(**fields)
    validated_save(profile)
    audit_log(actor=actor, action=_profile_action(profile, "create"), obj=profile, tenant=None)
    return profile


@transaction.atomic
def profile_update(*, profile: Profile, actor=None, **changes) -> Profile:
    was_mig = getattr(profile, "mig_profile", "")
    field_changes(profile, changes)
    if isinstance(profile, HardwareProfile) and profile.mig_profile != was_mig:
        if problems := slice_change_problems(profile):
            raise ValidationError({"mig_profile": problems})
    validated_save(profile)
    audit_log(
        actor=actor,
        action=_profile_action(profile, "update"),
        obj=profile,
        tenant=None,
        detail={"fields": sorted(changes)},
    )
    return profile


def slice_change_problems(hardware: HardwareProfile) -> list[str]:
    """Why ``hardware`` may not turn from whole GPUs into a MIG slice, or back, now (docs/placement.md "MIG slices"):
    a replica keeps the GPU or slice it started with while the ledger, the quota and the costs would count the new
    shape at once; and every launch on it (an endpoint's own, spot or prefill pool, a version) must still be able
    to start (a slice runs no TP group)."""
    problems = []
    unrecorded = Q(hardware_profile__isnull=True)  # on its pool's, version's or endpoint's profile
    running = Replica.objects.exclude(state=ReplicaState.STOPPED).filter(
        Q(hardware_profile=hardware)
        | unrecorded & Q(role=ReplicaRole.PREFILL, endpoint__prefill_hardware_profile=hardware)
        | unrecorded & Q(version__hardware_profile=hardware)
        | unrecorded & Q(endpoint__hardware_profile=hardware)
    )
    if count := running.count():
        problems.append(
            f"{count} replica(s) run on {hardware.name}: stop them first (each keeps what it started with)"
        )
    launches = []
    for e in Endpoint.objects.filter(
        Q(hardware_profile=hardware) | Q(spot_hardware_profile=hardware) | Q(prefill_hardware_profile=hardware)
    ):
        if hardware.pk in (e.hardware_profile_id, e.spot_hardware_profile_id):
            launches.append((e.name, e.launch_options))
        if e.serving_mode == ServingMode.DISAGGREGATED and hardware.pk == (
            e.prefill_hardware_profile_id or e.hardware_profile_id
        ):
            launches.append((f"{e.name}'s prefill pool", e.prefill_pool_launch_options))
    # A version launches while a rollout moves to it or back from it; an old one, never again, holds nothing back.
    rolling = Rollout.objects.filter(state__in=ROLLOUT_ACTIVE_STATES)
    versions = EndpointVersion.objects.filter(hardware_profile=hardware).filter(
        Q(pk__in=rolling.values("to_version")) | Q(pk__in=rolling.values("from_version"))
    )
    launches += [
        (f"{v.endpoint.name} version {v.number}", v.launch_options) for v in versions.select_related("endpoint")
    ]
    problems += [f"{name}: {why}" for name, options in launches if (why := hardware.launch_problem(options))]
    return problems


@transaction.atomic
def profile_delete(*, profile: Profile, actor=None) -> None:
    # Endpoints PROTECT their profiles: the ProtectedError rolls back the audit entry (the API answers 409).
    audit_log(actor=actor, action=_profile_action(profile, "delete"), obj=profile, tenant=None)
    profile.delete()
