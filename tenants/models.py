"""Tenants, users and their roles, API keys, operator tokens, capacity reservations and the audit trail."""

from django.conf import settings
from django.contrib.auth.models import AbstractUser
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone


class PriorityClass(models.TextChoices):
    """Gateway API InferenceModel criticality; health probes outrank all of them."""

    CRITICAL = "critical", "Critical"
    STANDARD = "standard", "Standard"
    SHEDDABLE = "sheddable", "Sheddable"

    @classmethod
    def rank(cls, value: str) -> int:
        """Lower rank is served first."""
        return {cls.CRITICAL: 0, cls.STANDARD: 1, cls.SHEDDABLE: 2}[value]


def _quota_field(what: str) -> models.PositiveIntegerField:
    return models.PositiveIntegerField(
        null=True, blank=True, help_text=f"{what}; empty = the platform default (INFERCAP['TENANT_QUOTA'])"
    )


class Tenant(models.Model):
    name = models.CharField(max_length=120, unique=True)
    slug = models.SlugField(max_length=63, unique=True)
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)
    # Opt-in: the tenant accepts answers from an endpoint's fallback (another, often smaller model; the response's
    # ``model`` names it) rather than a refusal when the endpoint it called is overloaded or failing.
    accepts_fallback = models.BooleanField(default=False)
    # Provisioning quotas for the endpoints the tenant owns (tenants.quotas reads them; only operators change them,
    # through tenants.quotas.tenant_quota_update, which audits the change). Shared endpoints count for nobody.
    quota_max_endpoints = _quota_field("endpoints the tenant may own")
    quota_max_replicas = _quota_field("serving replicas across its endpoints")
    quota_max_gpus = _quota_field("GPUs across its replicas, warm pool included (replicas × GPUs per replica)")
    quota_max_warm_pool = _quota_field("standby (warm pool) replicas across its endpoints")
    # A monthly dollar budget (docs/security.md, "Budgets"): spend is the MU used priced at the usage rate; past
    # ``budget_alert_fraction`` of it an alert is raised, and with ``budget_hard_stop`` the proxies refuse requests
    # (429 budget_exceeded) until the month ends. Empty: no budget.
    budget_usd = models.FloatField(null=True, blank=True, validators=[MinValueValidator(0.0)])
    budget_hard_stop = models.BooleanField(default=False)
    budget_alert_fraction = models.FloatField(default=0.8, validators=[MinValueValidator(0.0), MaxValueValidator(1.0)])
    # When a field its keys carry into the proxy's snapshot last changed (slug, is_active, accepts_fallback, the
    # budget): set by a database trigger on every write, ``QuerySet.update`` included (``tenants.change_triggers``),
    # so the proxies re-read this tenant's keys (docs/request-path.md, "The key table"). ``changed_xid``: the
    # writing transaction's id on PostgreSQL, a change counter on SQLite.
    changed_at = models.DateTimeField(default=timezone.now, db_index=True, editable=False)
    changed_xid = models.BigIntegerField(default=0, db_default=0, db_index=True, editable=False)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Role(models.TextChoices):
    OPERATOR = "operator", "Operator"
    TENANT_ADMIN = "tenant_admin", "Tenant admin"
    TENANT_MEMBER = "tenant_member", "Tenant member"


class User(AbstractUser):
    """An operator sees everything; tenant admins and members see only their tenant."""

    role = models.CharField(max_length=20, choices=Role.choices, default=Role.TENANT_MEMBER)
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="users")

    @property
    def is_operator(self) -> bool:
        return self.is_superuser or self.role == Role.OPERATOR

    @property
    def is_tenant_admin(self) -> bool:
        return self.role == Role.TENANT_ADMIN


class ApiKeyScope(models.TextChoices):
    INFERENCE = "inference", "Inference (proxy)"
    READ = "read", "Read API"
    WRITE = "write", "Write API"


def default_scopes() -> list[str]:
    return [ApiKeyScope.INFERENCE]


class BudgetPeriod(models.TextChoices):
    DAY = "day", "Per UTC day"
    MONTH = "month", "Per UTC month"


