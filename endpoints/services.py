"""Writes for endpoints and replicas: create, update, scale, delete, attach. Replica state moves are
``capacity.lifecycle.replica_transition``; field checks are ``endpoints.validation``."""

import logging
import re
from urllib.parse import urlsplit

from celery import signature
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from capacity.autoscaling import pins
from capacity.lifecycle import replica_transition
from capacity.runtimes import vllm
from capacity.runtimes.launch_options import tenant_launch_option_errors
from endpoints.models import (
    ROLLOUT_ACTIVE_STATES,
    VERSIONED_FIELDS,
    Endpoint,
    Replica,
    ReplicaRole,
    ReplicaState,
    ServingMode,
)
from endpoints.rollouts.services import apply_versioned_changes, ensure_current_version
from endpoints.validation import NAME_TAKEN, endpoint_validate, quota_errors
from gateway.routing.kv_events import endpoint_problem
from tenants.quotas import lock_tenant
from tenants.selectors import principal_is_operator
from tenants.services import audit_log

log = logging.getLogger(__name__)

# --- Endpoint lifecycle (create / update / scale / delete) -------------------------------------------------------

# Replica states that still hold (or are about to hold) GPUs; an endpoint cannot be deleted while any remain.
ACTIVE_REPLICA_STATES = (ReplicaState.PENDING, ReplicaState.STARTING, ReplicaState.READY, ReplicaState.DRAINING)

ENDPOINT_EDITABLE_FIELDS = frozenset(
    {
        "name",
        "owner_tenant",
        "model_profile",
        "hardware_profile",
        "spot_hardware_profile",
        "fallback_hardware_profile",
        "pinned_benchmark",
        "runtime",
        "launch_options",
        "min_replicas",
        "max_replicas",
        "scale_to_zero",
        "provisioned_concurrency",
        "concurrency_min",
        "concurrency_max",
        "concurrency_limit",
        "warm_pool_size",
        "routing_policy",
        "routing_plan",
        "ttft_slo_ms",
        "tpot_slo_ms",
        "fallback",
        "fallback_classes",
        "degrade_max_tokens",
        "degrade_slot_share",
        # Prefill/decode disaggregation (docs/disaggregation.md): the mode and the prefill pool's settings.
        "serving_mode",
        "kv_connector",
        "pd_min_uncached_tokens",
        "prefill_hardware_profile",
        "prefill_pinned_benchmark",
        "prefill_launch_options",
        "prefill_min_replicas",
        "prefill_max_replicas",
    }
)


def _check_quota_locked(endpoint: Endpoint) -> None:
    """The quota check again under the owner's row lock, inside the write's transaction: two concurrent creates
    that each fit alone must not both take the last slot."""
    lock_tenant(endpoint.owner_tenant_id)
    if errors := quota_errors(endpoint):
        raise ValidationError(errors)


def _refuse_operator_launch_options(actor, options, *, current: dict, field: str = "launch_options") -> None:
    """A tenant principal (user or API key) sets only the allowlisted launch options; operators and the platform
    itself (no actor) set any. The API serializer says the same first, with the same messages. The prefill pool's
    options (``field`` prefill_launch_options) are held to the same list."""
    if actor is None or isinstance(actor, str) or not isinstance(options, dict) or principal_is_operator(actor):
        return
    if errors := tenant_launch_option_errors(options, current=current):
        raise ValidationError({field: errors})


def _audit(*, actor, action: str, endpoint: Endpoint, detail: dict) -> None:
    audit_log(actor=actor, action=action, obj=endpoint, tenant=endpoint.owner_tenant, detail=detail)


def endpoint_create(*, actor=None, **fields) -> Endpoint:
    """Create an endpoint; desired replicas start at the floor (min replicas) unless given."""
    unknown = set(fields) - ENDPOINT_EDITABLE_FIELDS - {"desired_replicas"}
    if unknown:
        raise ValidationError({name: ["not a settable endpoint field"] for name in sorted(unknown)})
    _refuse_operator_launch_options(actor, fields.get("launch_options"), current={})
    _refuse_operator_launch_options(
        actor, fields.get("prefill_launch_options"), current={}, field="prefill_launch_options"
    )
    endpoint = Endpoint(**fields)
    if "desired_replicas" not in fields:
        endpoint.desired_replicas = endpoint.min_replicas
    endpoint.prefill_desired_replicas = endpoint.prefill_min_replicas
    endpoint_validate(endpoint)
    _desired_within_bounds(endpoint, endpoint.desired_replicas)
    with transaction.atomic():
        _check_quota_locked(endpoint)
        try:
            with transaction.atomic():
                endpoint.save()
        except IntegrityError:  # the same name created meanwhile: the unique constraint is the last word
            raise ValidationError({"name": [NAME_TAKEN]}) from None
        _audit(actor=actor, action="endpoint.create", endpoint=endpoint, detail={"name": endpoint.name})
        ensure_current_version(endpoint)  # version 1
    return endpoint


