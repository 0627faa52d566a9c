"""Writes for endpoint versions and rollouts: what operators and endpoint updates ask for.

Versions: ``create_version`` (a new immutable version from the current one plus changes), ``activate_version``
(switch at once, for endpoints with no replicas to replace), ``apply_versioned_changes`` (what an endpoint update
calls: a new version, then a rollout or a direct switch).
Rollouts: ``start_rollout``, ``pause_rollout``, ``resume_rollout``, ``promote_rollout``, ``rollback_rollout`` (each
with an audit entry and a ``RolloutEvent``). The tick that moves a rollout along is ``endpoints.rollouts.ticks``.
"""

from __future__ import annotations

import copy
import logging

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Max, Q
from django.utils import timezone

from capacity.autoscaling import actuators
from capacity.autoscaling.limits import rollout_surge_allowance
from capacity.autoscaling.services import quota_left
from endpoints.config_version import bump_config_version
from endpoints.models import (
    VERSIONED_FIELDS,
    Endpoint,
    EndpointVersion,
    Replica,
    ReplicaState,
    Rollout,
    RolloutEvent,
    RolloutState,
    RolloutStrategy,
    active_rollout,
)
from endpoints.rollouts import machine
from endpoints.validation import endpoint_validate
from tenants.quotas import lock_tenant
from tenants.services import audit_log

log = logging.getLogger(__name__)

FINAL_STATES = {RolloutState.SUCCEEDED, RolloutState.ROLLED_BACK, RolloutState.FAILED}


# -- versions -------------------------------------------------------------------------------------------------
def ensure_current_version(endpoint: Endpoint) -> EndpointVersion:
    """The endpoint's serving version; version 1 is created from its fields when it has none yet."""
    if endpoint.current_version_id:
        return endpoint.current_version
    with transaction.atomic():
        locked = Endpoint.objects.select_for_update().get(pk=endpoint.pk)
        if locked.current_version_id is None:
            number = (locked.versions.aggregate(n=Max("number"))["n"] or 0) + 1
            version = EndpointVersion.objects.create(
                endpoint=locked,
                number=number,
                model_profile_id=locked.model_profile_id,
                hardware_profile_id=locked.hardware_profile_id,
                runtime=locked.runtime,
                launch_options=locked.launch_options or {},
                note="initial version",
            )
            Endpoint.objects.filter(pk=locked.pk).update(current_version=version)
            locked.current_version = version
            # Replicas started before versions existed run this one.
            Replica.objects.filter(endpoint=locked, version__isnull=True).update(version=version)
    endpoint.current_version = locked.current_version
    return endpoint.current_version


def _clean_changes(endpoint: Endpoint, changes: dict) -> dict:
    unknown = set(changes) - set(VERSIONED_FIELDS)
    if unknown:
        raise ValidationError({name: ["not part of a version"] for name in sorted(unknown)})
    if not changes:
        raise ValidationError("a new version needs at least one of: " + ", ".join(VERSIONED_FIELDS))
    clean = {}
    for name, value in changes.items():
        if name in ("model_profile", "hardware_profile"):
            value = getattr(value, "pk", value)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValidationError({name: ["must be a profile id"]})
        clean[name] = value
    # The endpoint's own validation (field choices, launch options, actuator, pinned benchmark) on the new spec.
    candidate = copy.copy(endpoint)
    for name, value in clean.items():
        setattr(candidate, f"{name}_id" if name.endswith("_profile") else name, value)
    for cached in ("model_profile", "hardware_profile"):
        candidate._state.fields_cache.pop(cached, None)
    endpoint_validate(candidate, check_launch_values=bool({"launch_options", "runtime"} & set(clean)))
    return clean


def create_version(*, endpoint: Endpoint, user=None, note: str = "", **changes) -> EndpointVersion:
    """A new version: the current version's fields with ``changes`` (model_profile, hardware_profile, runtime,
    launch_options) applied. Versions are never edited; raises ValidationError when nothing would change."""
    current = ensure_current_version(endpoint)
    clean = _clean_changes(endpoint, changes)
    spec = {**current.spec(), **clean}
    if spec == current.spec():
        raise ValidationError("nothing changed: the new version would equal the current one")
    with transaction.atomic():
        locked = Endpoint.objects.select_for_update().get(pk=endpoint.pk)
        number = (locked.versions.aggregate(n=Max("number"))["n"] or 0) + 1
        version = EndpointVersion.objects.create(
            endpoint=locked,
            number=number,
            model_profile_id=spec["model_profile"],
            hardware_profile_id=spec["hardware_profile"],
            runtime=spec["runtime"],
            launch_options=spec["launch_options"],
            created_by=_user(user),
            note=note[:255],
        )
        audit_rollout(
            user,
            "endpoint.version.create",
            endpoint,
            {"version": number, "changes": {k: [current.spec()[k], v] for k, v in clean.items()}},
        )
    return version


