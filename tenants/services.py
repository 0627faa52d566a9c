"""Writes for tenants, users and API keys, and the audit trail every app writes to. Views, serializers and the
console call these; reservations are sold by ``capacity.services``."""

import logging
from datetime import datetime

from celery import signature
from django.contrib.auth.forms import PasswordResetForm
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from billing.models import UsageRecord
from endpoints.models import Replica, ReplicaState
from tenants.keys import generate_key
from tenants.models import ApiKey, AuditEntry, OperatorToken, OperatorTokenScope, PriorityClass, Role, Tenant, User
from tenants.operator_tokens import (
    DEFAULT_LIFETIME,
    LAST_USED_EVERY_S,
    generate_token,
    lifetime_error,
    owner_may_hold,
    token_of,
)

log = logging.getLogger(__name__)


def audit_log(*, actor=None, action: str, obj, tenant=None, detail: dict | None = None) -> AuditEntry:
    label = getattr(actor, "username", "") or "system"
    token = token_of(actor)
    if token is not None:
        # The owner is the actor; which of their tokens acted is said too, so a leaked one's trail can be found.
        label = f"{label} (token {token.prefix})"
        detail = {**(detail or {}), "operator_token": token.prefix}
    user = actor if getattr(actor, "pk", None) and not isinstance(actor, str) and hasattr(actor, "role") else None
    return AuditEntry.objects.create(
        actor=user,
        actor_label=label,
        tenant=tenant if tenant is not None else getattr(obj, "tenant", None),
        action=action,
        object_type=obj._meta.model_name,
        object_id=str(obj.pk),
        detail=detail or {},
    )


def tenant_create(*, name: str, slug: str, actor=None) -> Tenant:
    tenant = Tenant.objects.create(name=name, slug=slug)
    audit_log(actor=actor, action="tenant.create", obj=tenant, tenant=tenant)
    return tenant


KEY_CONTROLS = frozenset(
    {"rpm_limit", "tpm_limit", "mu_per_min_limit", "allowed_models", "budget_usd", "budget_period"}
)


@transaction.atomic
def api_key_create(
    *,
    tenant: Tenant,
    name: str,
    scopes: list[str] | None = None,
    max_priority: str = PriorityClass.STANDARD,
    expires_at: datetime | None = None,
    actor=None,
    **controls,
) -> tuple[ApiKey, str]:
    """Create a key and return it with the full secret, which is never retrievable again. ``controls``: the key's
    own limits, allowlist and budget (``ApiKey.rpm_limit`` … ``budget_period``)."""
    unknown = set(controls) - KEY_CONTROLS
    if unknown:
        raise ValidationError({name: ["not a key setting"] for name in sorted(unknown)})
    raw, prefix, digest = generate_key()
    key = ApiKey(
        tenant=tenant,
        name=name,
        prefix=prefix,
        key_hash=digest,
        scopes=list(scopes) if scopes is not None else ["inference"],
        max_priority=max_priority,
        expires_at=expires_at,
        created_by=actor if getattr(actor, "role", None) else None,
        **controls,
    )
    key.full_clean(exclude=["created_by"])
    key.save()
    audit_log(actor=actor, action="api_key.create", obj=key, detail={"prefix": prefix, "scopes": key.scopes})
    return key, raw


def api_key_revoke(*, api_key: ApiKey, actor=None) -> ApiKey:
    if api_key.revoked_at is None:
        api_key.revoked_at = timezone.now()
        api_key.save(update_fields=["revoked_at"])
        audit_log(actor=actor, action="api_key.revoke", obj=api_key, detail={"prefix": api_key.prefix})
    return api_key


# --- Tenants, users, key settings and reservations (REST API and console) ----------------------------------------


def validated_save(obj, *, exclude: list[str] | None = None) -> None:
    """Save after the model's own validation, so a bad value is a field error and not a database error."""
    obj.full_clean(exclude=exclude)
    obj.save()


def field_changes(obj, changes: dict) -> dict:
    """Apply ``changes`` to ``obj`` and return what differs, as ``{field: [before, after]}`` for an audit entry."""
    diff = {}
    for name, value in changes.items():
        before, after = getattr(obj, name), value
        before, after = getattr(before, "pk", before), getattr(after, "pk", after)
        if before != after:
            diff[name] = [str(before) if before is not None else None, str(after) if after is not None else None]
        setattr(obj, name, value)
    return diff


@transaction.atomic
def tenant_update(*, tenant: Tenant, actor=None, **changes) -> Tenant:
    """Change a tenant (operators). Setting ``is_active`` off suspends it: its people and keys are refused at once
    (``tenants.backends``, ``tenants.keys``) and, after commit, a worker pauses its rollouts and drains its replicas
    (``workers.tasks.tenants``); docs/security.md, "Suspended tenants"."""
    diff = field_changes(tenant, changes)
    validated_save(tenant)
    if diff:
        audit_log(actor=actor, action="tenant.update", obj=tenant, tenant=tenant, detail={"changes": diff})
    if "is_active" in diff and not tenant.is_active:
        tenant_id = tenant.pk
        transaction.on_commit(lambda: _suspension_enqueue(tenant_id))
    return tenant


