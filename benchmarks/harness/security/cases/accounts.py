"""Accounts, keys, throttling, settings and filter probing: a leaked key cannot become a person or outlive
itself, nobody sets another person's password or (unless an operator) email address, a stolen session cannot change
the password without the old one nor guess it faster than at the login form, floods and password guessing are
refused, a server started without its settings module refuses to run in development mode, and a foreign id in a
filter answers like a missing one.

Every case attacks the real views (Django's test client, real session and Bearer authentication) or, for the
settings, real child processes. The throttle cases count under cache keys of their own and delete them after,
so the 429s they provoke never reach another case or a later run.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import uuid
from datetime import timedelta

from django.conf import settings
from django.core import mail
from django.core.cache import cache
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import timezone
from rest_framework.settings import api_settings

from benchmarks.harness.security.registry import expect, security_case
from benchmarks.harness.security.world import SecurityWorld
from tenants.models import ApiKey, Role, User
from tenants.services import api_key_create
from tenants.throttling import AnonymousRateThrottle, LoginLimits, PrincipalRateThrottle, _counters


def _password() -> str:
    return f"Sec-{secrets.token_urlsafe(12)}-9x"  # passes Django's validators


def _person(world: SecurityWorld, side, label: str, *, role: str, email: str = "", **extra):
    """A fresh person with a known password (the world's are random and forgotten); rolled back with the case."""
    password = _password()
    user = User.objects.create_user(
        username=f"{world.tag}-{label}-{uuid.uuid4().hex[:4]}",
        password=password,
        email=email,
        tenant=side.tenant if side is not None else None,
        role=role,
        **extra,
    )
    return user, password


def _hash(user) -> str:
    user.refresh_from_db()
    return user.password


def _refused(response) -> bool:
    return response.status_code in (401, 403, 404)


# -- people through the users API ----------------------------------------------------------------------------------
@security_case(
    "accounts.key_cannot_create_user",
    "a leaked write (or full) key creates a tenant admin with a password, to log in as a person and mint keys",
)
def key_cannot_create_user(world: SecurityWorld) -> str:
    before = User.objects.count()
    statuses = {}
    for label in ("write", "full"):
        api = world.api(world.a.keys[label])
        response = api.post(
            reverse("user-list"),
            {"username": f"{world.tag}-backdoor-{label}", "password": _password(), "role": "tenant_admin"},
            format="json",
        )
        statuses[label] = response.status_code
        expect(response.status_code == 403, f"the {label} key creating a tenant admin answered {response.status_code}")
        expect("API keys cannot" in str(response.json().get("detail")), f"no reason given: {response.content[:120]}")
    expect(User.objects.count() == before, "a user was created")
    listed = world.api(world.a.keys["write"]).get(reverse("user-list"))
    expect(listed.status_code == 200, f"the write key cannot even list users ({listed.status_code}): proves nothing")
    expect(
        world.a.admin.username in {row["username"] for row in listed.json()["results"]},
        "the write key does not see A's admin: the case proves nothing",
    )
    return f"write and full keys: 403 ({statuses}), no user created; listing users still allowed"


@security_case(
    "accounts.key_cannot_reset_admin_password",
    "a leaked write key sets, resets or redirects (email) the tenant admin's password, demotes or deletes the admin",
)
def key_cannot_reset_admin_password(world: SecurityWorld) -> str:
    admin = world.a.admin
    hash_before = _hash(admin)
    email_before = admin.email
    api = world.api(world.a.keys["write"])
    url = reverse("user-detail", args=[admin.pk])
    sent = len(getattr(mail, "outbox", []))
    attempts = {
        "PATCH password": api.patch(url, {"password": _password()}, format="json"),
        "PATCH email": api.patch(url, {"email": "attacker@attacker.example"}, format="json"),
        "PATCH role": api.patch(url, {"role": "tenant_member"}, format="json"),
        "reset-password": api.post(reverse("user-reset-password", args=[admin.pk])),
        "DELETE": api.delete(url),
    }
    accepted = [f"{label} {r.status_code}" for label, r in attempts.items() if r.status_code != 403]
    expect(not accepted, "not refused with 403: " + ", ".join(accepted))
    admin.refresh_from_db()
    expect(admin.password == hash_before and admin.has_usable_password(), "the admin's password changed")
    expect(admin.email == email_before and admin.role == Role.TENANT_ADMIN and admin.is_active, "the admin changed")
    expect(len(getattr(mail, "outbox", [])) == sent, "a reset mail went out")
    return f"{len(attempts)} attempts refused with 403; the admin's password, email, role and account unchanged"


@security_case(
    "accounts.no_password_set_through_users_api",
    "a tenant admin, an operator or a stolen session sets a password through PATCH /api/v1/users/{id}/",
)
def no_password_set_through_users_api(world: SecurityWorld) -> str:
    new = _password()
    attempts = [
        ("A's admin on A's member", world.a.admin, world.a.member),
        ("the operator on B's admin", world.operator, world.b.admin),
        ("A's admin on itself", world.a.admin, world.a.admin),
    ]
    details = []
    for label, who, target in attempts:
        before = _hash(target)
        response = world.api(who).patch(reverse("user-detail", args=[target.pk]), {"password": new}, format="json")
        expect(response.status_code == 400, f"{label}: answered {response.status_code}")
        expect("me/password" in str(response.json().get("password")), f"{label}: {response.content[:160]}")
        expect(_hash(target) == before and not target.check_password(new), f"{label}: the password changed")
        details.append(label)
    foreign = world.api(world.a.admin).patch(
        reverse("user-detail", args=[world.b.member.pk]), {"password": new}, format="json"
    )
    expect(foreign.status_code == 404, f"A's admin on B's member answered {foreign.status_code}")
    return "400 (pointing to /me/password/ and reset links) for " + ", ".join(details) + "; B's member 404 to A"


@security_case(
    "accounts.password_change_needs_old",
    "a stolen session (or a key) sets a new password without the current one, to keep the account for good",
)
def password_change_needs_old(world: SecurityWorld) -> str:
    victim, old = _person(world, world.a, "victim", role=Role.TENANT_MEMBER)
    thief, owner = Client(), Client()
    expect(thief.login(username=victim.username, password=old), "the thief's session did not log in")
    expect(owner.login(username=victim.username, password=old), "the owner's session did not log in")
    url = reverse("me-password")
    new = _password()
    tries = {
        "no old password": thief.post(url, {"new_password": new}, content_type="application/json"),
        "a wrong old password": thief.post(
            url, {"old_password": "guess", "new_password": new}, content_type="application/json"
        ),
        "the users API": thief.patch(
            reverse("user-detail", args=[victim.pk]), {"password": new}, content_type="application/json"
        ),
    }
    wrong = [f"{label} {r.status_code}" for label, r in tries.items() if r.status_code not in (400, 403)]
    expect(not wrong, "accepted: " + ", ".join(wrong))
    expect("old_password" in tries["no old password"].json(), "no old_password error")
    expect("old_password" in tries["a wrong old password"].json(), "no old_password error for a wrong one")
    victim.refresh_from_db()
    expect(victim.check_password(old) and not victim.check_password(new), "the password changed without the old one")
    as_key = world.api(world.a.keys["full"]).post(url, {"old_password": old, "new_password": new}, format="json")
    expect(as_key.status_code == 403, f"an API key on /me/password/ answered {as_key.status_code}")
    # The owner, who knows the old one, changes it: that works, and every other session (the thief's) ends.
    changed = owner.post(url, {"old_password": old, "new_password": new}, content_type="application/json")
    expect(changed.status_code == 200, f"the owner's change with the old password failed ({changed.status_code})")
    victim.refresh_from_db()
    expect(victim.check_password(new), "the owner's change did not take")
    expect(owner.get(reverse("me")).status_code == 200, "the owner's own session ended")
    after = thief.get(reverse("me")).status_code
    expect(after in (401, 403), f"the thief's session still works after the change ({after})")
    return (
        f"without / with a wrong old password / via the users API: {[r.status_code for r in tries.values()]}; "
        f"a key 403; the owner's change ends the thief's session ({after})"
    )


@security_case(
    "accounts.reset_only_by_mailed_link",
    "an admin resets someone's password to learn it, resets another tenant's user or an operator; a member resets",
)
def reset_only_by_mailed_link(world: SecurityWorld) -> str:
    outbox = getattr(mail, "outbox", None)
    expect(outbox is not None, "mail is not captured (no test environment): cannot check the reset mail")
    target, old = _person(world, world.a, "reset", role=Role.TENANT_MEMBER, email=f"{world.tag}@mail.example")
    boss, _ = _person(world, world.a, "boss", role=Role.TENANT_ADMIN, is_superuser=True)
    hashes = {user: _hash(user) for user in (world.a.admin, world.b.admin, boss, target)}
    refused = {
        "A's member resets A's admin": world.api(world.a.member).post(
            reverse("user-reset-password", args=[world.a.admin.pk])
        ),
        "A's admin resets B's admin": world.api(world.a.admin).post(
            reverse("user-reset-password", args=[world.b.admin.pk])
        ),
        "A's admin resets a superuser in A": world.api(world.a.admin).post(
            reverse("user-reset-password", args=[boss.pk])
        ),
        "A's write key resets A's member": world.api(world.a.keys["write"]).post(
            reverse("user-reset-password", args=[target.pk])
        ),
    }
    wrong = [f"{label} {r.status_code}" for label, r in refused.items() if not _refused(r)]
    expect(not wrong, "not refused: " + ", ".join(wrong))
    for user, before in hashes.items():
        expect(_hash(user) == before and user.has_usable_password(), f"{user.username}'s password changed")
    del outbox[:]
    reset = world.api(world.a.admin).post(reverse("user-reset-password", args=[target.pk]))
    expect(reset.status_code == 200, f"A's admin resetting A's member failed ({reset.status_code}): proves nothing")
    target.refresh_from_db()
    expect(not target.has_usable_password(), "the old password still works after the reset")
    expect([m.to for m in outbox] == [[target.email]], f"mail went to {[m.to for m in outbox]}")
    link = re.search(r"https?://[^/\s]+(/accounts/reset/\S+/)", outbox[0].body)
    expect(link, "the mail holds no reset link")
    token = link.group(1).rstrip("/").rsplit("/", 1)[-1]
    expect(token not in reset.content.decode(), "the admin's response reveals the reset token")
    # The link, and only its holder, sets the new password.
    client, new = Client(), _password()
    form = client.get(link.group(1), follow=True)
    expect(form.status_code == 200 and form.redirect_chain, f"the reset link does not open ({form.status_code})")
    done = client.post(form.redirect_chain[-1][0], {"new_password1": new, "new_password2": new})
    expect(done.status_code == 302, f"setting the password through the link failed ({done.status_code})")
    target.refresh_from_db()
    expect(target.check_password(new) and not target.check_password(old), "the link did not set the new password")
    return (
        f"{len(refused)} resets refused ({', '.join(str(r.status_code) for r in refused.values())}); a legitimate "
        "one locks the password, mails only the user a one-time link, and the admin's reply holds no token"
    )


@security_case(
    "accounts.admin_cannot_redirect_email",
    "a tenant admin sets a colleague's email to their own address, then resets the password to take the account",
)
def admin_cannot_redirect_email(world: SecurityWorld) -> str:
    outbox = getattr(mail, "outbox", None)
    expect(outbox is not None, "mail is not captured (no test environment): cannot check where the reset goes")
    victim, password = _person(world, world.a, "victim", role=Role.TENANT_MEMBER, email=f"{world.tag}@victim.example")
    admin = world.api(world.a.admin)
    attacker = f"{world.tag}@attacker.example"
    attempts = {
        "a colleague's": admin.patch(reverse("user-detail", args=[victim.pk]), {"email": attacker}, format="json"),
        "its own, via the users API": admin.patch(
            reverse("user-detail", args=[world.a.admin.pk]), {"email": attacker}, format="json"
        ),
    }
    wrong = [f"{label} {r.status_code}" for label, r in attempts.items() if r.status_code != 400]
    expect(not wrong, "email changed by an admin: " + ", ".join(wrong))
    expect(all("me/" in str(r.json().get("email")) for r in attempts.values()), "refused without saying where")
    victim.refresh_from_db()
    expect(victim.email == f"{world.tag}@victim.example", f"the victim's email is now {victim.email}")
    # The person themself, with their password, and an operator still can.
    own = Client()
    expect(own.login(username=victim.username, password=password), "the victim cannot log in: proves nothing")
    mine = own.patch(
        reverse("me"),
        {"email": f"{world.tag}@new.example", "current_password": password},
        content_type="application/json",
    )
    expect(mine.status_code == 200, f"the person's own change failed ({mine.status_code})")
    fixed = world.api(world.operator).patch(
        reverse("user-detail", args=[victim.pk]), {"email": f"{world.tag}@ops.example"}, format="json"
    )
    expect(fixed.status_code == 200, f"the operator's change failed ({fixed.status_code})")
    # The admin's reset reaches the person at the address they (or an operator) chose, never the attacker's.
    del outbox[:]
    reset = admin.post(reverse("user-reset-password", args=[victim.pk]))
    expect(reset.status_code == 200, f"the reset failed ({reset.status_code}): proves nothing")
    expect([m.to for m in outbox] == [[f"{world.tag}@ops.example"]], f"the reset went to {[m.to for m in outbox]}")
    return (
        "an admin's change of a colleague's or its own email is 400; self (with password) and operator may; "
        "the reset goes to the user"
    )


@security_case(
    "throttle.password_change_lockout",
    "a stolen session guesses the current password at /api/v1/me/password/ and /api/v1/me/ at API speed",
)
def password_change_lockout(world: SecurityWorld) -> str:
    limits = LoginLimits.from_settings()
    address, elsewhere = _two_addresses()
    victim, password = _person(world, world.a, "guessed-pw", role=Role.TENANT_MEMBER)
    used = [(victim.username, a) for a in (address, elsewhere)]
    _login_counters_forget(used)
    new = _password()
    try:
        thief = world.api(victim)
        for n in range(limits.failures_per_user_address):
            guess = thief.post(
                reverse("me-password"), {"old_password": f"guess-{n}", "new_password": new}, REMOTE_ADDR=address
            )
            expect(guess.status_code == 400, f"guess {n + 1} answered {guess.status_code}")
        right = {"old_password": password, "new_password": new}
        locked = thief.post(reverse("me-password"), right, REMOTE_ADDR=address)
        retry_after = locked.get("Retry-After", "")
        expect(
            locked.status_code == 429 and retry_after.isdigit() and 1 <= int(retry_after) <= limits.window_s,
            f"the right password after the limit answered {locked.status_code} (Retry-After {retry_after!r})",
        )
        email = thief.patch(
            reverse("me"),
            {"email": "x@attacker.example", "current_password": password},
            format="json",
            REMOTE_ADDR=address,
        )
        expect(email.status_code == 429, f"the email change in the lock-out answered {email.status_code}")
        _, logged_in = _login("/accounts/login/", victim.username, password, address)
        expect(not logged_in, "the console login is not locked by the API's failures")
        victim.refresh_from_db()
        expect(victim.check_password(password) and victim.email == "", "the account changed during the lock-out")
        elsewhere_ok = world.api(victim).post(reverse("me-password"), right, REMOTE_ADDR=elsewhere)
        expect(elsewhere_ok.status_code == 200, f"another address was locked too ({elsewhere_ok.status_code})")
    finally:
        _login_counters_forget(used)
    return (
        f"after {limits.failures_per_user_address} wrong old passwords the right one is 429 with Retry-After, the "
        "email change too, and the console login is locked; another address unaffected (counters deleted)"
    )


# -- keys within their own grant -------------------------------------------------------------------------------------
def _holder(world: SecurityWorld, **options):
    """A fresh read+write key of tenant A with these limits, and a client that uses it."""
    row, raw = api_key_create(tenant=world.a.tenant, name=f"{world.tag} holder", scopes=["read", "write"], **options)
    return row, world.api(raw)


@security_case(
    "keys.cannot_mint_outliving_key",
    "an expiring (or sheddable) key mints a key that never expires, expires later, or gets the default priority",
)
def cannot_mint_outliving_key(world: SecurityWorld) -> str:
    expires = timezone.now() + timedelta(hours=1)
    _, api = _holder(world, expires_at=expires, max_priority="sheddable")
    url = reverse("api-key-list")
    attempts = {
        "never expires": ({"name": "x", "scopes": ["read"], "expires_at": None}, "expires_at"),
        "expires a month later": (
            {"name": "x", "scopes": ["read"], "expires_at": (expires + timedelta(days=30)).isoformat()},
            "expires_at",
        ),
        "priority above its own": ({"name": "x", "scopes": ["read"], "max_priority": "standard"}, "max_priority"),
    }
    wrong = []
    for label, (body, field) in attempts.items():
        response = api.post(url, body, format="json")
        if response.status_code != 400 or field not in response.json():
            wrong.append(f"{label} {response.status_code}")
    expect(not wrong, "accepted: " + ", ".join(wrong))
    unsaid = api.post(url, {"name": "child", "scopes": ["read"]}, format="json")
    expect(unsaid.status_code == 201, f"a key within its limits was refused ({unsaid.status_code}): proves nothing")
    child = ApiKey.objects.get(pk=unsaid.json()["id"])
    expect(child.expires_at == expires, f"a child with no expiry said got {child.expires_at}, not the holder's")
    expect(child.max_priority == "sheddable", f"a child with no priority said got {child.max_priority}")
    return "never-expiring, later-expiring and higher-priority children 400; an unsaid expiry/priority is the holder's"


@security_case(
    "keys.cannot_extend_own_expiry",
    "an expiring key PATCHes itself to never expire, to expire later, or to more scopes or priority",
)
def cannot_extend_own_expiry(world: SecurityWorld) -> str:
    expires = timezone.now() + timedelta(hours=1)
    row, api = _holder(world, expires_at=expires, max_priority="sheddable")
    url = reverse("api-key-detail", args=[row.pk])
    attempts = [
        ({"expires_at": None}, "expires_at"),
        ({"expires_at": (expires + timedelta(days=1)).isoformat()}, "expires_at"),
        ({"max_priority": "critical"}, "max_priority"),
        ({"scopes": ["inference", "read", "write"]}, "scopes"),
    ]
    wrong = []
    for body, field in attempts:
        response = api.patch(url, body, format="json")
        if response.status_code != 400 or field not in response.json():
            wrong.append(f"{body} {response.status_code}")
    expect(not wrong, "accepted: " + ", ".join(wrong))
    row.refresh_from_db()
    expect(
        row.expires_at == expires and row.max_priority == "sheddable" and row.scopes == ["read", "write"],
        f"the key changed: {row.expires_at}, {row.max_priority}, {row.scopes}",
    )
    shorter = api.patch(url, {"expires_at": (expires - timedelta(minutes=30)).isoformat()}, format="json")
    expect(shorter.status_code == 200, f"shortening its own life was refused ({shorter.status_code}): proves nothing")
    return "PATCH to no expiry, a later one, critical priority, more scopes: 400 each; shortening allowed"


@security_case(
    "keys.cannot_change_stronger_key",
    "a weak write key lifts a stronger key's expiry or revokes the critical key production runs on",
)
def cannot_change_stronger_key(world: SecurityWorld) -> str:
    strong, _ = api_key_create(tenant=world.a.tenant, name="prod", scopes=["inference"], max_priority="critical")
    expiring, _ = api_key_create(
        tenant=world.a.tenant, name="temp", scopes=["read"], expires_at=timezone.now() + timedelta(hours=1)
    )
    _, api = _holder(world, max_priority="sheddable")
    wrong = []
    for key in (strong, expiring):
        before = ApiKey.objects.filter(pk=key.pk).values().get()
        patched = api.patch(reverse("api-key-detail", args=[key.pk]), {"expires_at": None}, format="json")
        revoked = api.post(reverse("api-key-revoke", args=[key.pk]))
        if patched.status_code != 403 or revoked.status_code != 403:
            wrong.append(f"{key.name}: PATCH {patched.status_code}, revoke {revoked.status_code}")
        expect(ApiKey.objects.filter(pk=key.pk).values().get() == before, f"the {key.name} key changed")
    expect(not wrong, "not refused: " + "; ".join(wrong))
    weak, _ = api_key_create(tenant=world.a.tenant, name="weak", scopes=["read"], max_priority="sheddable")
    control = api.post(reverse("api-key-revoke", args=[weak.pk]))
    expect(control.status_code == 200, f"revoking a weaker key was refused ({control.status_code}): proves nothing")
    return "PATCH and revoke of a critical key and of an expiring key: 403, unchanged; a weaker key revocable"


# -- throttling --------------------------------------------------------------------------------------------------------
class _OwnThrottleCounters:
    """Within the block, the API throttles count under keys no other case or run shares; deleted on exit."""

    def __init__(self, world: SecurityWorld, rates: dict[str, str]):
        self.classes = (PrincipalRateThrottle, AnonymousRateThrottle)
        self.format = f"security-{world.tag}-{uuid.uuid4().hex[:8]}-%(scope)s-%(ident)s"
        self.rates = rates
        self.idents: list[tuple[str, str]] = []

    def __enter__(self):
        self.saved = {cls: cls.__dict__.get("cache_format") for cls in self.classes}
        for cls in self.classes:
            cls.cache_format = self.format
        self.override = override_settings(
            REST_FRAMEWORK={**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": self.rates}
        )
        self.override.enable()
        return self

    def __exit__(self, *exc):
        self.override.disable()
        for cls, saved in self.saved.items():
            if saved is None:
                del cls.cache_format
            else:
                cls.cache_format = saved
        cache.delete_many([self.format % {"scope": scope, "ident": ident} for scope, ident in self.idents])
        return False


def _throttled(response) -> str | None:
    """None when ``response`` is a proper 429 (Retry-After within the window); else what is wrong with it."""
    if response.status_code != 429:
        return f"answered {response.status_code}"
    retry_after = response.get("Retry-After")
    if not (retry_after and retry_after.isdigit() and 1 <= int(retry_after) <= 60):
        return f"429 without a usable Retry-After ({retry_after!r})"
    if "throttled" not in str(response.json().get("detail", "")).lower():
        return f"429 without saying so: {response.content[:120]}"
    return None


@security_case(
    "throttle.api_429_retry_after",
    "a leaked key, a person's session and an anonymous address flood /api/v1/ past their rate",
)
def api_429_retry_after(world: SecurityWorld) -> str:
    configured = dict(api_settings.DEFAULT_THROTTLE_RATES)
    classes = set(api_settings.DEFAULT_THROTTLE_CLASSES)
    expect({PrincipalRateThrottle, AnonymousRateThrottle} <= classes, f"API throttles not installed: {classes}")
    expect(configured.get("principal") and configured.get("anon"), f"a configured rate is missing: {configured}")
    # The configured rates (1200/min by default) lowered, so the flood is a few requests; same classes and code.
    with _OwnThrottleCounters(world, {"principal": "3/min", "anon": "2/min"}) as counters:
        flood_row, flood = api_key_create(tenant=world.a.tenant, name=f"{world.tag} flood", scopes=["read"])
        spare_row, spare = api_key_create(tenant=world.a.tenant, name=f"{world.tag} spare", scopes=["read"])
        person, _ = _person(world, world.a, "flooder", role="tenant_member")
        address, elsewhere = f"203.0.113.{secrets.randbelow(200) + 1}", "203.0.113.250"
        counters.idents += [
            ("principal", f"key:{flood_row.prefix}"),
            ("principal", f"key:{spare_row.prefix}"),
            ("principal", f"user:{person.pk}"),
            ("anon", address),
            ("anon", elsewhere),
        ]
        endpoints = reverse("endpoint-list")
        key_api = world.api(flood)
        statuses = [key_api.get(endpoints).status_code for _ in range(3)]
        expect(statuses == [200] * 3, f"the key's first calls answered {statuses}: proves nothing")
        problem = _throttled(key_api.get(endpoints))
        expect(problem is None, f"the key's 4th call in a minute {problem}")
        expect(world.api(spare).get(endpoints).status_code == 200, "another key of the tenant was throttled too")

        session = world.api(person)
        statuses = [session.get(reverse(name)).status_code for name in ("me", "endpoint-list", "user-list")]
        expect(statuses == [200] * 3, f"the person's first calls answered {statuses}")
        problem = _throttled(session.get(reverse("api-key-list")))
        expect(problem is None, f"the person's 4th call (another route) {problem}")

        anonymous = world.api(None)
        statuses = [anonymous.get(reverse("api-root"), REMOTE_ADDR=address).status_code for _ in range(2)]
        expect(statuses == [200] * 2, f"anonymous first calls answered {statuses}")
        problem = _throttled(anonymous.get(reverse("api-root"), REMOTE_ADDR=address))
        expect(problem is None, f"the anonymous address's 3rd call {problem}")
        other = anonymous.get(reverse("api-root"), REMOTE_ADDR=elsewhere).status_code
        expect(other == 200, f"another address was throttled too ({other})")
    return (
        f"key, person and anonymous address: 429 with Retry-After past the rate; other key/address unaffected "
        f"(configured principal {configured['principal']}, anon {configured['anon']}; counters deleted)"
    )


def _login_counters_forget(pairs) -> None:
    limits = LoginLimits.from_settings()
    for username, address in pairs:
        for key, _ in _counters(username=username, address=address, limits=limits):
            cache.delete_many([key, f"{key}:start"])


def _two_addresses() -> tuple[str, str]:
    # Random, so that a rerun does not meet the counters a failed run left; the second, 100 apart, is never the first.
    net = secrets.randbelow(100)
    return f"203.0.113.{net + 1}", f"203.0.113.{net + 101}"


def _login(url: str, username: str, password: str, address: str):
    client = Client()
    response = client.post(url, {"username": username, "password": password}, REMOTE_ADDR=address)
    return response, "_auth_user_id" in client.session


@security_case(
    "throttle.login_lockout",
    "password guessing at the console and admin logins, per username and by spraying usernames from one address",
)
def login_lockout(world: SecurityWorld) -> str:
    limits = LoginLimits.from_settings()
    address, elsewhere = _two_addresses()
    member, member_pw = _person(world, world.a, "guessed", role=Role.TENANT_MEMBER)
    operator, operator_pw = _person(world, None, "guessed-op", role=Role.OPERATOR, is_staff=True)
    sprayed = [f"{world.tag}-nobody-{n}" for n in range(3)]
    used = [(u, a) for u in (member.username, operator.username, *sprayed) for a in (address, elsewhere)]
    _login_counters_forget(used)
    details = []
    try:
        for url, user, right in (
            ("/accounts/login/", member, member_pw),
            ("/admin/login/", operator, operator_pw),
        ):
            for n in range(limits.failures_per_user_address):
                response, _ = _login(url, user.username, f"wrong-{n}", address)
                expect(b"Too many" not in response.content, f"{url}: locked after only {n} failure(s)")
            response, logged_in = _login(url, user.username, right, address)
            expect(not logged_in, f"{url}: the right password still logged in after {n + 1} failures")
            expect(b"Too many failed login attempts" in response.content, f"{url}: refused without saying why")
            _, control = _login(url, user.username, right, elsewhere)
            expect(control, f"{url}: the right password from another address failed too: proves nothing")
            details.append(f"{url} locked after {limits.failures_per_user_address}")
        # Spraying: a few guesses per username, many usernames, one address (limit lowered to keep it short).
        spray = {"failures_per_user_address": 100, "failures_per_address": len(sprayed), "window_s": 60}
        with override_settings(INFERCAP={**settings.INFERCAP, "LOGIN_THROTTLE": spray}):
            for username in sprayed:
                _login("/accounts/login/", username, "guess", elsewhere)
            response, logged_in = _login("/accounts/login/", member.username, member_pw, elsewhere)
            expect(not logged_in and b"Too many failed login attempts" in response.content, "spraying not locked out")
        details.append(f"an address spraying {len(sprayed)} usernames locked out")
    finally:
        _login_counters_forget(used)
    return "; ".join(details) + " (right password refused; other address allowed; counters deleted)"


# -- settings fail closed ------------------------------------------------------------------------------------------
_SHOW = "from django.conf import settings; print(settings.SETTINGS_MODULE, settings.DEBUG)"
_REAL = {
    "DJANGO_SECRET_KEY": None,  # filled per run
    "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/infercap-never-connected",
    "REDIS_URL": "redis://127.0.0.1:6379/15",
}


@security_case(
    "settings.fail_closed",
    "a server is started without DJANGO_SETTINGS_MODULE (and without secrets, with DEBUG, with a weak key)",
)
def fail_closed(world: SecurityWorld) -> str:
    real = {**_REAL, "DJANGO_SECRET_KEY": secrets.token_urlsafe(64)}
    runs = {
        "manage.py check, nothing set": (["manage.py", "check"], {}, "DJANGO_SECRET_KEY"),
        "import config.asgi, nothing set": (["-c", "import config.asgi"], {}, "DJANGO_SECRET_KEY"),
        "the Celery app, nothing set": (
            ["-c", "from config.celery_app import app; app.loader.import_default_modules()"],
            {},
            "DJANGO_SECRET_KEY",
        ),
        "DJANGO_DEBUG=1": (["manage.py", "check"], {**real, "DJANGO_DEBUG": "1"}, "DJANGO_DEBUG must be off"),
        "a django-insecure key": (
            ["manage.py", "check"],
            {**real, "DJANGO_SECRET_KEY": "django-insecure-" + secrets.token_urlsafe(48)},
            "DJANGO_SECRET_KEY",
        ),
        "a one-character key": (["manage.py", "check"], {**real, "DJANGO_SECRET_KEY": "x" * 64}, "DJANGO_SECRET_KEY"),
        "control: production secrets": (["manage.py", "shell", "-c", _SHOW], real, None),
    }
    base_env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DJANGO_SETTINGS_MODULE", "DJANGO_SECRET_KEY", "DJANGO_DEBUG", "DATABASE_URL", "REDIS_URL"}
    }
    children = {
        label: subprocess.Popen(
            [sys.executable, *argv],
            cwd=settings.BASE_DIR,
            env={**base_env, "INFERCAP_QUIET": "1", **changes},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for label, (argv, changes, _) in runs.items()
    }
    outcomes = {}
    try:
        for label, child in children.items():
            out, err = child.communicate(timeout=120)
            outcomes[label] = (child.returncode, out, err)
    finally:
        for child in children.values():
            if child.poll() is None:
                child.kill()
    wrong = []
    for label, (_, _, message) in runs.items():
        rc, out, err = outcomes[label]
        if message is None:
            last = out.strip().splitlines()[-1:] or [""]
            if rc != 0 or last[0].split() != ["config.settings.production", "False"]:
                wrong.append(f"{label}: rc {rc}, {last[0]!r} {err.strip()[-160:]}")
        elif rc == 0 or "ImproperlyConfigured" not in err or message not in err:
            wrong.append(f"{label}: started (rc {rc}) {err.strip()[-160:]}")
        elif "DJANGO_SETTINGS_MODULE=config.settings.local" not in err:
            wrong.append(f"{label}: refused without saying how to develop")
    expect(not wrong, "; ".join(wrong))
    return (
        f"{len(runs) - 1} starts refused with ImproperlyConfigured; unset with real secrets is production, DEBUG off"
    )


# -- filters by another tenant's id -------------------------------------------------------------------------------
_PROBES = [
    ("user-list", "tenant", "tenant"),
    ("api-key-list", "tenant", "tenant"),
    ("reservation-list", "tenant", "tenant"),
    ("reservation-list", "endpoint", "endpoint"),
    ("replica-list", "endpoint", "endpoint"),
    ("endpoint-list", "owner_tenant", "tenant"),
    ("webhook-list", "tenant", "tenant"),
    ("slo-list", "tenant", "tenant"),
    ("slo-list", "endpoint", "endpoint"),
    ("cost-report-list", "tenant", "tenant"),
    ("cost-report-list", "endpoint", "endpoint"),
    ("usage-record-list", "tenant", "tenant"),
    ("usage-record-list", "endpoint", "endpoint"),
    ("rollout-list", "endpoint", "endpoint"),
    ("autoscaler-decision-list", "endpoint", "endpoint"),
]
MISSING_ID = 10**9


@security_case(
    "isolation.filter_probing",
    "tenant A probes ?tenant= / ?endpoint= filters with B's ids to learn which tenants and endpoints exist",
)
def filter_probing(world: SecurityWorld) -> str:
    told_apart = []
    for who, label in ((world.a.admin, "A's admin"), (world.a.keys["read"], "A's read key")):
        api = world.api(who)
        for route, field, target in _PROBES:
            url = reverse(route)
            theirs = api.get(url, {field: getattr(world.b, target).pk})
            missing = api.get(url, {field: MISSING_ID})
            if theirs.status_code == 200:
                rows = theirs.json()
                rows = rows.get("results", rows) if isinstance(rows, dict) else rows
                if rows:
                    told_apart.append(f"{label} {route}?{field}=B: {len(rows)} row(s)")
            same = theirs.status_code == missing.status_code and theirs.content == missing.content
            if not same:
                told_apart.append(f"{label} {route}?{field}=B {theirs.status_code} vs missing {missing.status_code}")
    expect(not told_apart, "; ".join(told_apart))
    api = world.api(world.a.admin)
    mine = api.get(reverse("user-list"), {"tenant": world.a.tenant.pk})
    expect(
        mine.status_code == 200 and world.a.admin.username in {r["username"] for r in mine.json()["results"]},
        "filtering by A's own tenant finds nothing: the case proves nothing",
    )
    garbage = api.get(reverse("user-list"), {"tenant": "two"})
    expect(garbage.status_code == 400, f"a non-integer id answered {garbage.status_code}")
    return f"{len(_PROBES)} filters x (A's admin, A's read key): B's id answers exactly like a missing id"