def endpoint_update(*, endpoint: Endpoint, actor=None, **changes) -> Endpoint:
    """Change an endpoint's settings. Desired replicas follow new bounds (clamped into [min, max]).

    Model, profiles, runtime and launch options form a version: changing them creates a new version and, when
    running replicas must be replaced, starts a rollout (the fields change when it promotes); the rest applies live.
    """
    unknown = set(changes) - ENDPOINT_EDITABLE_FIELDS
    if unknown:
        raise ValidationError({name: ["not changeable here"] for name in sorted(unknown)})
    if "launch_options" in changes:
        _refuse_operator_launch_options(actor, changes["launch_options"], current=endpoint.launch_options or {})
    if "prefill_launch_options" in changes:
        _refuse_operator_launch_options(
            actor,
            changes["prefill_launch_options"],
            current=endpoint.prefill_launch_options or {},
            field="prefill_launch_options",
        )
    versioned = {name: changes.pop(name) for name in VERSIONED_FIELDS if name in changes}
    if versioned:
        with transaction.atomic():
            apply_versioned_changes(endpoint=endpoint, user=actor, **versioned)
            endpoint.refresh_from_db()
            return endpoint_update(endpoint=endpoint, actor=actor, **changes) if changes else endpoint
    before = {name: _plain(getattr(endpoint, name)) for name in changes}
    for name, value in changes.items():
        setattr(endpoint, name, value)
    endpoint.desired_replicas = min(max(endpoint.desired_replicas, endpoint.min_replicas), endpoint.max_replicas)
    endpoint.prefill_desired_replicas = min(
        max(endpoint.prefill_desired_replicas, endpoint.prefill_min_replicas), endpoint.prefill_max_replicas
    )
    endpoint_validate(endpoint)
    diff = {name: [before[name], _plain(value)] for name, value in changes.items() if before[name] != _plain(value)}
    with transaction.atomic():
        _check_quota_locked(endpoint)
        # Only the live fields changed here: a full save would write back the versioned fields and current_version
        # as loaded, undoing a rollout's promotion that happened meanwhile.
        try:
            with transaction.atomic():
                endpoint.save(
                    update_fields=sorted({*changes, "desired_replicas", "prefill_desired_replicas", "updated_at"})
                )
        except IntegrityError:
            raise ValidationError({"name": [NAME_TAKEN]}) from None
        if diff:
            _audit(actor=actor, action="endpoint.update", endpoint=endpoint, detail={"changes": diff})
    return endpoint


def endpoint_scale(
    *,
    endpoint: Endpoint,
    desired_replicas: int,
    actor=None,
    reason: str = "",
    pin_minutes: int = pins.DEFAULT_PIN_MINUTES,
) -> Endpoint:
    """Set the desired replica count within [min, max] and start converging now. On an autoscaled endpoint the count
    is a pin the autoscaler holds for ``pin_minutes`` (then it decides on demand again); every scale is a decision
    in its log (docs/algorithms.md#manual-scaling-pins)."""
    _desired_within_bounds(endpoint, desired_replicas)
    if not 1 <= pin_minutes <= pins.MAX_PIN_MINUTES:
        raise ValidationError({"pin_minutes": [f"must lie within [1, {pins.MAX_PIN_MINUTES}]"]})
    with transaction.atomic():
        locked = Endpoint.objects.select_for_update().get(pk=endpoint.pk)
        _desired_within_bounds(locked, desired_replicas)
        previous = locked.desired_replicas
        locked.desired_replicas = desired_replicas
        locked.save(update_fields=["desired_replicas", "updated_at"])
        pin, decision = pins.pin_set(
            endpoint=locked,
            replicas=desired_replicas,
            previous=previous,
            minutes=pin_minutes,
            actor=actor,
            reason=reason,
        )
        detail = {"from": previous, "to": desired_replicas, "reason": reason}
        if pin is not None:
            detail["pinned_until"] = pin.until.isoformat()
        _audit(actor=actor, action="endpoint.scale", endpoint=locked, detail=detail)
        endpoint_id, decision_id = locked.pk, decision.pk
        transaction.on_commit(lambda: _scale_apply_enqueue(endpoint_id, decision_id))
    endpoint.desired_replicas, endpoint.updated_at = locked.desired_replicas, locked.updated_at
    return endpoint


