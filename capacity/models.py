"""Hardware and model profiles, their model-unit calibrations, autoscaler decisions and operators' scale pins."""

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models
from django.utils import timezone

from endpoints.models import Endpoint
from placement import mig
from placement.cluster import Cluster, Node
from placement.policies import Fit, group_fit


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
    # The shape placement keeps (docs/placement.md): a replica's GPUs all inside one interconnect domain.
    gpus_per_node = models.PositiveIntegerField(default=8, validators=[MinValueValidator(1)])
    interconnect_domain_gpus = models.PositiveIntegerField(
        default=8,
        validators=[MinValueValidator(1)],
        help_text="GPUs in one NVLink domain: 8 on an HGX node, 72 on an NVL72 rack, 2 on a PCIe node with NVLink "
        "pairs; divides the node's GPUs or is a multiple of them",
    )
    domain_node_label = models.CharField(
        max_length=120,
        default="kubernetes.io/hostname",
        validators=[RegexValidator(r"^([a-z0-9.-]+/)?[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")],
        help_text="the node label whose value names a node's domain (nvidia.com/gpu.clique on NVL72; the hostname "
        "where the node is the domain)",
    )
    # The GPU model a replica's pods ask for on Kubernetes, and the only nodes the ledger's room counts for them
    # (docs/placement.md, "In the ledger"). Operators set it (profiles are operator-written); empty: any GPU node.
    gpu_product = models.CharField(
        max_length=63,
        blank=True,
        default="",
        validators=[RegexValidator(r"^[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")],
        help_text="Kubernetes: the GPU model's value on the node label gpu_product_label (GPU feature discovery "
        "writes e.g. NVIDIA-H100-80GB-HBM3); empty: any GPU node",
    )
    gpu_product_label = models.CharField(
        max_length=120,
        default="nvidia.com/gpu.product",
        validators=[RegexValidator(r"^([a-z0-9.-]+/)?[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")],
        help_text="Kubernetes: the node label naming the GPU model (GPU feature discovery's nvidia.com/gpu.product; "
        "GKE's cloud.google.com/gke-accelerator)",
    )

    # A slice of a MIG-partitioned GPU (placement/mig.py): memory, bandwidth and price are then the slice's.
    mig_profile = models.CharField(
        max_length=16,
        blank=True,
        default="",
        validators=[RegexValidator(mig.PROFILE.pattern)],
        help_text="a MIG slice a replica runs on (1g.10gb, 3g.40gb): gpu_memory_gb, memory_bandwidth_gbps and "
        "usd_per_gpu_hour are then one slice's, and a replica is one slice (gpus_per_replica 1); empty: whole GPUs",
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self):
        super().clean()
        if self.mig_profile:
            self._clean_mig()
        memory = (self.gpu_memory_gb or 0) * (self.gpus_per_replica or 1)
        if (
            (self.gpu_memory_gb or 0) >= 1
            and self.memory_overhead_gb is not None
            and self.memory_overhead_gb >= memory
        ):
            # A 1g.10gb slice with the default 10 GB would plan no replica at all, for any model.
            raise ValidationError(
                {
                    "memory_overhead_gb": f"{self.memory_overhead_gb:g} GB of a replica's {memory:g} GB leaves "
                    "nothing for weights or KV cache: set what the engine really keeps (1-2 GB on a small slice)"
                }
            )
        per_node, domain = self.gpus_per_node, self.interconnect_domain_gpus
        if per_node and domain and per_node % domain and domain % per_node:
            raise ValidationError(
                {"interconnect_domain_gpus": f"must divide the node's {per_node} GPUs or be a multiple of them"}
            )

    def _clean_mig(self) -> None:
        try:
            piece = mig.parse(self.mig_profile)
        except ValueError as exc:
            raise ValidationError({"mig_profile": str(exc)}) from exc
        if self.gpus_per_replica != 1:
            raise ValidationError({"gpus_per_replica": mig.not_tensor_parallel(self.gpus_per_replica)})
        if self.gpu_memory_gb is not None and self.gpu_memory_gb > piece.memory_gb:
            raise ValidationError(
                {"gpu_memory_gb": f"a {piece.name} slice has {piece.memory_gb} GB: at most that, not more"}
            )

    def gpu_share(self) -> float:
        """The GPUs one of this profile's priced units is: 1, or a MIG slice's compute sevenths over 7 (cost reports
        count a 1g.10gb slice-hour as 1/7 of a GPU-hour, at the slice's own price)."""
        return mig.parse(self.mig_profile).compute_sevenths / 7 if self.mig_profile else 1.0

    def launch_problem(self, launch_options) -> str:
        """Why an endpoint's launch options cannot run on this profile ("" where they can): a replica on a MIG
        profile is one slice, so its engine may not ask for a TP group."""
        tp = launch_options.get("tensor_parallel_size") if isinstance(launch_options, dict) else None
        try:
            tp = int(tp) if tp is not None else 1  # as the launch reads it (replica_shape.engine_gpus)
        except (TypeError, ValueError):
            return ""  # launch option validation refuses it with its own message
        if not self.mig_profile or tp <= 1:
            return ""
        return f"tensor_parallel_size {tp} on {self.name}: a MIG {self.mig_profile} replica is one slice"

    def domain_shape(self) -> Cluster:
        """One interconnect domain of this hardware: a node of NVLink islands, or the nodes of a rack-scale domain."""
        per_node, domain = self.gpus_per_node, self.interconnect_domain_gpus
        if domain <= per_node:
            return Cluster([Node("node", per_node, island=domain if per_node % domain == 0 else None)])
        return Cluster([Node(f"node-{i}", per_node, domain="domain") for i in range(max(1, domain // per_node))])

    def replica_fit(self, gpus: int | None = None) -> Fit:
        """Whether a replica of ``gpus`` (default: this profile's gpus_per_replica) fits one domain, and on how many
        nodes: the topology the planner's "fits" assumes. A MIG profile's replica is one slice."""
        gpus = gpus or self.gpus_per_replica
        if self.mig_profile:
            return mig.slice_fit(self.mig_profile, gpus)
        return group_fit(self.domain_shape(), gpus)


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
        # The ticks read an endpoint's newest decision of an axis, and its newest applied move up and down (the
        # cooldowns), every few seconds; without these each read scanned the endpoint's two weeks of decisions
        # (17,280 a day per axis at one every 5 s).
        indexes = [
            models.Index(fields=["endpoint", "axis", "-at"], name="decision_newest"),
            models.Index(
                fields=["endpoint", "-at"],
                condition=models.Q(axis="horizontal", applied=True, desired__gt=models.F("current")),
                name="decision_last_up",
            ),
            models.Index(
                fields=["endpoint", "-at"],
                condition=models.Q(axis="horizontal", applied=True, desired__lt=models.F("current")),
                name="decision_last_down",
            ),
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