def activate_version(*, endpoint: Endpoint, version: EndpointVersion, user=None, reason: str = "") -> Endpoint:
    """Make ``version`` the serving one at once (no replicas are replaced: for endpoints without any to replace)."""
    if version.endpoint_id != endpoint.pk:
        raise ValidationError({"version": ["belongs to another endpoint"]})
    with transaction.atomic():
        Endpoint.objects.select_for_update().get(pk=endpoint.pk)  # one at a time with start_rollout
        if active_rollout(endpoint) is not None:
            raise ValidationError("a rollout is in progress; promote or roll it back first")
        previous = endpoint.current_version_id
        mirror_version(endpoint, version)
        audit_rollout(
            user,
            "endpoint.version.activate",
            endpoint,
            {"version": version.number, "reason": reason, "previous_version_id": previous},
        )
    return endpoint


def mirror_version(endpoint: Endpoint, version: EndpointVersion) -> None:
    """The endpoint's own fields follow its serving version (the rest of the platform reads them)."""
    fields = {
        "current_version": version,
        "model_profile_id": version.model_profile_id,
        "hardware_profile_id": version.hardware_profile_id,
        "runtime": version.runtime,
        "launch_options": version.launch_options,
        "updated_at": timezone.now(),
    }
    Endpoint.objects.filter(pk=endpoint.pk).update(**fields)
    for name, value in fields.items():
        setattr(endpoint, name, value)
    for cached in ("model_profile", "hardware_profile"):
        endpoint._state.fields_cache.pop(cached, None)
    transaction.on_commit(bump_proxies)


def needs_rollout(endpoint: Endpoint) -> bool:
    """True when the endpoint's actuator runs replicas for it (they must be replaced by a rollout); hand-registered
    replicas cannot be replaced, so a new version applies to the endpoint at once."""
    try:
        actuator = actuators.get_actuator(endpoint)
    except actuators.ActuatorError:
        return False
    if actuator.name == "static":
        return False
    return endpoint.replicas.filter(
        state__in=[ReplicaState.PENDING, ReplicaState.STARTING, ReplicaState.READY], actuator=actuator.name
    ).exists()


def apply_versioned_changes(*, endpoint: Endpoint, user=None, note: str = "", **changes) -> Rollout | None:
    """What an endpoint update calls for model / profile / runtime / launch-option changes: a new version, then
    an all-at-once rollout when running replicas must be replaced, else a direct switch. Returns the rollout."""
    current = ensure_current_version(endpoint)
    if {**current.spec(), **{k: getattr(v, "pk", v) for k, v in changes.items()}} == current.spec():
        return None
    if active_rollout(endpoint) is not None:
        raise ValidationError("a rollout is in progress; promote or roll it back before changing the version")
    version = create_version(endpoint=endpoint, user=user, note=note, **changes)
    if needs_rollout(endpoint):
        return start_rollout(endpoint=endpoint, to_version=version, user=user)
    activate_version(endpoint=endpoint, version=version, user=user, reason="no running replicas to replace")
    return None


# -- rollouts: operator actions ---------------------------------------------------------------------------------
def start_rollout(
    *,
    endpoint: Endpoint,
    to_version: EndpointVersion,
    user=None,
    strategy: str = RolloutStrategy.ALL_AT_ONCE,
    canary_steps: list[int] | None = None,
    step_duration_s: int = 60,
    max_surge: int = 2,
    health_timeout_s: int = 600,
    error_rate_margin: float = 0.05,
    latency_burn_margin: float = 0.10,
    min_samples: int = 20,
) -> Rollout:
    """Start moving the endpoint's traffic to ``to_version``; the beat task's ticks carry it out."""
    from_version = ensure_current_version(endpoint)
    settings = {
        "strategy": strategy,
        "step_duration_s": step_duration_s,
        "max_surge": max_surge,
        "health_timeout_s": health_timeout_s,
        "error_rate_margin": error_rate_margin,
        "latency_burn_margin": latency_burn_margin,
        "min_samples": min_samples,
    }
    steps = _validated_rollout(
        endpoint=endpoint,
        from_version=from_version,
        to_version=to_version,
        canary_steps=canary_steps if canary_steps is not None else [10, 50, 100],
        **settings,
    )
    with transaction.atomic():
        lock_tenant(endpoint.owner_tenant_id)  # the surge's quota check, one at a time with the autoscaler's launches
        Endpoint.objects.select_for_update().get(pk=endpoint.pk)
        if active_rollout(endpoint) is not None:
            raise ValidationError("a rollout is already in progress for this endpoint")
        baseline = replicas_of(endpoint, from_version, current=from_version).filter(state=ReplicaState.READY).count()
        settings["max_surge"], surge_note = _surge_within_quota(
            endpoint=endpoint, from_version=from_version, to_version=to_version, baseline=baseline, max_surge=max_surge
        )
        rollout = _rollout_create(
            endpoint=endpoint,
            from_version=from_version,
            to_version=to_version,
            canary_steps=steps,
            baseline=baseline,
            user=user,
            **settings,
        )
        record_event(
            rollout,
            "created",
            "",
            RolloutState.PENDING,
            f"v{from_version.number} → v{to_version.number}, {strategy}, baseline {baseline} ready replica(s)"
            + surge_note,
        )
        audit_rollout(
            user,
            "rollout.start",
            endpoint,
            {"rollout": rollout.pk, "from": from_version.number, "to": to_version.number, "strategy": strategy},
        )
    return rollout


