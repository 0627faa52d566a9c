"""Validation of an endpoint's fields, launch options and quota, shared by the endpoint and rollout services.

All of it raises or returns field errors (``ValidationError`` with a message per field), never a database error.
"""

import inspect
import json
import math
import re

from django.core.exceptions import ValidationError

from capacity.autoscaling import actuators
from capacity.runtimes import vllm
from capacity.runtimes.launch_env import launch_env
from capacity.runtimes.launch_options import allowlisted_value_errors, argv_value
from endpoints.models import Adapter, Endpoint, RoutingPolicy
from gateway.admission.brownout import MAX_FALLBACK_DEPTH, fallback_chain_error
from gateway.admission.classes import CLASSES
from gateway.routing import cost_aware
from placement.node_requirements import endpoint_requirements
from tenants.quotas import Commitment, endpoint_quota_errors

# Endpoint names are one namespace (the proxy resolves the OpenAI ``model`` by name alone), so a taken name must be
# refused; the message neither says whose it is nor that it is an endpoint (Django's "Endpoint with this Name
# already exists"), the same for a tenant's own endpoint, another tenant's and a shared one.
NAME_TAKEN = "is not available: choose another name"


def endpoint_validate(endpoint: Endpoint, *, check_launch_values: bool | None = None) -> None:
    """Field validators, uniqueness and the cross-field bounds of Endpoint.clean, all as one ValidationError.

    ``check_launch_values``: also refuse launch option values the launchers cannot use (default: for a new
    endpoint; a new version asks for it, a live change leaves the stored options alone)."""
    errors: dict[str, list[str]] = {}
    try:
        endpoint.full_clean(validate_unique=False)
    except ValidationError as exc:
        errors.update(exc.message_dict)
    # Adapters share the namespace: both are what a request names as its ``model`` (docs/lora-serving.md).
    if endpoint.name and (
        Endpoint.objects.filter(name=endpoint.name).exclude(pk=endpoint.pk).exists()
        or Adapter.objects.filter(name=endpoint.name).exists()
    ):
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
        try:
            actuators.get_actuator(endpoint)
        except actuators.ActuatorError as exc:
            errors.setdefault("launch_options", []).append(str(exc))
    for field, messages in quota_errors(endpoint).items():
        errors.setdefault(field, []).extend(messages)
    for field, messages in fallback_errors(endpoint).items():
        errors.setdefault(field, []).extend(messages)
    for field, messages in routing_plan_errors(endpoint).items():
        errors.setdefault(field, []).extend(messages)
    for field, messages in spot_pool_errors(endpoint).items():
        errors.setdefault(field, []).extend(messages)
    for field, messages in prefill_placement_errors(endpoint).items():
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


def routing_plan_errors(endpoint: Endpoint) -> dict[str, list[str]]:
    """The cost_aware policy routes by a plan: it must be the planner's shape and price the endpoint's profile."""
    plan = endpoint.routing_plan
    if endpoint.routing_policy != RoutingPolicy.COST_AWARE and not plan:
        return {}
    if len(json.dumps(plan, default=str)) > 64 * 1024:
        return {"routing_plan": ["is larger than 64 KiB; a plan has a few buckets and types"]}
    if endpoint.routing_policy == RoutingPolicy.COST_AWARE and not plan:
        return {
            "routing_plan": ["the cost_aware policy needs a plan: the routing_plan of POST /api/v1/capacity/plan-mix"]
        }
    try:
        figures = cost_aware.plan_figures(plan)["figures"]
    except cost_aware.PlanInvalid as exc:
        return {"routing_plan": [str(exc)]}
    if endpoint.hardware_profile_id and endpoint.hardware_profile.name not in figures:
        return {
            "routing_plan": [f"has no figures for the endpoint's hardware profile {endpoint.hardware_profile.name}"]
        }
    return {}


def spot_pool_errors(endpoint: Endpoint) -> dict[str, list[str]]:
    """A spot pool must be spot capacity of the GPU type the endpoint runs on (its MU calibration holds there)."""
    if endpoint.spot_hardware_profile_id is None:
        return {}
    spot, base = endpoint.spot_hardware_profile, endpoint.hardware_profile
    problems = []
    if spot.capacity_type != spot.CapacityType.SPOT:
        problems.append(f"{spot.name} is {spot.get_capacity_type_display().lower()} capacity, not spot")
    if base is not None and spot.gpu_type != base.gpu_type:
        problems.append(f"{spot.name} has {spot.gpu_type} GPUs; the endpoint runs on {base.gpu_type}")
    if spot.usd_per_gpu_hour is None:
        problems.append(f"{spot.name} has no price per GPU-hour")
    return {"spot_hardware_profile": problems} if problems else {}


