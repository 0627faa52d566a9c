"""Endpoints (the OpenAI ``model`` name tenants call) and the replicas that serve them."""

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.utils import timezone

from capacity.runtimes.launch_options import lora_settings
from gateway.routing.kv_events import endpoint_problem


class Runtime(models.TextChoices):
    VLLM = "vllm", "vLLM"
    SIM = "sim", "Simulated vLLM"


class RoutingPolicy(models.TextChoices):
    ROUND_ROBIN = "round_robin", "Round robin"
    LEAST_REQUEST = "least_request", "Least request"
    POWER_OF_TWO = "power_of_two", "Power of two choices"
    LLMD = "llmd", "llm-d default scorers"
    LORA_AFFINITY = "lora_affinity", "LoRA affinity (Gateway API inference extension filters)"
    INFERCAP = "infercap", "infercap (MU load, prefix affinity, bounded load)"
    COST_AWARE = "cost_aware", "Cost-aware (a mixed GPU fleet, by the planner's figures)"


model_name_validator = RegexValidator(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,99}$", "Use letters, digits and . _ : / -")


def kv_events_endpoint_validator(value: str) -> None:
    """A replica's KV-event publisher address: ``tcp://host:port`` (``kv_events.endpoint_problem``)."""
    if value and (problem := endpoint_problem(value)):
        raise ValidationError(problem)


def default_fallback_classes() -> list[str]:
    return ["standard", "sheddable"]


class ServingMode(models.TextChoices):
    AGGREGATED = "aggregated", "Aggregated (each replica prefills and decodes)"
    DISAGGREGATED = "disaggregated", "Disaggregated (a prefill pool and a decode pool)"


class KVConnector(models.TextChoices):
    SHARED_STORAGE = "shared_storage", "Shared storage (one host: vLLM's ExampleConnector over a directory)"
    NIXL = "nixl", "NIXL (GPUs over the network: vLLM's NixlConnector, kv_transfer_params)"