def _validated_rollout(
    *,
    endpoint: Endpoint,
    from_version: EndpointVersion,
    to_version: EndpointVersion,
    canary_steps: list[int],
    strategy: str,
    step_duration_s: int,
    max_surge: int,
    health_timeout_s: int,
    error_rate_margin: float,
    latency_burn_margin: float,
    min_samples: int,
) -> list[int]:
    """The canary steps, validated; a ValidationError naming each bad field, or the actuator's refusal of the
    version change (on ``to_version``), otherwise."""
    errors: dict[str, list[str]] = {}
    if to_version.endpoint_id != endpoint.pk:
        errors["to_version"] = ["belongs to another endpoint"]
    elif to_version.pk == from_version.pk:
        errors["to_version"] = ["is already the serving version"]
    if strategy not in RolloutStrategy.values:
        errors["strategy"] = [f"one of {', '.join(RolloutStrategy.values)}"]
    steps = canary_steps
    try:
        steps = machine.validate_canary_steps(canary_steps)
    except ValueError as exc:
        errors["canary_steps"] = [str(exc)]
    for name, value, low in (
        ("max_surge", max_surge, 1),
        ("step_duration_s", step_duration_s, 1),
        ("health_timeout_s", health_timeout_s, 1),
        ("min_samples", min_samples, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            errors[name] = [f"must be a whole number of at least {low}"]
    for name, value in (("error_rate_margin", error_rate_margin), ("latency_burn_margin", latency_burn_margin)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            errors[name] = ["must be a fraction between 0 and 1"]
    if not errors:
        try:
            actuator = actuators.get_actuator(endpoint)
        except actuators.ActuatorError as exc:
            errors["launch_options"] = [str(exc)]
        else:
            refusal = actuator.rollout_refusal(endpoint, from_version, to_version)
            if refusal:
                errors["to_version"] = [refusal]
    if errors:
        raise ValidationError(errors)
    return steps


def _rollout_create(
    *,
    endpoint: Endpoint,
    from_version: EndpointVersion,
    to_version: EndpointVersion,
    canary_steps: list[int],
    baseline: int,
    user,
    error_rate_margin: float,
    latency_burn_margin: float,
    **settings,
) -> Rollout:
    try:
        with transaction.atomic():  # the one-active-rollout constraint, should a writer bypass the endpoint's lock
            return Rollout.objects.create(
                endpoint=endpoint,
                from_version=from_version,
                to_version=to_version,
                canary_steps=canary_steps,
                error_rate_margin=float(error_rate_margin),
                latency_burn_margin=float(latency_burn_margin),
                baseline_ready=baseline,
                created_by=_user(user),
                **settings,
            )
    except IntegrityError:
        raise ValidationError("a rollout is already in progress for this endpoint") from None


def _surge_within_quota(
    *, endpoint: Endpoint, from_version: EndpointVersion, to_version: EndpointVersion, baseline: int, max_surge: int
) -> tuple[int, str]:
    """The rollout's surge replicas are launches like the autoscaler's: a tenant-owned endpoint's must fit what its
    quota has left (``capacity.autoscaling.limits``), so the surge is capped, or the rollout refused if none fits.
    Called with the tenant's row locked (``lock_tenant``), as the autoscaler launches."""
    if endpoint.owner_tenant_id is None:
        return max_surge, ""
    facts = machine.RolloutFacts(state=RolloutState.PENDING, now=0.0, state_since=0.0, baseline_ready=baseline)
    wanted = machine.surge(facts, machine.RolloutConfig(max_surge=max_surge))
    allowed, why = rollout_surge_allowance(
        wanted=wanted,
        baseline=baseline,
        left=quota_left(endpoint, exclude_own_serving=False),
        old_gpus_per_replica=from_version.hardware_profile.gpus_per_replica,
        new_gpus_per_replica=to_version.hardware_profile.gpus_per_replica,
    )
    if allowed < 1:
        raise ValidationError(
            {"max_surge": [f"no surge replica fits the tenant's quota ({why}); ask an operator to raise the quota"]}
        )
    if allowed < wanted:
        return allowed, f"; surge capped at {allowed} of {wanted}: {why}"
    return max_surge, ""


def pause_rollout(*, rollout: Rollout, user=None, reason: str = "") -> Rollout:
    def change(locked: Rollout) -> str:
        if locked.state not in (RolloutState.PENDING, RolloutState.SURGING, RolloutState.SHIFTING):
            raise ValidationError(f"a {locked.state} rollout cannot be paused")
        locked.paused_from = locked.state
        return RolloutState.PAUSED

    return _operator_action(rollout, user, "pause", change, reason or "paused by an operator")


def resume_rollout(*, rollout: Rollout, user=None, reason: str = "") -> Rollout:
    def change(locked: Rollout) -> str:
        if locked.state != RolloutState.PAUSED:
            raise ValidationError("only a paused rollout can be resumed")
        to_state, locked.paused_from = locked.paused_from or RolloutState.PENDING, ""
        if to_state == RolloutState.SHIFTING:
            locked.step_started_at = timezone.now()  # the canary is observed afresh after a pause
        return to_state

    return _operator_action(rollout, user, "resume", change, reason or "resumed by an operator")


def promote_rollout(*, rollout: Rollout, user=None, reason: str = "") -> Rollout:
    """Skip the remaining canary steps (and the canary comparison): the rollout carries on as all at once, the new
    version's traffic growing with its warmed replicas batch by batch, never ahead of its capacity."""

    def change(locked: Rollout) -> str:
        state = locked.paused_from if locked.state == RolloutState.PAUSED else locked.state
        if state in (RolloutState.PENDING, RolloutState.SURGING, RolloutState.SHIFTING):
            locked.strategy = RolloutStrategy.ALL_AT_ONCE
            locked.paused_from = ""
            return state
        raise ValidationError(f"a {locked.state} rollout cannot be promoted")

    return _operator_action(rollout, user, "promote", change, reason or "promoted by an operator")


def rollback_rollout(*, rollout: Rollout, user=None, reason: str = "") -> Rollout:
    """Traffic back to the old version and the new one drained (before the old version started draining)."""

    def change(locked: Rollout) -> str:
        if locked.state not in machine.ROLLBACK_FROM:
            raise ValidationError(f"a {locked.state} rollout cannot be rolled back")
        locked.traffic_percent, locked.paused_from = 0, ""
        return RolloutState.ROLLING_BACK

    return _operator_action(rollout, user, "rollback", change, reason or "rolled back by an operator")


def _operator_action(rollout: Rollout, user, kind: str, change, reason: str) -> Rollout:
    with transaction.atomic():
        locked = Rollout.objects.select_for_update().get(pk=rollout.pk)
        before = locked.state
        to_state = change(locked)
        now = timezone.now()
        if to_state != before:
            locked.state, locked.state_changed_at = to_state, now
        locked.reason = reason[:500]
        locked.save()
        record_event(locked, kind, before, to_state, reason, {"by": getattr(user, "username", "") or "system"})
        audit_rollout(
            user,
            f"rollout.{kind}",
            locked.endpoint,
            {"rollout": locked.pk, "from_state": before, "to_state": to_state, "reason": reason},
        )
        transaction.on_commit(bump_proxies)
    return locked


def replicas_of(endpoint: Endpoint, version: EndpointVersion, *, current: EndpointVersion | None):
    """A version's replicas; unversioned (hand-registered) ones count as ``current``."""
    match = Q(version=version)
    if current is not None and current.pk == version.pk:
        match |= Q(version__isnull=True)
    return Replica.objects.filter(match, endpoint=endpoint, is_standby=False)


# -- helpers --------------------------------------------------------------------------------------------------
def record_event(rollout: Rollout, kind: str, from_state: str, to_state: str, message: str, data: dict | None = None):
    return RolloutEvent.objects.create(
        rollout=rollout, kind=kind, from_state=from_state, to_state=to_state, message=message[:500], data=data or {}
    )


def _user(user):
    return user if getattr(user, "pk", None) and hasattr(user, "role") else None


def audit_rollout(user, action: str, endpoint: Endpoint, detail: dict) -> None:
    audit_log(actor=user, action=action, obj=endpoint, tenant=endpoint.owner_tenant, detail=detail)


def bump_proxies() -> None:
    bump_config_version()
