"""Usage records (one per proxied request), SLOs and alerts."""

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from billing.slo import TPOT_BOUNDS_MS, TTFT_BOUNDS_MS


class UsageStatus(models.TextChoices):
    OK = "ok", "OK"
    SHED = "shed", "Shed"
    RATE_LIMITED = "rate_limited", "Rate limited"
    CLIENT_CANCELLED = "client_cancelled", "Client cancelled"
    UPSTREAM_ERROR = "upstream_error", "Upstream error"
    TIMEOUT = "timeout", "Timeout"


class Degradation(models.TextChoices):
    NONE = "", "None"
    DEGRADED = "degraded", "Degraded (shorter answer)"
    FALLBACK = "fallback", "Served by the fallback endpoint"


class UsageRecord(models.Model):
    """Exactly one per request id; writers insert with ON CONFLICT DO NOTHING so re-delivery is harmless."""

    request_id = models.CharField(max_length=64, unique=True)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="usage_records")
    api_key = models.ForeignKey("tenants.ApiKey", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    endpoint = models.ForeignKey(
        "endpoints.Endpoint", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    replica = models.ForeignKey(
        "endpoints.Replica", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    priority = models.CharField(max_length=12, default="standard")
    input_tokens = models.PositiveIntegerField(default=0)
    cached_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    mu = models.FloatField(default=0.0)
    queue_ms = models.FloatField(null=True, blank=True)
    ttft_ms = models.FloatField(null=True, blank=True)
    tpot_ms = models.FloatField(null=True, blank=True)
    e2e_ms = models.FloatField(null=True, blank=True)
    status = models.CharField(max_length=20, choices=UsageStatus.choices, db_index=True)
    slo_met = models.BooleanField(default=False)
    # Served under overload: shorter (max_tokens capped) or by the endpoint's fallback (``endpoint`` is then the
    # fallback, whose MU it is metered at; ``requested_endpoint`` the one the client named).
    degradation = models.CharField(max_length=10, choices=Degradation.choices, blank=True, default="")
    # No database constraint and nothing done on delete, like the rollups: an endpoint's deletion must not rewrite
    # its usage history, and the usage writer never fails a batch on it.
    requested_endpoint = models.ForeignKey(
        "endpoints.Endpoint", null=True, blank=True, on_delete=models.DO_NOTHING, related_name="+", db_constraint=False
    )
    # The LoRA adapter the request named (docs/lora-serving.md), by name: ``endpoint`` is its base endpoint. A name, not a
    # key, so deleting an adapter leaves its usage history as it was.
    adapter = models.CharField(max_length=100, blank=True, default="")
    # The part of ``mu`` that paid for loading the adapter onto its replica, which this request caused: replica time
    # no token counter shows (docs/lora-serving.md), kept apart so the books reconcile tokens and loads each.
    adapter_load_mu = models.FloatField(default=0.0)
    # Prompt tokens the engine prefilled again for the platform's own failure, not billed to the tenant: a stream
    # resumed on another replica is its prompt and the text already sent, once per resume (docs/request-path.md).
    # The operators' cost, kept so the books reconcile with the engines' counters.
    platform_prompt_tokens = models.PositiveIntegerField(default=0)
    # Prefill/decode disaggregation (docs/request-path.md): how a disaggregated endpoint served it ("split": prefill
    # on ``prefill_replica``, decode on ``replica``; "decode_only": its uncached prompt was short, the decode replica
    # prefilled it; "fallback": the prefill replica failed, timed out or had no slot, the decode replica prefilled
    # it; "" on an aggregated endpoint), and the part of ``mu`` priced at the prefill pool's coefficients.
    pd_route = models.CharField(max_length=12, blank=True, default="")
    prefill_replica = models.ForeignKey(
        "endpoints.Replica", null=True, blank=True, on_delete=models.DO_NOTHING, related_name="+", db_constraint=False
    )
    prefill_mu = models.FloatField(default=0.0)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(db_index=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-finished_at"]
        indexes = [
            models.Index(fields=["endpoint", "finished_at"], name="usage_endpoint_time"),
            models.Index(fields=["tenant", "finished_at"], name="usage_tenant_time"),
        ]

    def __str__(self) -> str:
        return self.request_id


class SLIKind(models.TextChoices):
    AVAILABILITY = "availability", "Availability"
    TTFT = "ttft", "Time to first token"
    TPOT = "tpot", "Time per output token"
    GOODPUT = "goodput", "Goodput (TTFT and TPOT)"


class SLO(models.Model):
    name = models.CharField(max_length=120)
    endpoint = models.ForeignKey("endpoints.Endpoint", on_delete=models.CASCADE, related_name="slos")
    tenant = models.ForeignKey(
        "tenants.Tenant",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="slos",
        help_text="empty = the whole endpoint",
    )
    sli = models.CharField(max_length=16, choices=SLIKind.choices)
    objective = models.FloatField(validators=[MinValueValidator(0.5), MaxValueValidator(0.99999)])
    period_days = models.PositiveIntegerField(default=30, validators=[MinValueValidator(1), MaxValueValidator(365)])
    ttft_ms = models.PositiveIntegerField(null=True, blank=True, help_text="defaults to the endpoint's TTFT SLO")
    tpot_ms = models.PositiveIntegerField(null=True, blank=True, help_text="defaults to the endpoint's TPOT SLO")
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["endpoint_id", "name"]
        verbose_name = "SLO"

    def __str__(self) -> str:
        return f"{self.name} ({self.get_sli_display()} {self.objective:.3%})"


class Alert(models.Model):
    class Severity(models.TextChoices):
        PAGE = "page", "Page"
        TICKET = "ticket", "Ticket"

    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        FIRING = "firing", "Firing"
        RESOLVED = "resolved", "Resolved"

    slo = models.ForeignKey(SLO, on_delete=models.CASCADE, related_name="alerts")
    severity = models.CharField(max_length=8, choices=Severity.choices)
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING, db_index=True)
    long_window = models.CharField(max_length=8)
    short_window = models.CharField(max_length=8)
    burn_rate_threshold = models.FloatField()
    burn_rate_long = models.FloatField(default=0.0)
    burn_rate_short = models.FloatField(default=0.0)
    started_at = models.DateTimeField(default=timezone.now)
    fired_at = models.DateTimeField(null=True, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.ForeignKey(
        "tenants.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-started_at"]
        constraints = [
            # Deduplication: at most one open alert per SLO and window pair.
            models.UniqueConstraint(
                fields=["slo", "long_window", "short_window"],
                condition=~models.Q(state="resolved"),
                name="one_open_alert_per_slo_window",
            )
        ]

    def __str__(self) -> str:
        return f"{self.severity} {self.slo} {self.long_window}/{self.short_window} {self.state}"


# ---------------------------------------------------------------------------------------------------------------
# Rollups: per-minute, per-hour and per-day aggregates of usage records by (endpoint, tenant).
# SLOs, the capacity ledger and cost reports read these, never the raw usage rows.


# The counters every rollup row holds, summed as-is from finer rows into coarser ones.
ROLLUP_COUNTERS: tuple[str, ...] = (
    "requests",  # every usage record
    "ok",  # status ok
    "good",  # status ok and slo_met (the proxy judged it against the endpoint's TTFT/TPOT SLOs)
    "upstream_errors",
    "timeouts",
    "client_cancelled",
    "shed",
    "rate_limited",
    "input_tokens",
    "cached_tokens",
    "output_tokens",
    "good_output_tokens",  # output tokens of good requests: the numerator of goodput
    "mu",
    "ttft_sum_ms",
    "tpot_sum_ms",
    *(f"ttft_le_{b}" for b in TTFT_BOUNDS_MS),  # ok requests with ttft ≤ b (or not measured)
    *(f"tpot_le_{b}" for b in TPOT_BOUNDS_MS),  # ok requests with tpot ≤ b (or no decode step)
)


class UsageRollup(models.Model):
    """Aggregates of one (endpoint, tenant) over one bucket that starts at ``start`` (UTC, truncated)."""

    # Derived from usage records, whose foreign keys already hold: no database constraint, so the per-minute upsert
    # of hundreds of thousands of rows skips two trigger lookups per row (Django still cascades deletes).
    endpoint = models.ForeignKey("endpoints.Endpoint", on_delete=models.CASCADE, related_name="+", db_constraint=False)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+", db_constraint=False)
    start = models.DateTimeField()
    requests = models.BigIntegerField(default=0)
    ok = models.BigIntegerField(default=0)
    good = models.BigIntegerField(default=0)
    upstream_errors = models.BigIntegerField(default=0)
    timeouts = models.BigIntegerField(default=0)
    client_cancelled = models.BigIntegerField(default=0)
    shed = models.BigIntegerField(default=0)
    rate_limited = models.BigIntegerField(default=0)
    input_tokens = models.BigIntegerField(default=0)
    cached_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    good_output_tokens = models.BigIntegerField(default=0)
    mu = models.FloatField(default=0.0)
    ttft_sum_ms = models.FloatField(default=0.0)
    tpot_sum_ms = models.FloatField(default=0.0)

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"{type(self).__name__} endpoint={self.endpoint_id} tenant={self.tenant_id} {self.start:%Y-%m-%d %H:%M}"


# Histogram columns are generated from the bounds so the lists above stay the single source of truth.
for _bound in TTFT_BOUNDS_MS:
    UsageRollup.add_to_class(f"ttft_le_{_bound}", models.BigIntegerField(default=0))
for _bound in TPOT_BOUNDS_MS:
    UsageRollup.add_to_class(f"tpot_le_{_bound}", models.BigIntegerField(default=0))


class UsageMinute(UsageRollup):
    """Per-minute rollup; ``start`` is the minute of the records' ``finished_at``. The capacity ledger reads MU here."""

    class Meta:
        constraints = [models.UniqueConstraint(fields=["endpoint", "tenant", "start"], name="usage_minute_unique")]
        indexes = [models.Index(fields=["start"], name="usage_minute_start")]


class UsageHour(UsageRollup):
    class Meta:
        constraints = [models.UniqueConstraint(fields=["endpoint", "tenant", "start"], name="usage_hour_unique")]
        indexes = [models.Index(fields=["start"], name="usage_hour_start")]


class UsageDay(UsageRollup):
    class Meta:
        constraints = [models.UniqueConstraint(fields=["endpoint", "tenant", "start"], name="usage_day_unique")]
        indexes = [models.Index(fields=["start"], name="usage_day_start")]


class RollupCursor(models.Model):
    """How far the rollup task has read the usage records, by primary key (ids are taken at insert time).

    Each run re-reads the records after ``previous_id`` (the cursor of the run before; at most the last 100,000
    ids), so a batch whose transaction committed just after a run still gets rolled up on the next one.
    """

    name = models.CharField(max_length=32, unique=True)
    last_id = models.BigIntegerField(default=0)
    previous_id = models.BigIntegerField(default=0)
    # The sum of the ids the last run rolled up among the re-read ones (after previous_id, at most the last 100,000
    # ids): the next run finds a late commit by that sum having changed (docs/algorithms.md, SLOs and burn rates).
    ids_sum = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.name} @ {self.last_id}"


class SLOStatus(models.Model):
    """The latest evaluation of one SLO: burn rate per window and what is left of the period's error budget."""

    slo = models.OneToOneField(SLO, on_delete=models.CASCADE, related_name="status")
    evaluated_at = models.DateTimeField()
    burn_rates = models.JSONField(default=dict, help_text="window → burn rate, e.g. {'5m': 0.4, '1h': 1.2}")
    window_counts = models.JSONField(default=dict, help_text="window → [good, valid]")
    period_good = models.FloatField(default=0.0)
    period_valid = models.FloatField(default=0.0)
    budget_remaining = models.FloatField(default=1.0, help_text="fraction of the period's error budget left")
    exhausts_at = models.DateTimeField(null=True, blank=True, help_text="at the current 1 h burn rate")

    class Meta:
        verbose_name = "SLO status"
        verbose_name_plural = "SLO statuses"

    def __str__(self) -> str:
        return f"{self.slo_id}: {self.budget_remaining:.1%} budget left"


class Webhook(models.Model):
    """Where alert notifications go: operators' hooks (no tenant) get every alert, a tenant's get its own SLOs'."""

    name = models.CharField(max_length=120)
    url = models.URLField(max_length=500)
    tenant = models.ForeignKey(
        "tenants.Tenant", null=True, blank=True, on_delete=models.CASCADE, related_name="webhooks"
    )
    secret = models.CharField(
        max_length=128, blank=True, help_text="signs the body: X-Infercap-Signature: sha256=<hmac>"
    )
    severities = models.JSONField(default=list, blank=True, help_text="empty = every severity")
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class AlertNotification(models.Model):
    """One delivery of one alert event to one webhook; the unique constraint is what prevents double notification."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        SENT = "sent", "Sent"
        FAILED = "failed", "Failed"

    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="notifications")
    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, related_name="notifications")
    event = models.CharField(max_length=10, help_text="firing or resolved")
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.PENDING, db_index=True)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    last_error = models.CharField(max_length=500, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["alert", "webhook", "event"], name="one_notification_per_alert_event")
        ]

    def __str__(self) -> str:
        return f"{self.alert_id} {self.event} → {self.webhook_id} ({self.status})"


class CostReport(models.Model):
    """Cost and goodput of one endpoint (tenant empty) or one tenant on it, over one hour or one day."""

    class Granularity(models.TextChoices):
        HOUR = "hour", "Hourly"
        DAY = "day", "Daily"

    granularity = models.CharField(max_length=4, choices=Granularity.choices)
    start = models.DateTimeField()
    end = models.DateTimeField()
    endpoint = models.ForeignKey("endpoints.Endpoint", on_delete=models.CASCADE, related_name="+")
    tenant = models.ForeignKey("tenants.Tenant", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    gpu_hours = models.FloatField(default=0.0)
    usd = models.FloatField(default=0.0)
    requests = models.BigIntegerField(default=0)
    input_tokens = models.BigIntegerField(default=0)
    cached_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    good_output_tokens = models.BigIntegerField(default=0)
    used_mu = models.FloatField(default=0.0)
    capacity_mu = models.FloatField(default=0.0)
    utilization = models.FloatField(null=True, blank=True)
    idle_usd = models.FloatField(default=0.0)
    good_tokens_per_usd = models.FloatField(null=True, blank=True)
    usd_per_1m_good_tokens = models.FloatField(null=True, blank=True)
    computed_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-start", "endpoint_id", "tenant_id"]
        indexes = [models.Index(fields=["granularity", "start"], name="cost_report_period")]

    def __str__(self) -> str:
        who = f"tenant {self.tenant_id}" if self.tenant_id else "endpoint"
        return f"{self.granularity} {self.start:%Y-%m-%d %H:%M} {self.endpoint_id} {who}: ${self.usd:.2f}"
