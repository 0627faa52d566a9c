"""Writes for endpoints and replicas, including the replica lifecycle state machine."""

import json
import re

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from endpoints.models import REPLICA_TRANSITIONS, Endpoint, Replica, ReplicaState, ReplicaTransition


class IllegalTransition(Exception):
    """A replica was asked to move to a state its lifecycle does not allow from where it is."""


def replica_transition(*, replica: Replica, to_state: str, reason: str = "") -> Replica:
    """Move a replica along its lifecycle, recording the transition. Illegal moves raise.

    The row is locked so that a health check and an actuator racing on one replica cannot both win.
    """
    with transaction.atomic():
        locked = Replica.objects.select_for_update().get(pk=replica.pk)
        if to_state not in REPLICA_TRANSITIONS[locked.state]:
            raise IllegalTransition(f"replica {locked.pk}: {locked.state} → {to_state} is not allowed")
        now = timezone.now()
        ReplicaTransition.objects.create(
            replica=locked, from_state=locked.state, to_state=to_state, at=now, reason=reason
        )
        locked.state = to_state
        locked.state_changed_at = now
        update_fields = ["state", "state_changed_at"]
        if to_state == ReplicaState.FAILED:
            locked.failure_reason = reason[:255]
            update_fields.append("failure_reason")
        locked.save(update_fields=update_fields)
    replica.state, replica.state_changed_at = locked.state, locked.state_changed_at
    replica.failure_reason = locked.failure_reason
    return replica


# --- Endpoint lifecycle (create / update / scale / delete) -------------------------------------------------------

# Replica states that still hold (or are about to hold) GPUs; an endpoint cannot be deleted while any remain.
ACTIVE_REPLICA_STATES = (ReplicaState.PENDING, ReplicaState.STARTING, ReplicaState.READY, ReplicaState.DRAINING)

ENDPOINT_EDITABLE_FIELDS = frozenset(
    {
        "name",
        "owner_tenant",
        "model_profile",
        "hardware_profile",
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
        "ttft_slo_ms",
        "tpot_slo_ms",
    }
)


# Endpoint names are one namespace (the proxy resolves the OpenAI ``model`` by name alone), so a taken name must be
# refused; the message neither says whose it is nor that it is an endpoint (Django's "Endpoint with this Name
# already exists"), the same for a tenant's own endpoint, another tenant's and a shared one.
NAME_TAKEN = "is not available: choose another name"


def _endpoint_validate(endpoint: Endpoint, *, check_launch_values: bool | None = None) -> None:
    """Field validators, uniqueness and the cross-field bounds of Endpoint.clean, all as one ValidationError.

    ``check_launch_values``: also refuse launch option values the launchers cannot use (default: for a new
    endpoint; a new version asks for it, a live change leaves the stored options alone)."""
    errors: dict[str, list[str]] = {}
    try:
        endpoint.full_clean(validate_unique=False)
    except ValidationError as exc:
        errors.update(exc.message_dict)
    if endpoint.name and Endpoint.objects.filter(name=endpoint.name).exclude(pk=endpoint.pk).exists():
        errors.setdefault("name", []).append(NAME_TAKEN)
    if check_launch_values is None:
        check_launch_values = endpoint._state.adding
    if not isinstance(endpoint.launch_options, dict):
        errors.setdefault("launch_options", []).append("must be a JSON object")
    elif "\\u0000" in json.dumps(endpoint.launch_options):
        # PostgreSQL's jsonb cannot hold a NUL character: refuse it here rather than fail the INSERT.
        errors.setdefault("launch_options", []).append("must not contain NUL characters")
    elif check_launch_values and (bad := launch_option_errors(endpoint.launch_options, runtime=endpoint.runtime)):
        errors.setdefault("launch_options", []).extend(bad)
    elif "actuator" in endpoint.launch_options:
        # Refuse an unknown actuator now rather than at the autoscaler's next tick.
        from capacity.autoscaling.actuators import ActuatorError, get_actuator

        try:
            get_actuator(endpoint)
        except ActuatorError as exc:
            errors.setdefault("launch_options", []).append(str(exc))
    for field, messages in _quota_errors(endpoint).items():
        errors.setdefault(field, []).extend(messages)
    benchmark = endpoint.pinned_benchmark if endpoint.pinned_benchmark_id else None
    if benchmark is not None:
        # A pinned calibration must describe this endpoint's own model on its own hardware, and be finished.
        if benchmark.status != "succeeded":
            errors.setdefault("pinned_benchmark", []).append("only a succeeded benchmark can be pinned")
        if (benchmark.model_profile_id, benchmark.hardware_profile_id) != (
            endpoint.model_profile_id,
            endpoint.hardware_profile_id,
        ):
            errors.setdefault("pinned_benchmark", []).append("the benchmark is for another model or hardware")
    if errors:
        raise ValidationError(errors)