def endpoint_unpin(*, endpoint: Endpoint, actor=None) -> bool:
    """End an operator's pin now; the autoscaler decides on demand from its next tick. False without a pin."""
    return pins.pin_release(endpoint=endpoint, actor=actor)


def _scale_apply_enqueue(endpoint_id: int, decision_id: int) -> None:
    try:
        # By name (workers.tasks.autoscaling.scale_apply): the worker reconciles at once, not at the next tick.
        signature("autoscale.scale_apply", args=[endpoint_id, decision_id]).apply_async(expires=60)
    except Exception:  # noqa: BLE001 - the next horizontal tick (5 s) applies the pinned count anyway
        log.warning("could not enqueue the scale of endpoint %s; the next tick applies it", endpoint_id, exc_info=True)


def endpoint_delete(*, endpoint: Endpoint, actor=None) -> None:
    """Delete an endpoint that no longer runs replicas (scale it to zero first), with its reservations and SLOs."""
    active = endpoint.replicas.filter(state__in=ACTIVE_REPLICA_STATES).count()
    if active:
        raise ValidationError(
            {"replicas": [f"{active} replica(s) still active; scale to 0 (min_replicas 0) and let them stop first"]}
        )
    if endpoint.rollouts.filter(state__in=ROLLOUT_ACTIVE_STATES).exists():
        raise ValidationError("a rollout is in progress; roll it back or let it finish first")
    with transaction.atomic():
        _audit(actor=actor, action="endpoint.delete", endpoint=endpoint, detail={"name": endpoint.name})
        # Finished rollouts protect the versions they name (PROTECT): they go first, with the endpoint's versions.
        endpoint.rollouts.all().delete()
        endpoint.delete()


def _desired_within_bounds(endpoint: Endpoint, desired_replicas: int) -> None:
    if isinstance(desired_replicas, bool) or not isinstance(desired_replicas, int):
        raise ValidationError({"desired_replicas": ["must be an integer"]})
    if not endpoint.min_replicas <= desired_replicas <= endpoint.max_replicas:
        raise ValidationError(
            {
                "desired_replicas": [
                    f"must lie within [min_replicas, max_replicas] = [{endpoint.min_replicas}, {endpoint.max_replicas}]"
                ]
            }
        )


def _plain(value):
    """A JSON-safe form of a field value for audit details (model instances become their pk)."""
    return getattr(value, "pk", value)


# --- Replicas attached by hand -------------------------------------------------------------------------------------

ATTACHED_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,119}$")


def _attach_names(served_model_name: str, kv_events_endpoint: str) -> tuple[str, str]:
    """An attached replica's served model name and KV-event address, checked (field errors)."""
    if len(served_model_name) > 255 or any(ord(c) < 32 for c in served_model_name):
        raise ValidationError({"served_model_name": ["at most 255 characters, no control characters"]})
    kv_events_endpoint = (kv_events_endpoint or "").strip()
    if kv_events_endpoint and (problem := endpoint_problem(kv_events_endpoint)):
        raise ValidationError({"kv_events_endpoint": [problem]})
    return served_model_name, kv_events_endpoint


def _attach_role(endpoint: Endpoint, role: str) -> str:
    """The attached replica's role: decode by default on a disaggregated endpoint, mixed on an aggregated one; a
    role that the endpoint's mode has no pool for is a field error."""
    disaggregated = endpoint.serving_mode == ServingMode.DISAGGREGATED
    role = (role or "").strip() or (ReplicaRole.DECODE if disaggregated else ReplicaRole.MIXED)
    allowed = (ReplicaRole.PREFILL, ReplicaRole.DECODE) if disaggregated else (ReplicaRole.MIXED,)
    if role not in allowed:
        mode = "a disaggregated" if disaggregated else "an aggregated"
        raise ValidationError({"role": [f"must be one of {', '.join(allowed)} on {mode} endpoint"]})
    return role


