"""Throttles: REST API requests per principal (a person or a key) and per anonymous client; failed console and
admin logins per username and address, so passwords cannot be guessed at line speed (wrong current passwords on
/api/v1/me/ and /api/v1/me/password/ count as failed logins: ``password_attempt``); failed authentications of any
kind (bad API keys too) per client address, refused with 429 before the credentials are even looked up.
Client addresses honour REST_FRAMEWORK's NUM_PROXIES (``client_address``; docs/security.md).

Counts live in Django's cache (Redis in production, shared by every web process; in memory on the embedded
demo). Rates and limits come from settings (REST_FRAMEWORK's DEFAULT_THROTTLE_RATES, INFERCAP["LOGIN_THROTTLE"]).
"""

import functools
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.core.cache import cache
from django.core.exceptions import ValidationError
from rest_framework.exceptions import Throttled
from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle

from config.client_address import client_address_from
from tenants.selectors import principal_is_api_key

T = TypeVar("T")

# --- REST API ----------------------------------------------------------------------------------------------------


class _RateFromSettings(SimpleRateThrottle):
    def get_rate(self) -> str | None:
        # DRF binds the rates at import; read them per request so settings overrides (and tests) apply.
        return api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)

    def get_ident(self, request) -> str:
        return client_address(request)


class PrincipalRateThrottle(_RateFromSettings):
    """Per person (user id) or per API key (its prefix): one leaked key or session cannot flood the API."""

    scope = "principal"

    def get_cache_key(self, request, view) -> str | None:
        principal = request.user
        if not (principal and principal.is_authenticated):
            return None
        ident = f"key:{principal.api_key.prefix}" if principal_is_api_key(principal) else f"user:{principal.pk}"
        return self.cache_format % {"scope": self.scope, "ident": ident}


class AnonymousRateThrottle(_RateFromSettings):
    """Per client address, for calls without credentials (the API index, failed authentication)."""

    scope = "anon"

    def get_cache_key(self, request, view) -> str | None:
        if request.user and request.user.is_authenticated:
            return None
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}


# --- Console and admin logins ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoginLimits:
    failures_per_user_address: int
    failures_per_address: int  # many usernames from one address: password spraying
    window_s: int

    @classmethod
    def from_settings(cls) -> "LoginLimits":
        return cls(**settings.INFERCAP["LOGIN_THROTTLE"])