def _quota_errors(endpoint: Endpoint) -> dict[str, list[str]]:
    """What the endpoint's owner's quota refuses in this create or change (tenants.quotas), against the stored row."""
    from tenants.quotas import Commitment, endpoint_quota_errors

    if endpoint.owner_tenant_id is None:
        return {}
    stored = (
        Endpoint.objects.filter(pk=endpoint.pk)
        .values(
            "owner_tenant_id", "min_replicas", "max_replicas", "warm_pool_size", "hardware_profile__gpus_per_replica"
        )
        .first()
        if endpoint.pk is not None
        else None
    )
    before = owner_before = None
    if stored is not None:
        owner_before = stored["owner_tenant_id"]
        before = Commitment(
            min_replicas=stored["min_replicas"],
            max_replicas=stored["max_replicas"],
            warm_pool=stored["warm_pool_size"],
            gpus_per_replica=max(1, stored["hardware_profile__gpus_per_replica"] or 1),
        )
    return endpoint_quota_errors(endpoint, before=before, owner_before=owner_before)


def _check_quota_locked(endpoint: Endpoint) -> None:
    """The quota check again under the owner's row lock, inside the write's transaction: two concurrent creates
    that each fit alone must not both take the last slot."""
    from tenants.quotas import lock_tenant

    lock_tenant(endpoint.owner_tenant_id)
    if errors := _quota_errors(endpoint):
        raise ValidationError(errors)


# Launch options the launchers read, with the type they need (other keys pass through to runtimes and actuators).
_LAUNCH_OPTION_KINDS = {
    **dict.fromkeys(("actuator", "deployment", "standby_deployment", "namespace", "profile", "cpuset", "dtype"), str),
    **dict.fromkeys(("faults", "profile_opts", "resources"), dict),
}


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def launch_option_errors(options: dict, *, runtime: str) -> list[str]:
    """What is wrong with known launch option values (``cpus: "abc"``, ``speed: -1``, a bad cpuset), so that a
    new version is refused up front instead of its replicas failing to start in the middle of a rollout."""
    import inspect
    import math

    from endpoints.runtimes import vllm
    from endpoints.runtimes.launch_env import launch_env
    from endpoints.runtimes.launch_options import allowlisted_value_errors, argv_value

    errors = [
        f"{key} must be {'a string' if kind is str else 'a JSON object'}"
        for key, kind in _LAUNCH_OPTION_KINDS.items()
        if options.get(key) is not None and not isinstance(options[key], kind)
    ]
    for key in ("deployment", "standby_deployment", "namespace"):
        # Kubernetes names as given, never silently rewritten: two rewritten names could address one Deployment.
        if isinstance(options.get(key), str) and not _DNS_LABEL.match(options[key]):
            errors.append(f"{key} must be a Kubernetes name: lower-case letters, digits and '-', at most 63")
    if "model" in options:
        errors.append("model is not a launch option: replicas serve the endpoint's model profile")
    for key in ("profile", "dtype", "cpuset"):
        if isinstance(options.get(key), str):
            try:
                argv_value(key, options[key])
            except ValueError as exc:
                errors.append(str(exc))
    for key in ("profile_opts", "faults"):
        if isinstance(options.get(key), dict):
            for name, value in options[key].items():
                try:
                    value = str(value).lower() if isinstance(value, bool) else value
                    argv_value(f"{key}.{name}", f"{name}={argv_value(f'{key}.{name}', value)}")
                except ValueError as exc:
                    errors.append(str(exc))
    extra = options.get("extra_args")
    if extra is not None and not (
        isinstance(extra, list) and all(isinstance(a, str) and a and "\x00" not in a for a in extra)
    ):
        errors.append("extra_args must be a list of non-empty strings")
    number = lambda v: isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)  # noqa: E731
    whole = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
    if options.get("speed") is not None and not (number(options["speed"]) and options["speed"] > 0):
        errors.append("speed must be a positive number")
    if options.get("port") is not None and not (whole(options["port"]) and 0 < options["port"] < 65536):
        errors.append("port must be a whole number between 1 and 65535")
    tp = options.get("tensor_parallel_size")
    if tp is not None and not (whole(tp) and tp >= 1):
        errors.append("tensor_parallel_size must be a positive whole number")
    if errors:
        return errors
    try:
        launch_env(options, runtime=runtime, affinity={0}, quota=1.0)  # cpus, cpu_allotment, resources, cpuset
        if runtime == "vllm":
            allowed = set(inspect.signature(vllm.serve_command).parameters) - {"model", "port", "host", "executable"}
            vllm.serve_command(model="check", port=8000, **{k: v for k, v in options.items() if k in allowed})
    except (TypeError, ValueError) as exc:
        errors.append(str(exc))
    # The allowlist's ranges hold for operators' values too (after the launchers' own words, which say more).
    return errors + [e for e in allowlisted_value_errors(options) if e not in errors]