class ApiKey(models.Model):
    """Stored as a SHA-256 digest: keys are 256-bit random, so a slow hash would buy nothing but proxy latency."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=120)
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    scopes = models.JSONField(default=default_scopes)
    max_priority = models.CharField(max_length=12, choices=PriorityClass.choices, default=PriorityClass.STANDARD)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    # Per-key controls, on top of the tenant's reservations (docs/security.md, "Per-key controls"): limits shared by
    # every endpoint the key calls, an allowlist of model names (endpoints or adapters; empty: all the tenant may
    # use), and a dollar budget per period that refuses requests once spent.
    rpm_limit = models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1)])
    tpm_limit = models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1)])
    mu_per_min_limit = models.FloatField(null=True, blank=True, validators=[MinValueValidator(0.001)])
    allowed_models = models.JSONField(default=list, blank=True)
    budget_usd = models.FloatField(null=True, blank=True, validators=[MinValueValidator(0.0)])
    budget_period = models.CharField(max_length=8, choices=BudgetPeriod.choices, default=BudgetPeriod.MONTH)
    # When a field the proxy's snapshot reads last changed (not the name or ``last_used_at``): set by a database
    # trigger on every write, ``QuerySet.update`` included (``tenants.change_triggers``). The proxies read the keys
    # changed since their last read instead of all of them (docs/request-path.md, "The key table"). ``changed_xid``:
    # the writing transaction's id on PostgreSQL, a change counter on SQLite.
    changed_at = models.DateTimeField(default=timezone.now, db_index=True, editable=False)
    changed_xid = models.BigIntegerField(default=0, db_default=0, db_index=True, editable=False)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    def is_usable(self, *, now=None) -> bool:
        now = now or timezone.now()
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > now)


class OperatorTokenScope(models.TextChoices):
    READ = "read", "Read the REST API"
    WRITE = "write", "Change through the REST API (reads too)"
    TOKENS = "tokens", "List, mint and revoke operator tokens"


class OperatorToken(models.Model):
    """An operator's (or a service account's) credential for the REST API, ``Authorization: Bearer ico_…``: scoped,
    always expiring, stored as a SHA-256 digest like API keys. It acts as its owner, who must still be an active
    operator when it is used; docs/security.md, "Operator tokens"."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="operator_tokens")
    name = models.CharField(max_length=120)
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    scopes = models.JSONField(default=list)
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    def is_usable(self, *, now=None) -> bool:
        now = now or timezone.now()
        return self.revoked_at is None and self.expires_at > now


class CapacityReservation(models.Model):
    """Capacity sold to a tenant on one endpoint, in model units per minute: for its base-model traffic there (no
    adapter), or for one LoRA adapter it may use there (its own or a shared one; docs/lora.md). A tenant holds at
    most one of each: one base-model reservation per endpoint and one per adapter."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="reservations")
    endpoint = models.ForeignKey("endpoints.Endpoint", on_delete=models.CASCADE, related_name="reservations")
    # RESTRICT, not CASCADE: deleting an adapter must not silently drop capacity a tenant bought (the operator deletes
    # the reservation first, audited). Not PROTECT either: deleting the tenant or the endpoint takes the adapter and
    # the reservation with it in one cascade, which RESTRICT allows and PROTECT would refuse.
    adapter = models.ForeignKey(
        "endpoints.Adapter",
        null=True,
        blank=True,
        on_delete=models.RESTRICT,
        related_name="reservations",
        help_text="empty = the tenant's base-model traffic on the endpoint; else this LoRA adapter's requests",
    )
    mu_per_min = models.FloatField(validators=[MinValueValidator(0.0)])
    priority = models.CharField(max_length=12, choices=PriorityClass.choices, default=PriorityClass.STANDARD)
    # Burst allowance: the token bucket holds this many minutes of the reservation.
    burst_minutes = models.FloatField(default=1.0, validators=[MinValueValidator(0.0)])
    rpm_limit = models.PositiveIntegerField(null=True, blank=True)
    tpm_limit = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "endpoint"],
                condition=models.Q(adapter__isnull=True),
                name="one_reservation_per_tenant_endpoint",
            ),
            models.UniqueConstraint(
                fields=["tenant", "endpoint", "adapter"],
                condition=models.Q(adapter__isnull=False),
                name="one_reservation_per_tenant_adapter",
            ),
        ]
        # The base-model reservation first, then the adapters'.
        ordering = ["endpoint_id", "tenant_id", models.F("adapter_id").asc(nulls_first=True)]

    def __str__(self) -> str:
        on = f"{self.endpoint} ({self.adapter})" if self.adapter_id else f"{self.endpoint}"
        return f"{self.tenant} on {on}: {self.mu_per_min:g} MU/min"

    def clean(self) -> None:
        """The adapter lies on this endpoint and is this tenant's to use: its own or a shared one. One message for
        another tenant's private adapter and a wrong endpoint's, naming neither owner."""
        super().clean()
        if self.adapter_id is None or self.endpoint_id is None or self.tenant_id is None:
            return
        adapter = self.adapter
        if adapter.endpoint_id != self.endpoint_id:
            raise ValidationError({"adapter": [f"adapter `{adapter.name}` is not served on this endpoint"]})
        if adapter.owner_tenant_id is not None and adapter.owner_tenant_id != self.tenant_id:
            raise ValidationError(
                {"adapter": [f"adapter `{adapter.name}` is private to another tenant; this tenant cannot use it"]}
            )


class AuditEntry(models.Model):
    """Who did what to which object, from the console, the API or a control loop."""

    at = models.DateTimeField(default=timezone.now, db_index=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    actor_label = models.CharField(max_length=120, blank=True)
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.SET_NULL)
    action = models.CharField(max_length=64)
    object_type = models.CharField(max_length=64)
    object_id = models.CharField(max_length=64)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at"]
        verbose_name_plural = "audit entries"

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M} {self.actor_label} {self.action} {self.object_type}:{self.object_id}"