def _key(kind: str, *parts: str) -> str:
    digest = hashlib.sha256("\0".join(parts).encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"infercap:login:{kind}:{digest}"


def _counters(*, username: str, address: str, limits: LoginLimits) -> list[tuple[str, int]]:
    return [
        (_key("user-address", username.casefold(), address), limits.failures_per_user_address),
        (_key("address", address), limits.failures_per_address),
    ]


def login_blocked_for_s(*, username: str, address: str, limits: LoginLimits | None = None) -> int:
    """Seconds until this username may try again from this address; 0 when it may try now."""
    limits = limits or LoginLimits.from_settings()
    now = time.time()
    wait = 0.0
    for key, limit in _counters(username=username, address=address, limits=limits):
        if (cache.get(key) or 0) >= limit:
            started = cache.get(f"{key}:start") or now
            wait = max(wait, started + limits.window_s - now, 1)
    return int(wait + 0.999)


def login_failed(*, username: str, address: str, limits: LoginLimits | None = None) -> None:
    limits = limits or LoginLimits.from_settings()
    for key, limit in _counters(username=username, address=address, limits=limits):
        _count(key, limit, limits=limits)


def _count(key: str, limit: int, *, limits: LoginLimits) -> None:
    # The window opens with the first failure and is not extended by later ones (a fixed window).
    if cache.add(key, 0, timeout=limits.window_s):
        cache.set(f"{key}:start", time.time(), timeout=limits.window_s)
    try:
        cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.set(key, 1, timeout=limits.window_s)


def login_succeeded(*, username: str, address: str, limits: LoginLimits | None = None) -> None:
    """A right password clears this username's count from this address (not the address-wide one)."""
    limits = limits or LoginLimits.from_settings()
    key, _ = _counters(username=username, address=address, limits=limits)[0]
    cache.delete_many([key, f"{key}:start"])


def client_address(request) -> str:
    """REMOTE_ADDR, or with NUM_PROXIES trusted proxies in front the address the outermost one appended to
    X-Forwarded-For. Without NUM_PROXIES the header is ignored: a client would rotate it to escape every limit."""
    if request is None:
        return ""
    return client_address_from(
        remote_addr=request.META.get("REMOTE_ADDR", ""),
        forwarded_for=request.META.get("HTTP_X_FORWARDED_FOR"),
        num_proxies=api_settings.NUM_PROXIES or 0,
    )


# --- Failed authentications per address (API keys, passwords) ----------------------------------------------------


def auth_failures_blocked_for_s(*, address: str, limits: LoginLimits | None = None) -> int:
    """Seconds until this address may authenticate again, by the per-address failure count that failed logins and
    bad API keys share; 0 when it may try now."""
    limits = limits or LoginLimits.from_settings()
    key, limit = _counters(username="", address=address, limits=limits)[1]
    if (cache.get(key) or 0) < limit:
        return 0
    now = time.time()
    started = cache.get(f"{key}:start") or now
    return int(max(started + limits.window_s - now, 1) + 0.999)


def auth_failed(*, address: str, limits: LoginLimits | None = None) -> None:
    """Count a failed authentication that names no user (a bad API key) against the address."""
    limits = limits or LoginLimits.from_settings()
    _count(*_counters(username="", address=address, limits=limits)[1], limits=limits)


def auth_failures_forget(*, address: str, limits: LoginLimits | None = None) -> None:
    """Clear the address's failure count (the security bench starts each run with its client's count at zero)."""
    key, _ = _counters(username="", address=address, limits=limits or LoginLimits.from_settings())[1]
    cache.delete_many([key, f"{key}:start"])


def auth_throttled(wait_s: int) -> Throttled:
    return Throttled(wait=wait_s, detail="Request was throttled: too many failed authentications from this address.")


def password_attempt(*, request, username: str, field: str, attempt: Callable[[], T]) -> T:
    """Run ``attempt``, a service that checks the caller's current password (a ValidationError on ``field`` when it
    is wrong), under the login lock-out: refused with 429 while this username is locked out from this address, and
    a wrong password counts as a failed login. Otherwise a stolen session could guess the password at API speed
    through /api/v1/me/ while the login form stays locked."""
    address = client_address(request)
    wait_s = login_blocked_for_s(username=username, address=address)
    if wait_s:
        raise Throttled(wait=wait_s, detail="Too many failed password attempts.")
    try:
        result = attempt()
    except ValidationError as exc:
        if field in getattr(exc, "error_dict", {}):
            login_failed(username=username, address=address)
        raise
    login_succeeded(username=username, address=address)
    return result


class ThrottledLoginMixin:
    """For Django's login forms: refuse while locked out, with a message that says so and for how long."""

    throttled_message = "Too many failed login attempts. Try again in %(minutes)d minute(s)."
    throttled_wait_s = 0

    def clean(self):
        username = self.cleaned_data.get("username") or ""
        address = client_address(self.request)
        wait_s = login_blocked_for_s(username=username, address=address)
        if wait_s:
            self.throttled_wait_s = wait_s  # the view answers 429 with Retry-After (login_view_throttled)
            raise ValidationError(self.throttled_message, code="throttled", params={"minutes": -(-wait_s // 60)})
        try:
            cleaned = super().clean()
        except ValidationError as exc:
            if getattr(exc, "code", None) == "invalid_login":
                login_failed(username=username, address=address)
            raise
        login_succeeded(username=username, address=address)
        return cleaned


class ThrottledAuthenticationForm(ThrottledLoginMixin, AuthenticationForm):
    pass


class ThrottledAdminAuthenticationForm(ThrottledLoginMixin, AdminAuthenticationForm):
    pass


def login_view_throttled(view):
    """Wrap a login view whose form is a ``ThrottledLoginMixin``: a locked-out attempt is answered 429 with
    ``Retry-After`` (the form and its message still shown), not a 200 that a script would take for a wrong guess."""

    @functools.wraps(view)
    def wrapped(request, *args, **kwargs):
        response = view(request, *args, **kwargs)
        form = (getattr(response, "context_data", None) or {}).get("form")
        wait_s = getattr(form, "throttled_wait_s", 0)
        if wait_s:
            response.status_code = 429
            response["Retry-After"] = str(wait_s)
        return response

    return wrapped