def replica_attach(
    *,
    endpoint: Endpoint,
    url: str,
    name: str = "",
    concurrency_limit: int | None = None,
    served_model_name: str = "",
    kv_events_endpoint: str = "",
    role: str = "",
    actor=None,
    check_server=None,
) -> Replica:
    """Register a vLLM server that runs elsewhere as a replica of ``endpoint`` (operators only, by the API and the
    console); it turns ready only once it has shown to be one: ``GET /health`` 200 with an empty or JSON body,
    ``GET /v1/models`` listing the model name it serves and ``vllm:`` series at ``GET /metrics``
    (``capacity.runtimes.vllm.server_problems``). Anything else is a field error on ``url`` and no row. The served
    name is ``served_model_name`` when the operator gives one (a server started with its own
    ``--served-model-name``), else the endpoint's; it is recorded on the row, and the proxy sends it as ``model``
    and writes the endpoint's name back into the answers. ``kv_events_endpoint``: where the server publishes its
    KV-cache events (``tcp://host:port``, its ``--kv-events-config``), which the proxy subscribes to. It is a
    ``static`` replica: counted as capacity, never started or stopped by an actuator. ``role``: its pool on a
    disaggregated endpoint (prefill or decode, default decode: a server started with the matching KV connector
    role), mixed on an aggregated one. ``check_server``: the check, replaceable in tests."""
    url = (url or "").strip().rstrip("/")
    if problem := vllm.base_url_problem(url) or (len(url) > 255 and "must be at most 255 characters"):
        raise ValidationError({"url": [problem]})
    name = (name or "").strip() or _attached_name(url)
    if not ATTACHED_NAME.match(name):
        raise ValidationError({"name": ["letters, digits, '.', '_' or '-', starting with a letter or digit"]})
    role = _attach_role(endpoint, role)
    named = (served_model_name or "").strip()
    served_model_name, kv_events_endpoint = _attach_names(named or endpoint.name, kv_events_endpoint)
    if concurrency_limit is not None and (
        isinstance(concurrency_limit, bool) or not isinstance(concurrency_limit, int) or concurrency_limit < 1
    ):
        raise ValidationError({"concurrency_limit": ["must be a positive whole number"]})
    live = endpoint.replicas.exclude(state=ReplicaState.STOPPED)
    if live.filter(url=url).exists():
        raise ValidationError({"url": ["is already a replica of this endpoint"]})
    if endpoint.replicas.filter(name=name).exists():
        raise ValidationError({"name": ["is already a replica name of this endpoint"]})
    # The network check runs before any row exists and outside any transaction: no lock waits on a slow server.
    problems = (check_server or vllm.server_problems)(url, served_model_name=served_model_name)
    if problems:
        errors = [f"is not a vLLM server serving {served_model_name!r}: {p}" for p in problems]
        if not named:
            # Most often a server started with its own --served-model-name: say how to attach it anyway.
            hint = "; if it serves this endpoint's model under another name, give served_model_name"
            errors = [e + hint if "GET /v1/models lists" in e else e for e in errors]
        raise ValidationError({"url": errors})
    with transaction.atomic():
        try:
            with transaction.atomic():
                replica = Replica.objects.create(
                    endpoint=endpoint,
                    name=name,
                    url=url,
                    served_model_name=served_model_name,
                    kv_events_endpoint=kv_events_endpoint,
                    actuator="static",
                    concurrency_limit=concurrency_limit or endpoint.concurrency_limit,
                    role=role,
                )
        except IntegrityError:
            raise ValidationError({"name": ["is already a replica name of this endpoint"]}) from None
        who = getattr(actor, "username", "") or "the platform"
        replica_transition(replica=replica, to_state=ReplicaState.STARTING, reason=f"attached by {who}")
        replica_transition(
            replica=replica,
            to_state=ReplicaState.READY,
            reason=f"vLLM checks passed: /health 200, /v1/models lists {served_model_name!r}, /metrics has vllm: series",
        )
        audit_log(
            actor=actor,
            action="replica.attach",
            obj=replica,
            tenant=endpoint.owner_tenant,
            detail={"endpoint": endpoint.name, "replica": name, "url": url, "served_model_name": served_model_name},
        )
    return replica


def _attached_name(url: str) -> str:
    parts = urlsplit(url)
    host = re.sub(r"[^A-Za-z0-9.-]+", "-", parts.hostname or "host").strip("-.") or "host"
    return f"attached-{host}-{parts.port or (443 if parts.scheme == 'https' else 80)}"[:120]
