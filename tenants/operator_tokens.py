"""Operator token material: generation, lookup, the scope a request needs, and what a minting token may hand out.
Only the prefix is stored or shown in clear (docs/security.md, "Operator tokens")."""

import hmac
import secrets
from datetime import datetime, timedelta

from django.utils import timezone

from tenants.keys import hash_key
from tenants.models import OperatorToken, OperatorTokenScope

TOKEN_PREFIX = "ico_"
PREFIX_LEN = 12  # "ico_" + 8 random characters, unique and shown in lists
DEFAULT_LIFETIME = timedelta(days=30)
MAX_LIFETIME = timedelta(days=365)  # a token always expires; a year at most, so a forgotten one dies on its own
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
LAST_USED_EVERY_S = 60.0  # last_used_at is written at most once a minute per token, not once a request


def generate_token() -> tuple[str, str, str]:
    """Return (full token, prefix, sha256 hex digest)."""
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    return raw, raw[:PREFIX_LEN], hash_key(raw)


def looks_like_operator_token(raw: str) -> bool:
    return raw.startswith(TOKEN_PREFIX)


def authenticate_operator_token(raw: str) -> OperatorToken | None:
    """The usable token for a presented secret, or None: unknown, revoked, expired, or its owner no longer an active
    operator (a demoted or deactivated account's tokens die with its role). Constant-time digest comparison."""
    if not looks_like_operator_token(raw) or len(raw) < PREFIX_LEN + 8:
        return None
    candidate = OperatorToken.objects.select_related("user").filter(prefix=raw[:PREFIX_LEN]).first()
    if candidate is None or not hmac.compare_digest(candidate.token_hash, hash_key(raw)):
        return None
    if not candidate.is_usable(now=timezone.now()) or not owner_may_hold(candidate.user):
        return None
    return candidate


def owner_may_hold(user) -> bool:
    """Only an active operator account holds (and uses) operator tokens; a tenant's people never do."""
    return bool(user.is_active and user.is_operator)


def scope_needed(*, method: str, view) -> str:
    """The scope a request needs: the view's own (``operator_token_scope``: the token routes need ``tokens``), else
    ``read`` for a safe method and ``write`` for a change."""
    declared = getattr(view, "operator_token_scope", None)
    if declared:
        return declared
    return OperatorTokenScope.READ if method in SAFE_METHODS else OperatorTokenScope.WRITE


def scope_held(token: OperatorToken, needed: str) -> bool:
    scopes = set(token.scopes)
    return needed in scopes or (needed == OperatorTokenScope.READ and OperatorTokenScope.WRITE in scopes)


def token_grant_excess(*, holder: OperatorToken, scopes: list[str], expires_at: datetime) -> dict[str, str]:
    """What a token with these settings would hold beyond the ``holder`` token, by field; empty when nothing. A token
    mints or revokes only tokens within its own grant, so a leaked one can neither widen nor outlive itself."""
    excess = {}
    extra = set(scopes) - set(holder.scopes)
    if extra:
        excess["scopes"] = f"your token does not hold: {', '.join(sorted(extra))}"
    if expires_at > holder.expires_at:
        excess["expires_at"] = f"your token expires at {holder.expires_at.isoformat()}; this one must expire no later"
    return excess


def lifetime_error(expires_at: datetime, *, now: datetime | None = None) -> str | None:
    now = now or timezone.now()
    if expires_at <= now:
        return "must be in the future"
    if expires_at > now + MAX_LIFETIME:
        return f"at most {MAX_LIFETIME.days} days ahead: an operator token always expires"
    return None


def token_of(principal) -> OperatorToken | None:
    """The operator token a request authenticated with (set on its user by the authentication class), else None."""
    return getattr(principal, "operator_token", None)
