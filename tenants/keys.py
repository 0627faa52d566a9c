"""API key material: generation, hashing, lookup. Only the prefix is ever stored or logged in clear."""

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime

from django.utils import timezone

from tenants.models import ApiKey, PriorityClass

KEY_PREFIX = "ick_"
PREFIX_LEN = 12  # "ick_" + 8 random characters, unique and shown in lists


def generate_key() -> tuple[str, str, str]:
    """Return (full key, prefix, sha256 hex digest)."""
    raw = KEY_PREFIX + secrets.token_urlsafe(32)
    return raw, raw[:PREFIX_LEN], hash_key(raw)


def hash_key(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()


def authenticate_api_key(raw: str):
    """Return the usable ApiKey for a presented key, or None. Constant-time digest comparison."""
    if not raw.startswith(KEY_PREFIX) or len(raw) < PREFIX_LEN + 8:
        return None
    candidate = ApiKey.objects.select_related("tenant").filter(prefix=raw[:PREFIX_LEN]).first()
    if candidate is None or not hmac.compare_digest(candidate.key_hash, hash_key(raw)):
        return None
    if not candidate.is_usable(now=timezone.now()) or not candidate.tenant.is_active:
        return None
    return candidate


def key_grant_excess(*, holder, scopes: list[str], max_priority: str, expires_at: datetime | None) -> dict[str, str]:
    """What a key with these settings would hold beyond the ``holder`` key, by field; empty when nothing.

    A key may create or change only keys within its own grant (scopes, priority ceiling, lifetime), so a
    leaked key can neither mint a stronger one nor outlive its own expiry through a child or itself.
    """
    excess = {}
    extra = set(scopes) - set(holder.scopes)
    if extra:
        excess["scopes"] = f"your key does not hold: {', '.join(sorted(extra))}"
    if PriorityClass.rank(max_priority) < PriorityClass.rank(holder.max_priority):
        excess["max_priority"] = f"your key is limited to {holder.max_priority}"
    if holder.expires_at is not None and (expires_at is None or expires_at > holder.expires_at):
        excess["expires_at"] = f"your key expires at {holder.expires_at.isoformat()}; this one must expire no later"
    return excess


CONTROL_LIMITS = ("rpm_limit", "tpm_limit", "mu_per_min_limit")


def control_excess(*, holder, controls: dict) -> dict[str, str]:
    """What per-key controls would lift beyond the ``holder`` key's own (docs/security.md, "Per-key controls"): a
    limit it has must be kept and not raised, its allowlist narrowed, not widened, and its budget not exceeded,
    so a leaked key cannot mint or make a key that spends or calls more than it may."""
    excess = {}
    for field in CONTROL_LIMITS:
        own, asked = getattr(holder, field), controls.get(field)
        if own is not None and (asked is None or asked > own):
            excess[field] = f"your key is limited to {own:g}; this one must be too"
    own_models = set(holder.allowed_models or ())
    asked_models = set(controls.get("allowed_models") or ())
    if own_models and (not asked_models or not asked_models <= own_models):
        excess["allowed_models"] = f"your key may call only: {', '.join(sorted(own_models))}"
    if holder.budget_usd is not None:
        asked = controls.get("budget_usd")
        if asked is None or asked > holder.budget_usd or controls.get("budget_period") != holder.budget_period:
            excess["budget_usd"] = (
                f"your key has a {holder.budget_period} budget of ${holder.budget_usd:g}; this one must have one "
                "no larger, per the same period"
            )
    return excess


@dataclass
class ApiKeyPrincipal:
    """request.user for key-authenticated API calls: a tenant member (or admin with the write scope)."""

    api_key: object
    is_authenticated: bool = True
    is_active: bool = True
    is_staff: bool = False
    is_superuser: bool = False
    is_operator: bool = False

    @property
    def tenant(self):
        return self.api_key.tenant

    @property
    def tenant_id(self):
        return self.api_key.tenant_id

    @property
    def is_tenant_admin(self) -> bool:
        return "write" in self.api_key.scopes

    @property
    def pk(self):
        return None

    id = pk

    @property
    def username(self) -> str:
        return f"key:{self.api_key.prefix}"