def _refuse_operator_launch_options(actor, options, *, current: dict) -> None:
    """A tenant principal (user or API key) sets only the allowlisted launch options; operators and the platform
    itself (no actor) set any. The API serializer says the same first, with the same messages."""
    from endpoints.runtimes.launch_options import tenant_launch_option_errors
    from tenants.selectors import principal_is_operator

    if actor is None or isinstance(actor, str) or not isinstance(options, dict) or principal_is_operator(actor):
        return
    if errors := tenant_launch_option_errors(options, current=current):
        raise ValidationError({"launch_options": errors})


def _audit(*, actor, action: str, endpoint: Endpoint, detail: dict) -> None:
    from tenants.services import audit_log

    audit_log(actor=actor, action=action, obj=endpoint, tenant=endpoint.owner_tenant, detail=detail)


def endpoint_create(*, actor=None, **fields) -> Endpoint:
    """Create an endpoint; desired replicas start at the floor (min replicas) unless given."""
    unknown = set(fields) - ENDPOINT_EDITABLE_FIELDS - {"desired_replicas"}
    if unknown:
        raise ValidationError({name: ["not a settable endpoint field"] for name in sorted(unknown)})
    _refuse_operator_launch_options(actor, fields.get("launch_options"), current={})
    endpoint = Endpoint(**fields)
    if "desired_replicas" not in fields:
        endpoint.desired_replicas = endpoint.min_replicas
    _endpoint_validate(endpoint)
    _desired_within_bounds(endpoint, endpoint.desired_replicas)
    with transaction.atomic():
        _check_quota_locked(endpoint)
        try:
            with transaction.atomic():
                endpoint.save()
        except IntegrityError:  # the same name created meanwhile: the unique constraint is the last word
            raise ValidationError({"name": [NAME_TAKEN]}) from None
        _audit(actor=actor, action="endpoint.create", endpoint=endpoint, detail={"name": endpoint.name})
        from endpoints.rollouts.services import ensure_current_version

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
    from endpoints.models import VERSIONED_FIELDS
    from endpoints.rollouts.services import apply_versioned_changes

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
    _endpoint_validate(endpoint)
    diff = {name: [before[name], _plain(value)] for name, value in changes.items() if before[name] != _plain(value)}
    with transaction.atomic():
        _check_quota_locked(endpoint)
        # Only the live fields changed here: a full save would write back the versioned fields and current_version
        # as loaded, undoing a rollout's promotion that happened meanwhile.
        try:
            with transaction.atomic():
                endpoint.save(update_fields=sorted({*changes, "desired_replicas", "updated_at"}))
        except IntegrityError:
            raise ValidationError({"name": [NAME_TAKEN]}) from None
        if diff:
            _audit(actor=actor, action="endpoint.update", endpoint=endpoint, detail={"changes": diff})
    return endpoint