class ReplicaRole(models.TextChoices):
    MIXED = "mixed", "Mixed (aggregated: prefill and decode)"
    PREFILL = "prefill", "Prefill"
    DECODE = "decode", "Decode"


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
    # Spot capacity (docs/algorithms.md#spot-capacity): the autoscaler keeps its on-demand floor on
    # ``hardware_profile`` and runs the rest on this pool, over-provisioned by its preemption risk.
    spot_hardware_profile = models.ForeignKey(
        "capacity.HardwareProfile",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="a spot pool (capacity type spot, the same GPU type) for the replicas above the on-demand floor; "
        "empty: on-demand only",
    )
    # Placement (docs/placement.md, "Falling back to another hardware profile"): when a scale-up finds no whole TP
    # group of ``hardware_profile`` free, the replicas it could not place start on this profile instead.
    fallback_hardware_profile = models.ForeignKey(
        "capacity.HardwareProfile",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="hardware the replicas a scale-up cannot place whole on the endpoint's own start on instead (its "
        "own GPUs per replica; it must hold the model); empty: a scale-up that finds no whole group waits",
    )
    runtime = models.CharField(max_length=8, choices=Runtime.choices, default=Runtime.SIM)
    launch_options = models.JSONField(default=dict, blank=True)
    min_replicas = models.PositiveIntegerField(default=1)
    max_replicas = models.PositiveIntegerField(default=4)
    desired_replicas = models.PositiveIntegerField(default=1)
    desired_spot_replicas = models.PositiveIntegerField(
        default=0, help_text="of desired_replicas, how many run on the spot pool (the autoscaler's split)"
    )
    scale_to_zero = models.BooleanField(default=False)
    provisioned_concurrency = models.PositiveIntegerField(
        default=0, help_text="floor of concurrent requests to keep capacity for"
    )
    concurrency_min = models.PositiveIntegerField(default=4, validators=[MinValueValidator(1)])
    concurrency_max = models.PositiveIntegerField(default=128, validators=[MinValueValidator(1)])
    concurrency_limit = models.PositiveIntegerField(default=64, validators=[MinValueValidator(1)])
    warm_pool_size = models.PositiveIntegerField(default=0)
    routing_policy = models.CharField(max_length=16, choices=RoutingPolicy.choices, default=RoutingPolicy.INFERCAP)
    routing_plan = models.JSONField(
        default=dict,
        blank=True,
        help_text="the cost_aware policy's figures: the routing_plan of POST /api/v1/capacity/plan-mix",
    )
    ttft_slo_ms = models.PositiveIntegerField(default=2000, validators=[MinValueValidator(1)])
    tpot_slo_ms = models.PositiveIntegerField(default=100, validators=[MinValueValidator(1)])
    # Graceful degradation (docs/request-path.md, "Brownout"): where a request goes when this endpoint would shed
    # it, is failing or has no ready replica, for the classes listed, for tenants that accept fallbacks; and the
    # max_tokens that degraded requests are capped at under overload (empty: none are served shorter).
    fallback = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="fallback_for",
        help_text="endpoint that serves this one's overflow and failures (a smaller model, cheaper capacity)",
    )
    fallback_classes = models.JSONField(
        default=default_fallback_classes,
        blank=True,
        help_text="priority classes that may be served by the fallback",
    )
    degrade_max_tokens = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="under overload, sheddable (then standard) requests are served with at most this max_tokens",
    )
    degrade_slot_share = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0.0), MaxValueValidator(1.0)],
        help_text="under overload, sheddable (then standard) requests together hold at most this share [0, 1] of "
        "each replica's concurrency slots, keeping the rest for critical work (empty: no limit)",
    )
    current_version = models.ForeignKey(
        "EndpointVersion",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="the version serving traffic (its model, profiles, runtime and launch options are mirrored above)",
    )
    # Prefill/decode disaggregation (docs/request-path.md, "Prefill/decode disaggregation"): in disaggregated mode the
    # fields above describe the decode pool and these the prefill pool; the KV cache goes from one to the other
    # through ``kv_connector``. A prompt whose uncached part is under ``pd_min_uncached_tokens`` skips the prefill pool.
    serving_mode = models.CharField(max_length=14, choices=ServingMode.choices, default=ServingMode.AGGREGATED)
    kv_connector = models.CharField(
        max_length=16,
        choices=KVConnector.choices,
        default=KVConnector.SHARED_STORAGE,
        help_text="how the KV cache moves from a prefill replica to a decode replica (disaggregated mode)",
    )
    pd_min_uncached_tokens = models.PositiveIntegerField(
        default=256,
        help_text="a prompt with fewer uncached tokens (estimated) than this goes straight to a decode replica",
    )
    prefill_hardware_profile = models.ForeignKey(
        "capacity.HardwareProfile",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="the prefill pool's hardware (empty: the endpoint's)",
    )
    prefill_min_replicas = models.PositiveIntegerField(default=1)
    prefill_max_replicas = models.PositiveIntegerField(default=4)
    prefill_desired_replicas = models.PositiveIntegerField(default=1)
    prefill_launch_options = models.JSONField(default=dict, blank=True)
    prefill_pinned_benchmark = models.ForeignKey(
        "capacity.CapacityBenchmark",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="the prefill pool's MU coefficients (empty: the latest benchmark of its model and hardware)",
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def lora(self) -> tuple[int, int]:
        """(adapter slots per replica, largest adapter rank) from its launch options ``max_loras`` and
        ``max_lora_rank``; (0, 0): it serves no LoRA adapters. Launch options, so a change is a new version."""
        return lora_settings(self.launch_options)

    @property
    def prefill_pool_launch_options(self) -> dict:
        """The launch options a disaggregated endpoint's prefill pool runs with: the endpoint's, with the prefill
        pool's own laid over them (docs/disaggregation.md); what its launches and the ledger's room both read."""
        own = self.launch_options if isinstance(self.launch_options, dict) else {}
        prefill = self.prefill_launch_options if isinstance(self.prefill_launch_options, dict) else {}
        return {**own, **prefill}

    def clean(self) -> None:
        errors = {}
        if self.min_replicas > self.max_replicas:
            errors["min_replicas"] = "must not exceed max_replicas"
        if self.concurrency_min > self.concurrency_max:
            errors["concurrency_min"] = "must not exceed concurrency_max"
        if not (self.concurrency_min <= self.concurrency_limit <= self.concurrency_max):
            errors["concurrency_limit"] = "must lie within [concurrency_min, concurrency_max]"
        if self.serving_mode == ServingMode.DISAGGREGATED and not self.kv_connector:
            errors["kv_connector"] = "a disaggregated endpoint needs a KV connector"
        if self.prefill_min_replicas > self.prefill_max_replicas:
            errors["prefill_min_replicas"] = "must not exceed prefill_max_replicas"
        if problems := self.fallback_hardware_problems():
            errors["fallback_hardware_profile"] = problems
        own = self.hardware_profile if self.hardware_profile_id else None
        pools = [(own, self.launch_options), (self.spot_hardware_profile, self.launch_options)]
        if self.serving_mode == ServingMode.DISAGGREGATED:  # a MIG profile's replica is one slice, in every pool
            pools.append((self.prefill_hardware_profile or own, self.prefill_pool_launch_options))
        if problems := [p for hw, opts in pools if hw and (p := hw.launch_problem(opts))]:
            errors["launch_options"] = problems
        if errors:
            raise ValidationError(errors)

    def fallback_hardware_problems(self) -> list[str]:
        """A fallback profile is another profile that serves the same model with its own GPUs per replica: the
        weights and its overhead leave room for a KV cache, and one replica fits one of its interconnect domains."""
        if self.fallback_hardware_profile_id is None:
            return []
        fallback = self.fallback_hardware_profile
        if fallback.pk == self.hardware_profile_id:
            return ["is the endpoint's own hardware profile"]
        problems = []
        if self.model_profile_id is not None:
            weights = self.model_profile.weights_gb
            room = fallback.gpu_memory_gb * fallback.gpus_per_replica - weights - fallback.memory_overhead_gb
            if room <= 0:
                problems.append(
                    f"{fallback.name} cannot hold {self.model_profile.name}: {fallback.gpus_per_replica} × "
                    f"{fallback.gpu_memory_gb:g} GB − weights {weights:g} GB − overhead "
                    f"{fallback.memory_overhead_gb:g} GB leaves no KV cache"
                )
        fit = fallback.replica_fit()
        if not fit.fits:
            problems.append(f"{fallback.name}: {fit.reason}")
        return problems


class Adapter(models.Model):
    """A LoRA adapter served on its base endpoint's replicas (docs/lora-serving.md): the OpenAI ``model`` name a tenant
    calls, resolved by the proxy to the base endpoint with the adapter loaded on the replica it picks.

    Private to its owner tenant, or shared by the operators (no owner). Its weights are a directory under its owner's
    part of the operators' storage root (``INFERCAP["LORA_ROOT"]``/tenants/<id>/ or /shared/,
    ``capacity.runtimes.lora_artifacts.owner_root``), named by a path relative to it: a tenant never names an arbitrary path,
    a hub id or another tenant's directory. Validated against the endpoint by ``endpoints.adapters.adapter_validate``.
    """

    name = models.CharField(max_length=100, unique=True, validators=[model_name_validator])
    owner_tenant = models.ForeignKey(
        "tenants.Tenant",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="adapters",
        help_text="empty = a shared adapter published by the operators",
    )
    endpoint = models.ForeignKey(
        Endpoint, on_delete=models.CASCADE, related_name="adapters", help_text="the base endpoint that serves it"
    )
    rank = models.PositiveIntegerField(validators=[MinValueValidator(1)], help_text="LoRA rank r")
    artifact_path = models.CharField(
        max_length=255,
        help_text="directory of adapter_config.json and the weights, relative to the owner's part of the LoRA root "
        "(tenants/<tenant id>/ or, for shared adapters, shared/)",
    )
    base_model = models.CharField(
        max_length=255, blank=True, help_text="base_model_name_or_path read from its adapter_config.json"
    )
    request_rate = models.FloatField(
        default=0.0,
        editable=False,
        help_text="requests/s over the last day, from the usage records (endpoints.adapters.adapter_rates_refresh); "
        "the infercap router counts it in the adapter's popularity",
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


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
    # What the proxy sends as ``model``: an attached vLLM server may serve its model under another name than the
    # endpoint's, and vLLM answers 404 to any other name.
    served_model_name = models.CharField(
        max_length=255, blank=True, help_text="the model name its engine serves (empty: the endpoint's name)"
    )
    # Where its engine publishes vLLM's KV-cache events (``--kv-events-config``, ZMQ PUB): the proxy subscribes
    # and routes on what the replica's prefix cache really holds (docs/algorithms.md, the live precise index).
    # Set by the actuators and operators only: it names an internal address, which tenants never see.
    kv_events_endpoint = models.CharField(
        max_length=255,
        blank=True,
        validators=[kv_events_endpoint_validator],
        help_text="tcp://host:port of its engine's KV-event publisher (empty: none; routing uses its approximate index)",
    )
    state = models.CharField(max_length=10, choices=ReplicaState.choices, default=ReplicaState.PENDING, db_index=True)
    state_changed_at = models.DateTimeField(default=timezone.now)
    is_standby = models.BooleanField(default=False, help_text="warm pool: started but not counted as capacity")
    # Its pool on a disaggregated endpoint; mixed (both phases) on an aggregated one.
    role = models.CharField(max_length=8, choices=ReplicaRole.choices, default=ReplicaRole.MIXED)
    actuator = models.CharField(max_length=16, default="static")
    actuator_ref = models.CharField(max_length=255, blank=True, help_text="pid, pod name, …")
    concurrency_limit = models.PositiveIntegerField(default=64, validators=[MinValueValidator(1)])
    last_probe_at = models.DateTimeField(null=True, blank=True)
    last_probe_ok = models.BooleanField(null=True, blank=True)
    consecutive_probe_failures = models.PositiveIntegerField(default=0)
    failure_reason = models.CharField(max_length=255, blank=True)
    # A spot replica runs on its endpoint's spot pool, not on its version's profile: costs follow the profile.
    hardware_profile = models.ForeignKey(
        "capacity.HardwareProfile",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="the profile it runs on when not its version's (a spot replica); empty: its version's",
    )
    # A spot replica's interruption notice (docs/algorithms.md#spot-capacity): when its instance will be taken. Set by
    # ``capacity.autoscaling.services.replica_interruption_notice``; the replica drains 30 s before, and stops at it.
    terminate_at = models.DateTimeField(
        null=True, blank=True, help_text="its instance is taken at this time (an interruption notice); empty: none"
    )
    version = models.ForeignKey(
        "EndpointVersion",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="replicas",
        help_text="the endpoint version this replica runs (empty: hand-registered, counted as the current one)",
    )
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


# --- Versions and rollouts ----------------------------------------------------------------------------------------

# The endpoint fields that make up a version: changing any of them needs new replicas (a rollout). Everything else
# on Endpoint (routing policy, limits, SLO targets, concurrency bounds) applies live through the proxy snapshot.
VERSIONED_FIELDS = ("model_profile", "hardware_profile", "runtime", "launch_options")


class EndpointVersion(models.Model):
    """An immutable (model profile, hardware profile, runtime, launch options) of an endpoint.

    Numbered 1, 2, … per endpoint. A change of any versioned field creates a new version (never an edit of an
    existing one); replicas record the version they run, and ``Endpoint.current_version`` is the one serving
    traffic. A rollout (``Rollout``) moves traffic from one version to another.
    """

    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    model_profile = models.ForeignKey("capacity.ModelProfile", on_delete=models.PROTECT, related_name="+")
    hardware_profile = models.ForeignKey("capacity.HardwareProfile", on_delete=models.PROTECT, related_name="+")
    runtime = models.CharField(max_length=8, choices=Runtime.choices, default=Runtime.SIM)
    launch_options = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    note = models.CharField(max_length=255, blank=True)

    class Meta:
        ordering = ["endpoint_id", "-number"]
        constraints = [models.UniqueConstraint(fields=["endpoint", "number"], name="version_number_unique")]

    def __str__(self) -> str:
        return f"{self.endpoint.name} v{self.number}"

    def spec(self) -> dict:
        """The versioned fields as plain values (ids for the profiles), for comparisons and audit entries."""
        return {
            "model_profile": self.model_profile_id,
            "hardware_profile": self.hardware_profile_id,
            "runtime": self.runtime,
            "launch_options": self.launch_options,
        }


class RolloutStrategy(models.TextChoices):
    ALL_AT_ONCE = "all_at_once", "All at once"
    CANARY = "canary", "Canary (traffic grows in steps)"


class RolloutState(models.TextChoices):
    """Where a rollout stands. The decisions are in ``endpoints.rollouts.machine`` (pure, unit-tested).

    pending → surging → (canary: shifting, step by step) → promoting → succeeded
    any of pending / surging / shifting → rolling_back → rolled_back (automatic on failure, or an operator)
    pending / surging / shifting ⇄ paused (an operator; nothing moves while paused)
    failed: the rollout could not continue and could not roll back on its own (the endpoint's serving version
    was changed outside it); its replicas are left as they are for an operator.
    """

    PENDING = "pending", "Pending"
    SURGING = "surging", "Starting new-version replicas"
    SHIFTING = "shifting", "Shifting traffic (canary)"
    PAUSED = "paused", "Paused"
    PROMOTING = "promoting", "Promoting (all traffic on the new version, draining the old)"
    SUCCEEDED = "succeeded", "Succeeded"
    ROLLING_BACK = "rolling_back", "Rolling back (traffic on the old version, draining the new)"
    ROLLED_BACK = "rolled_back", "Rolled back"
    FAILED = "failed", "Failed"


ROLLOUT_ACTIVE_STATES = frozenset(
    {
        RolloutState.PENDING,
        RolloutState.SURGING,
        RolloutState.SHIFTING,
        RolloutState.PAUSED,
        RolloutState.PROMOTING,
        RolloutState.ROLLING_BACK,
    }
)
ROLLOUT_FINAL_STATES = frozenset({RolloutState.SUCCEEDED, RolloutState.ROLLED_BACK, RolloutState.FAILED})


def default_canary_steps() -> list[int]:
    return [10, 50, 100]


class Rollout(models.Model):
    """Moving an endpoint's traffic from ``from_version`` to ``to_version`` without losing requests or capacity.

    All of a rollout's progress lives in this row (a Celery beat task ticks it; a worker that dies mid-rollout
    leaves nothing behind that the next tick cannot rebuild). The old version's ready replicas at the start
    (``baseline_ready``) are replaced in batches: at most ``min(baseline_ready, max_surge)`` extra replicas are
    alive at once; each new one must pass ``/health`` and a warm-up completion before it gets traffic, traffic
    follows the warmed new replicas (capped by the canary step's percent in ``canary_steps``) and as many old
    replicas drain, so ready routable capacity never drops below the start. Each canary step is held for
    ``step_duration_s`` while the canary's error rate and SLO-miss rate (latency burn) are compared with the old
    version's; exceeding them by ``error_rate_margin`` / ``latency_burn_margin`` (with at least ``min_samples``
    canary requests) rolls back. At most one active rollout per endpoint.
    """

    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="rollouts")
    from_version = models.ForeignKey(EndpointVersion, on_delete=models.PROTECT, related_name="rollouts_from")
    to_version = models.ForeignKey(EndpointVersion, on_delete=models.PROTECT, related_name="rollouts_to")
    strategy = models.CharField(max_length=12, choices=RolloutStrategy.choices, default=RolloutStrategy.ALL_AT_ONCE)
    canary_steps = models.JSONField(
        default=default_canary_steps, blank=True, help_text="percents, rising, ending at 100"
    )
    step_index = models.PositiveIntegerField(default=0)
    step_started_at = models.DateTimeField(null=True, blank=True)
    step_duration_s = models.PositiveIntegerField(default=60, help_text="how long each canary step is observed")
    traffic_percent = models.PositiveIntegerField(
        default=0, validators=[MaxValueValidator(100)], help_text="share of requests going to to_version"
    )
    max_surge = models.PositiveIntegerField(
        default=2,
        validators=[MinValueValidator(1)],
        help_text="extra replicas alive at once (bounded by the ready count): the batch size of the replacement",
    )
    baseline_ready = models.PositiveIntegerField(
        default=0, help_text="ready replicas of from_version when the rollout started (capacity never drops below)"
    )
    warmed_replica_ids = models.JSONField(default=list, blank=True, help_text="new replicas that passed warm-up")
    health_timeout_s = models.PositiveIntegerField(default=600, help_text="new replicas must be ready within this")
    error_rate_margin = models.FloatField(default=0.05, validators=[MinValueValidator(0.0)])
    latency_burn_margin = models.FloatField(default=0.10, validators=[MinValueValidator(0.0)])
    min_samples = models.PositiveIntegerField(default=20, help_text="canary requests needed before comparing")
    state = models.CharField(max_length=12, choices=RolloutState.choices, default=RolloutState.PENDING, db_index=True)
    paused_from = models.CharField(max_length=12, choices=RolloutState.choices, blank=True)
    state_changed_at = models.DateTimeField(default=timezone.now)
    reason = models.CharField(max_length=500, blank=True, help_text="why it ended up where it is (rollbacks say why)")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["endpoint"],
                condition=models.Q(
                    state__in=["pending", "surging", "shifting", "paused", "promoting", "rolling_back"]
                ),
                name="one_active_rollout_per_endpoint",
            )
        ]

    def __str__(self) -> str:
        return f"{self.endpoint.name}: v{self.from_version.number} → v{self.to_version.number} ({self.state})"

    @property
    def is_active(self) -> bool:
        return self.state in ROLLOUT_ACTIVE_STATES

    def traffic_weights(self) -> dict[int, int]:
        """Percent of requests per version id while this rollout is active."""
        if self.traffic_percent >= 100:
            return {self.to_version_id: 100}
        if self.traffic_percent <= 0:
            return {self.from_version_id: 100}
        return {self.from_version_id: 100 - self.traffic_percent, self.to_version_id: self.traffic_percent}


class RolloutEvent(models.Model):
    """Every decision a rollout took (state changes, traffic shifts, launches, drains, comparisons), with why."""

    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(default=timezone.now, db_index=True)
    kind = models.CharField(max_length=32)
    from_state = models.CharField(max_length=12, blank=True)
    to_state = models.CharField(max_length=12, blank=True)
    message = models.CharField(max_length=500, blank=True)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"rollout {self.rollout_id} {self.kind} at {self.at:%H:%M:%S}: {self.message}"


def active_rollout(endpoint: Endpoint | int) -> Rollout | None:
    """The endpoint's rollout in progress, if any (at most one: a constraint says so)."""
    endpoint_id = endpoint if isinstance(endpoint, int) else endpoint.pk
    return (
        Rollout.objects.filter(endpoint_id=endpoint_id, state__in=ROLLOUT_ACTIVE_STATES)
        .select_related("from_version", "to_version")
        .first()
    )