def _suspension_enqueue(tenant_id: int) -> None:
    try:
        # By name (workers.tasks.tenants.suspension_apply): the task module imports services above this one.
        signature("tenants.suspension_apply", args=[tenant_id]).apply_async()
    except Exception:  # noqa: BLE001 - the autoscaler's ticks drain the replicas within seconds anyway
        log.warning(
            "could not enqueue the suspension of tenant %s; the autoscaler drains it", tenant_id, exc_info=True
        )


def tenant_delete(*, tenant: Tenant, actor=None) -> None:
    """Delete a tenant with its users, keys, reservations and owned endpoints: operators only.

    Refused while it has usage on record (that is billing history: deactivate the tenant instead) or owns
    endpoints whose replicas still run.
    """
    if UsageRecord.objects.filter(tenant=tenant).exists():
        raise ValidationError({"non_field_errors": ["this tenant has usage on record; set is_active=false instead"]})
    running = Replica.objects.filter(endpoint__owner_tenant=tenant).exclude(
        state__in=[ReplicaState.STOPPED, ReplicaState.FAILED]
    )
    if running.exists():
        raise ValidationError(
            {"non_field_errors": ["this tenant's endpoints still run replicas; scale them to 0 first"]}
        )
    with transaction.atomic():
        audit_log(actor=actor, action="tenant.delete", obj=tenant, tenant=None, detail={"slug": tenant.slug})
        tenant.delete()


def _check_role_and_tenant(user: User) -> None:
    if user.role == Role.OPERATOR and user.tenant_id is not None:
        raise ValidationError({"tenant": ["operators belong to no tenant"]})
    if user.role != Role.OPERATOR and user.tenant_id is None:
        raise ValidationError({"tenant": ["tenant admins and members need a tenant"]})


def _check_password(password: str, user: User) -> None:
    try:
        validate_password(password, user=user)
    except ValidationError as exc:
        raise ValidationError({"password": exc.messages}) from exc


@transaction.atomic
def user_create(
    *,
    username: str,
    role: str,
    tenant: Tenant | None,
    password: str | None = None,
    email: str = "",
    first_name: str = "",
    last_name: str = "",
    actor=None,
) -> User:
    user = User(username=username, role=role, tenant=tenant, email=email, first_name=first_name, last_name=last_name)
    # Operators reach the admin; tenant users never do.
    user.is_staff = role == Role.OPERATOR
    _check_role_and_tenant(user)
    if password:
        _check_password(password, user)
        user.set_password(password)
    else:
        user.set_unusable_password()
    validated_save(user)
    audit_log(actor=actor, action="user.create", obj=user, tenant=tenant, detail={"username": username, "role": role})
    return user


# Whoever sets a user's email address receives that user's password reset links: an admin who could change it
# would reset the password to the new address and log in as that person.
EMAIL_SELF_OR_OPERATOR = (
    "only the user changes their own email address (PATCH /api/v1/me/ with their current password), or an operator"
)


@transaction.atomic
def user_update(*, user: User, actor=None, password: str | None = None, **changes) -> User:
    if (
        "email" in changes
        and changes["email"] != user.email
        and actor is not None
        and not getattr(actor, "is_operator", False)
    ):
        raise ValidationError({"email": [EMAIL_SELF_OR_OPERATOR]})
    diff = field_changes(user, changes)
    if "role" in changes:
        user.is_staff = user.role == Role.OPERATOR
    _check_role_and_tenant(user)
    if password:
        _check_password(password, user)
        user.set_password(password)
        diff["password"] = ["…", "…"]
    validated_save(user)
    if diff:
        audit_log(actor=actor, action="user.update", obj=user, tenant=user.tenant, detail={"changes": diff})
    return user


def user_password_change(*, user: User, old_password: str, new_password: str) -> User:
    """A person changes their own password: the old one proves it is them, not someone holding their session."""
    if not user.check_password(old_password):
        raise ValidationError({"old_password": ["is not your current password"]})
    try:
        validate_password(new_password, user=user)
    except ValidationError as exc:
        raise ValidationError({"new_password": exc.messages}) from exc
    with transaction.atomic():
        user.set_password(new_password)
        user.save(update_fields=["password"])
        audit_log(actor=user, action="user.password_change", obj=user, tenant=user.tenant)
    return user


