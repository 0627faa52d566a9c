"""Endpoints (the OpenAI ``model`` name tenants call) and the replicas that serve them."""

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models
from django.utils import timezone


class Runtime(models.TextChoices):
    VLLM = "vllm", "vLLM"
    SIM = "sim", "Simulated vLLM"


class RoutingPolicy(models.TextChoices):
    ROUND_ROBIN = "round_robin", "Round robin"
    LEAST_REQUEST = "least_request", "Least request"
    POWER_OF_TWO = "power_of_two", "Power of two choices"
    LLMD = "llmd", "llm-d default scorers"
    INFERCAP = "infercap", "infercap (MU load, prefix affinity, bounded load)"


model_name_validator = RegexValidator(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,99}$", "Use letters, digits and . _ : / -")


class Endpoint(models.Model):
    name = models.CharField(max_length=100, unique=True, validators=[model_name_validator])
    owner_tenant = models.ForeignKey(
        "tenants.Tenant",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="owned_endpoints",
        help_text="empty = shared endpoint run by the operators",
    )
    model_profile = models.ForeignKey("capacity.ModelProfile", on_delete=models.PROTECT, related_name="endpoints")
    hardware_profile = models.ForeignKey(
        "capacity.HardwareProfile", on_delete=models.PROTECT, related_name="endpoints"
    )
    pinned_benchmark = models.ForeignKey(
        "capacity.CapacityBenchmark", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    runtime = models.CharField(max_length=8, choices=Runtime.choices, default=Runtime.SIM)
    launch_options = models.JSONField(default=dict, blank=True)
    min_replicas = models.PositiveIntegerField(default=1)
    max_replicas = models.PositiveIntegerField(default=4)
    desired_replicas = models.PositiveIntegerField(default=1)
    scale_to_zero = models.BooleanField(default=False)
    provisioned_concurrency = models.PositiveIntegerField(
        default=0, help_text="floor of concurrent requests to keep capacity for"
    )
    concurrency_min = models.PositiveIntegerField(default=4, validators=[MinValueValidator(1)])
    concurrency_max = models.PositiveIntegerField(default=128, validators=[MinValueValidator(1)])
    concurrency_limit = models.PositiveIntegerField(default=64, validators=[MinValueValidator(1)])
    warm_pool_size = models.PositiveIntegerField(default=0)
    routing_policy = models.CharField(max_length=16, choices=RoutingPolicy.choices, default=RoutingPolicy.INFERCAP)
    ttft_slo_ms = models.PositiveIntegerField(default=2000, validators=[MinValueValidator(1)])
    tpot_slo_ms = models.PositiveIntegerField(default=100, validators=[MinValueValidator(1)])
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        errors = {}
        if self.min_replicas > self.max_replicas:
            errors["min_replicas"] = "must not exceed max_replicas"
        if self.concurrency_min > self.concurrency_max:
            errors["concurrency_min"] = "must not exceed concurrency_max"
        if not (self.concurrency_min <= self.concurrency_limit <= self.concurrency_max):
            errors["concurrency_limit"] = "must lie within [concurrency_min, concurrency_max]"
        if errors:
            raise ValidationError(errors)


class ReplicaState(models.TextChoices):
    PENDING = "pending", "Pending"
    STARTING = "starting", "Starting"
    READY = "ready", "Ready"
    DRAINING = "draining", "Draining"
    STOPPED = "stopped", "Stopped"
    FAILED = "failed", "Failed"


# The replica lifecycle; anything else is a bug in the caller and raises IllegalTransition.
REPLICA_TRANSITIONS: dict[str, frozenset[str]] = {
    ReplicaState.PENDING: frozenset({ReplicaState.STARTING, ReplicaState.FAILED, ReplicaState.STOPPED}),
    ReplicaState.STARTING: frozenset({ReplicaState.READY, ReplicaState.FAILED, ReplicaState.STOPPED}),
    ReplicaState.READY: frozenset({ReplicaState.DRAINING, ReplicaState.FAILED}),
    ReplicaState.DRAINING: frozenset({ReplicaState.STOPPED, ReplicaState.FAILED}),
    ReplicaState.FAILED: frozenset({ReplicaState.STOPPED}),
    ReplicaState.STOPPED: frozenset(),
}
# Replica-seconds in these states are billed as GPU time.
BILLED_STATES = frozenset({ReplicaState.READY, ReplicaState.DRAINING})


class Replica(models.Model):
    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="replicas")
    name = models.CharField(max_length=120)
    url = models.URLField(max_length=255, blank=True)
    state = models.CharField(max_length=10, choices=ReplicaState.choices, default=ReplicaState.PENDING, db_index=True)
    state_changed_at = models.DateTimeField(default=timezone.now)
    is_standby = models.BooleanField(default=False, help_text="warm pool: started but not counted as capacity")
    actuator = models.CharField(max_length=16, default="static")
    actuator_ref = models.CharField(max_length=255, blank=True, help_text="pid, pod name, …")
    concurrency_limit = models.PositiveIntegerField(default=64, validators=[MinValueValidator(1)])
    last_probe_at = models.DateTimeField(null=True, blank=True)
    last_probe_ok = models.BooleanField(null=True, blank=True)
    consecutive_probe_failures = models.PositiveIntegerField(default=0)
    failure_reason = models.CharField(max_length=255, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["endpoint_id", "name"]
        constraints = [models.UniqueConstraint(fields=["endpoint", "name"], name="replica_name_unique_per_endpoint")]

    def __str__(self) -> str:
        return f"{self.endpoint.name}/{self.name}"


class ReplicaTransition(models.Model):
    """Every state change, kept for GPU-hour accounting, health timings and the console."""

    replica = models.ForeignKey(Replica, on_delete=models.CASCADE, related_name="transitions")
    from_state = models.CharField(max_length=10, choices=ReplicaState.choices)
    to_state = models.CharField(max_length=10, choices=ReplicaState.choices)
    at = models.DateTimeField(default=timezone.now, db_index=True)
    reason = models.CharField(max_length=255, blank=True)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.replica_id}: {self.from_state} → {self.to_state} at {self.at:%Y-%m-%d %H:%M:%S}"
