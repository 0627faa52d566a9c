"""Hardware and model profiles, their model-unit calibrations, autoscaler decisions and operators' scale pins."""

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

from endpoints.models import Endpoint


class HardwareProfile(models.Model):
    class CapacityType(models.TextChoices):
        ON_DEMAND = "on_demand", "On-demand"
        SPOT = "spot", "Spot"

    name = models.CharField(max_length=80, unique=True)
    gpu_type = models.CharField(max_length=40)
    gpus_per_replica = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1)])
    gpu_memory_gb = models.FloatField(validators=[MinValueValidator(1.0)])
    memory_bandwidth_gbps = models.FloatField(validators=[MinValueValidator(0.0)])
    usd_per_gpu_hour = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0.0)], help_text="list price; unset: no price yet"
    )
    capacity_type = models.CharField(max_length=16, choices=CapacityType.choices, default=CapacityType.ON_DEMAND)
    max_replicas = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="availability: replicas the market offers (the mix planner's bound); unset: any",
    )
    preemptions_per_replica_day = models.FloatField(
        default=1.0,
        validators=[MinValueValidator(0.0)],
        help_text="spot: interruptions expected per replica-day (the autoscaler over-provisions by this risk)",
    )
    memory_overhead_gb = models.FloatField(
        default=10.0,
        validators=[MinValueValidator(0.0)],
        help_text="per replica, memory neither weights nor KV cache get (activations, CUDA graphs); the planner's M_overhead",
    )
    kv_link_gbps = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0.001)],
        help_text="gigabits per second a replica's KV connector can send to another (its NIC or NVLink); the P/D "
        "planner's transfer time; unset: no KV link measured",
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ModelProfile(models.Model):
    """A model's shape (for KV sizing) and its default model-unit coefficients.

    MU = alpha·uncached_in + alpha_cached·cached_in + beta·out + gamma. A replica delivers
    ``mu_per_min`` at its SLO-compliant maximum load. Benchmarks per hardware override these.
    """

    name = models.CharField(max_length=120, unique=True)
    parameters_b = models.FloatField(validators=[MinValueValidator(0.0)], help_text="billions of parameters")
    n_layers = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    n_kv_heads = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    d_head = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    dtype_bytes = models.PositiveIntegerField(default=2, validators=[MinValueValidator(1)])
    weights_gb = models.FloatField(validators=[MinValueValidator(0.0)])
    max_model_len = models.PositiveIntegerField(default=8192)
    alpha = models.FloatField(default=0.001, validators=[MinValueValidator(0.0)])
    alpha_cached = models.FloatField(default=0.0001, validators=[MinValueValidator(0.0)])
    beta = models.FloatField(default=0.01, validators=[MinValueValidator(0.0)])
    gamma = models.FloatField(default=0.05, validators=[MinValueValidator(0.0)])
    mu_per_min = models.FloatField(default=1000.0, validators=[MinValueValidator(0.0)])
    source_benchmark = models.ForeignKey(
        "capacity.CapacityBenchmark", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class CapacityBenchmark(models.Model):
    """One automatic load sweep of a (model, hardware) pair; versions increase per pair."""

    class Status(models.TextChoices):
        RUNNING = "running", "Running"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"

    model_profile = models.ForeignKey(ModelProfile, on_delete=models.CASCADE, related_name="benchmarks")
    hardware_profile = models.ForeignKey(HardwareProfile, on_delete=models.CASCADE, related_name="benchmarks")
    version = models.PositiveIntegerField()
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.RUNNING)
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    throughput_table = models.JSONField(default=list, blank=True)
    b_max = models.PositiveIntegerField(null=True, blank=True)
    alpha = models.FloatField(null=True, blank=True)
    alpha_cached = models.FloatField(null=True, blank=True)
    beta = models.FloatField(null=True, blank=True)
    gamma = models.FloatField(null=True, blank=True)
    mu_per_min = models.FloatField(null=True, blank=True)
    fit_error = models.FloatField(null=True, blank=True, help_text="relative error on held-out shapes")
    lora_overhead = models.FloatField(
        null=True,
        blank=True,
        help_text="an adapter request's extra cost: GPU-seconds per unit of work with an adapter over without, − 1 "
        "(empty: not measured, the endpoint had no adapter; adapter requests then use INFERCAP_LORA_MU_OVERHEAD)",
    )
    lora_overhead_samples = models.PositiveIntegerField(
        null=True, blank=True, help_text="adapter requests the LoRA overhead was measured on"
    )
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["model_profile", "hardware_profile", "version"], name="benchmark_version_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.model_profile} on {self.hardware_profile} v{self.version}"


class AutoscalerDecision(models.Model):
    class Axis(models.TextChoices):
        HORIZONTAL = "horizontal", "Replica count"
        VERTICAL = "vertical", "Per-replica concurrency"
        PREFILL = "prefill", "Prefill replica count"  # a disaggregated endpoint's prefill pool

    endpoint = models.ForeignKey("endpoints.Endpoint", on_delete=models.CASCADE, related_name="autoscaler_decisions")
    at = models.DateTimeField(default=timezone.now, db_index=True)
    axis = models.CharField(max_length=12, choices=Axis.choices)
    current = models.FloatField()
    desired = models.FloatField()
    reason = models.CharField(max_length=255)
    inputs = models.JSONField(default=dict, blank=True)
    applied = models.BooleanField(default=False)
    tick = models.CharField(max_length=64, blank=True, help_text="idempotency key of the beat tick")

    class Meta:
        ordering = ["-at"]
        constraints = [
            models.UniqueConstraint(
                fields=["endpoint", "axis", "tick"], condition=~models.Q(tick=""), name="one_decision_per_tick"
            )
        ]

    def __str__(self) -> str:
        return f"{self.endpoint} {self.axis} {self.current:g}→{self.desired:g} ({self.reason})"


class ScalePin(models.Model):
    """An operator's manual scale: the replica count the autoscaler holds an endpoint at until ``until``, recorded in
    its decisions (docs/algorithms.md#manual-scaling-pins). One per endpoint; a new scale replaces it."""

    endpoint = models.OneToOneField("endpoints.Endpoint", on_delete=models.CASCADE, related_name="scale_pin")
    replicas = models.PositiveIntegerField()
    until = models.DateTimeField()
    reason = models.CharField(max_length=200, blank=True)
    set_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    set_by_label = models.CharField(max_length=120, blank=True)
    set_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.endpoint} pinned at {self.replicas} until {self.until:%Y-%m-%d %H:%M}"


class EndpointCapacity(Endpoint):
    """The capacity ledger's rows in the admin: endpoints seen through have / sold / used (no table of its own)."""

    class Meta:
        proxy = True
        verbose_name = "capacity ledger row"
        verbose_name_plural = "capacity ledger"