def quota_errors(endpoint: Endpoint) -> dict[str, list[str]]:
    """What the endpoint's owner's quota refuses in this create or change (tenants.quotas), against the stored row."""
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


# Launch options the launchers read, with the type they need (other keys pass through to runtimes and actuators).
_LAUNCH_OPTION_KINDS = {
    **dict.fromkeys(("actuator", "deployment", "standby_deployment", "namespace", "profile", "cpuset", "dtype"), str),
    **dict.fromkeys(("faults", "profile_opts", "resources"), dict),
}


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def launch_option_errors(options: dict, *, runtime: str) -> list[str]:
    """What is wrong with known launch option values (``cpus: "abc"``, ``speed: -1``, a bad cpuset), so that a
    new version is refused up front instead of its replicas failing to start in the middle of a rollout."""
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
    errors += placement_option_errors(options)
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


# The launch options that say where an endpoint's pods land (placement.node_requirements).
PLACEMENT_OPTIONS = ("node_selector", "tolerations", "spot_node_selector", "spot_tolerations")


def placement_option_errors(options: dict) -> list[str]:
    """What the Kubernetes actuator would refuse at scale-up in the node selectors and tolerations, each option on
    its own: the check is the launch's own (``endpoint_requirements``), as for a spot pod, which reads all four."""
    errors = []
    for key in PLACEMENT_OPTIONS:
        if key in options:
            try:
                endpoint_requirements({key: options[key]}, None, spot=True)
            except ValueError as exc:
                errors.append(str(exc))
    return errors


def prefill_placement_errors(endpoint: Endpoint) -> dict[str, list[str]]:
    """The prefill pool's launch options are its pods' (docs/disaggregation.md): their placement options are held
    to the same check, when the endpoint is new or they change (a live edit of another field leaves them alone)."""
    options = endpoint.prefill_launch_options
    if not isinstance(options, dict):
        return {"prefill_launch_options": ["must be a JSON object"]}
    if not any(key in options for key in PLACEMENT_OPTIONS):
        return {}
    if not endpoint._state.adding and endpoint.pk is not None:
        stored = Endpoint.objects.filter(pk=endpoint.pk).values_list("prefill_launch_options", flat=True).first()
        if stored == options:
            return {}
    errors = placement_option_errors(options)
    return {"prefill_launch_options": errors} if errors else {}


def fallback_errors(endpoint: Endpoint) -> dict[str, list[str]]:
    """The fallback rules, checked when an endpoint is written: the classes are known ones; the fallback is
    another endpoint that every tenant who can call this one may also call (a shared one, or one of the same
    owner's); and the chain it starts has no loop and at most ``MAX_FALLBACK_DEPTH`` steps. The proxy guards
    the same at request time (``gateway.proxy.fallback``)."""
    errors: dict[str, list[str]] = {}
    classes = endpoint.fallback_classes
    if not isinstance(classes, list) or any(c not in CLASSES for c in classes) or len(set(classes)) != len(classes):
        errors["fallback_classes"] = [f"must be a list of distinct priority classes among {', '.join(CLASSES)}"]
    if endpoint.fallback_id is None:
        return errors
    if endpoint.pk is not None and endpoint.fallback_id == endpoint.pk:
        errors["fallback"] = ["an endpoint cannot be its own fallback"]
        return errors
    fallback = endpoint.fallback
    if fallback.owner_tenant_id is not None and fallback.owner_tenant_id != endpoint.owner_tenant_id:
        errors["fallback"] = ["the fallback must be a shared endpoint or one of the same owner's"]
        return errors
    next_of = dict(Endpoint.objects.exclude(fallback=None).values_list("pk", "fallback_id"))
    start = endpoint.pk if endpoint.pk is not None else -1
    next_of[start] = endpoint.fallback_id
    # From every endpoint, not just this one: one whose chain runs through this endpoint grows longer too.
    problems = {fallback_chain_error(s, next_of, max_depth=MAX_FALLBACK_DEPTH) for s in next_of} - {None}
    problem = "loop" if "loop" in problems else next(iter(problems), None)
    if problem == "loop":
        errors["fallback"] = ["this fallback leads back to the endpoint (a loop)"]
    elif problem == "depth":
        errors["fallback"] = [f"the chain of fallbacks would be longer than {MAX_FALLBACK_DEPTH}"]
    return errors