def user_email_change(*, user: User, current_password: str, email: str) -> User:
    """A person changes their own email address; the current password proves it is them, not someone holding their
    session who wants the reset links sent elsewhere."""
    if not user.check_password(current_password):
        raise ValidationError({"current_password": ["is not your current password"]})
    before = user.email
    user.email = email
    with transaction.atomic():
        validated_save(user)
        if before != email:
            audit_log(
                actor=user, action="user.email_change", obj=user, tenant=user.tenant, detail={"email": [before, email]}
            )
    return user


class _OneUserPasswordResetForm(PasswordResetForm):
    """Django's reset mail for one known user (the stock form looks users up by address and skips locked ones)."""

    def __init__(self, user: User):
        super().__init__(data={"email": user.email})
        self.user = user

    def get_users(self, email):
        return [self.user]


def user_password_reset(*, user: User, actor=None, domain: str, use_https: bool) -> None:
    """Lock a user's password and mail them Django's one-time link to choose a new one.

    Whoever asks (a tenant admin, an operator) never learns or sets the password, so resetting an account
    cannot be used to take it over; the old password and every session on it stop working at once.
    """
    if not user.email:
        raise ValidationError({"email": ["this user has no email address to send a reset link to"]})
    form = _OneUserPasswordResetForm(user)
    if not form.is_valid():
        raise ValidationError({"email": form.errors.get("email", ["is not a valid address"])})
    with transaction.atomic():
        user.set_unusable_password()
        user.save(update_fields=["password"])
        audit_log(actor=actor, action="user.password_reset", obj=user, tenant=user.tenant)
    # The stock form logs a mail failure instead of raising; the user can still ask for a link at the login page.
    form.save(domain_override=domain, use_https=use_https)


@transaction.atomic
def user_delete(*, user: User, actor=None) -> None:
    audit_log(actor=actor, action="user.delete", obj=user, tenant=user.tenant, detail={"username": user.username})
    user.delete()


@transaction.atomic
def api_key_update(*, api_key: ApiKey, actor=None, **changes) -> ApiKey:
    """Rename a key or change its scopes, priority ceiling or expiry; the secret itself never changes."""
    diff = field_changes(api_key, changes)
    validated_save(api_key)
    if diff:
        audit_log(
            actor=actor, action="api_key.update", obj=api_key, detail={"prefix": api_key.prefix, "changes": diff}
        )
    return api_key


# --- Operator tokens (docs/security.md, "Operator tokens") ------------------------------------------------------


@transaction.atomic
def operator_token_create(
    *, user: User, name: str, scopes: list[str], expires_at: datetime | None = None, actor=None
) -> tuple[OperatorToken, str]:
    """Mint a token for an active operator account (a person or a service account) and return it with the full
    secret, which is never retrievable again. It always expires: 30 days unless said, a year at most."""
    if not owner_may_hold(user):
        raise ValidationError({"user": ["operator tokens belong to active operator accounts only"]})
    unknown = set(scopes) - set(OperatorTokenScope.values)
    if not scopes or unknown:
        raise ValidationError({"scopes": [f"one or more of: {', '.join(OperatorTokenScope.values)}"]})
    expires_at = expires_at or timezone.now() + DEFAULT_LIFETIME
    if error := lifetime_error(expires_at):
        raise ValidationError({"expires_at": [error]})
    raw, prefix, digest = generate_token()
    token = OperatorToken.objects.create(
        user=user,
        name=name,
        prefix=prefix,
        token_hash=digest,
        scopes=sorted(set(scopes)),
        expires_at=expires_at,
        created_by=actor if isinstance(actor, User) else None,
    )
    audit_log(
        actor=actor,
        action="operator_token.create",
        obj=token,
        tenant=None,
        detail={
            "prefix": prefix,
            "owner": user.username,
            "scopes": token.scopes,
            "expires_at": expires_at.isoformat(),
        },
    )
    return token, raw


def operator_token_revoke(*, token: OperatorToken, actor=None) -> OperatorToken:
    """Revoke at once (the next request with it is a 401); revoking twice keeps the first time."""
    with transaction.atomic():
        locked = OperatorToken.objects.select_for_update().get(pk=token.pk)
        if locked.revoked_at is None:
            locked.revoked_at = timezone.now()
            locked.save(update_fields=["revoked_at"])
            audit_log(
                actor=actor,
                action="operator_token.revoke",
                obj=locked,
                tenant=None,
                detail={"prefix": locked.prefix, "owner": token.user.username},
            )
    token.revoked_at = locked.revoked_at
    return token


def operator_token_used(*, token: OperatorToken, method: str, path: str, write: bool) -> None:
    """Every write made with a token leaves an audit entry as its owner, whatever the view audits itself (and whether
    or not it succeeds); reads only refresh ``last_used_at``, at most once a minute."""
    now = timezone.now()
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() >= LAST_USED_EVERY_S:
        OperatorToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    if write:
        audit_log(
            actor=token.user,
            action="operator_token.use",
            obj=token,
            tenant=None,
            detail={"method": method, "path": path[:200]},
        )