def endpoint_scale(*, endpoint: Endpoint, desired_replicas: int, actor=None, reason: str = "") -> Endpoint:
    """Set the desired replica count within [min, max]; the autoscaler's actuators converge replicas to it."""
    _desired_within_bounds(endpoint, desired_replicas)
    with transaction.atomic():
        locked = Endpoint.objects.select_for_update().get(pk=endpoint.pk)
        _desired_within_bounds(locked, desired_replicas)
        previous = locked.desired_replicas
        locked.desired_replicas = desired_replicas
        locked.save(update_fields=["desired_replicas", "updated_at"])
        _audit(
            actor=actor,
            action="endpoint.scale",
            endpoint=locked,
            detail={"from": previous, "to": desired_replicas, "reason": reason},
        )
    endpoint.desired_replicas, endpoint.updated_at = locked.desired_replicas, locked.updated_at
    return endpoint


def endpoint_delete(*, endpoint: Endpoint, actor=None) -> None:
    """Delete an endpoint that no longer runs replicas (scale it to zero first), with its reservations and SLOs."""
    active = endpoint.replicas.filter(state__in=ACTIVE_REPLICA_STATES).count()
    if active:
        raise ValidationError(
            {"replicas": [f"{active} replica(s) still active; scale to 0 (min_replicas 0) and let them stop first"]}
        )
    from endpoints.models import ROLLOUT_ACTIVE_STATES

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


def replica_attach(
    *,
    endpoint: Endpoint,
    url: str,
    name: str = "",
    concurrency_limit: int | None = None,
    served_model_name: str = "",
    actor=None,
    check_server=None,
) -> Replica:
    """Register a vLLM server that runs elsewhere as a replica of ``endpoint`` (operators only, by the API and the
    console); it turns ready only once it has shown to be one: ``GET /health`` 200 with an empty or JSON body,
    ``GET /v1/models`` listing the model name it serves and ``vllm:`` series at ``GET /metrics``
    (``endpoints.runtimes.vllm.server_problems``). Anything else is a field error on ``url`` and no row. The served
    name is ``served_model_name`` when the operator gives one (a server started with its own
    ``--served-model-name``), else the endpoint's; it is recorded on the row, and the proxy sends it as ``model``
    and writes the endpoint's name back into the answers. It is a ``static`` replica: counted as capacity, never
    started or stopped by an actuator. ``check_server``: the check, replaceable in tests."""
    from endpoints.runtimes import vllm
    from tenants.services import audit_log

    url = (url or "").strip().rstrip("/")
    if problem := vllm.base_url_problem(url) or (len(url) > 255 and "must be at most 255 characters"):
        raise ValidationError({"url": [problem]})
    name = (name or "").strip() or _attached_name(url)
    if not ATTACHED_NAME.match(name):
        raise ValidationError({"name": ["letters, digits, '.', '_' or '-', starting with a letter or digit"]})
    named = (served_model_name or "").strip()
    served_model_name = named or endpoint.name
    if len(served_model_name) > 255 or any(ord(c) < 32 for c in served_model_name):
        raise ValidationError({"served_model_name": ["at most 255 characters, no control characters"]})
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
                    actuator="static",
                    concurrency_limit=concurrency_limit or endpoint.concurrency_limit,
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
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host = re.sub(r"[^A-Za-z0-9.-]+", "-", parts.hostname or "host").strip("-.") or "host"
    return f"attached-{host}-{parts.port or (443 if parts.scheme == 'https' else 80)}"[:120]
