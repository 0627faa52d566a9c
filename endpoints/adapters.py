"""Writes for LoRA adapters: register, rename, delete, each audited, each validated against the base endpoint and
the operators' storage root (docs/lora-serving.md). The API, the admin and the console call these."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Count
from django.utils import timezone

from billing.models import UsageRecord
from capacity.runtimes.lora_artifacts import ArtifactError, inspect_artifact, owner_root, same_base_model
from capacity.runtimes.vllm import model_argument
from endpoints.config_version import bump_config_version
from endpoints.models import Adapter, Endpoint
from endpoints.validation import NAME_TAKEN
from tenants.selectors import principal_is_operator, principal_tenant_id
from tenants.services import audit_log

ADAPTER_CREATE_FIELDS = frozenset({"name", "owner_tenant", "endpoint", "rank", "artifact_path"})
# The artifact and its base endpoint are fixed: another artifact is another adapter (replicas hold each artifact
# version under its own engine name, docs/lora-serving.md). A new owner re-reads the artifact in the new owner's root.
ADAPTER_UPDATE_FIELDS = frozenset({"name", "owner_tenant"})
# Every artifact refusal a tenant gets, whatever the reason (missing, no config or weights, another base model, a
# symlink out): the reasons would tell it what lies where on the store. Operators get the reason.
ARTIFACT_REFUSED = "no usable LoRA adapter at this path in your tenant's adapter storage"


def lora_root() -> Path:
    return Path(settings.INFERCAP.get("LORA_ROOT") or Path(settings.BASE_DIR) / "var" / "lora")


def _endpoint_model_path(endpoint: Endpoint) -> str | None:
    models_dir = settings.INFERCAP.get("VLLM_MODELS_DIR")
    path = model_argument(endpoint.model_profile.name, models_dir=Path(models_dir) if models_dir else None)
    return path if Path(path).is_absolute() else None


def _ownership_errors(adapter: Adapter, actor) -> dict[str, list[str]]:
    """A tenant registers private adapters only, on endpoints it may call; a shared adapter lies on a shared
    endpoint (else it would open a tenant's private endpoint to everyone)."""
    errors: dict[str, list[str]] = {}
    endpoint = adapter.endpoint
    if _is_tenant(actor):
        if adapter.owner_tenant_id is None:
            errors["owner_tenant"] = ["only operators publish shared adapters"]
        elif adapter.owner_tenant_id != principal_tenant_id(actor):
            errors["owner_tenant"] = ["an adapter belongs to your own tenant"]
    if endpoint.owner_tenant_id is not None and adapter.owner_tenant_id != endpoint.owner_tenant_id:
        errors.setdefault("endpoint", []).append(
            "a private endpoint serves only its owner's adapters"
            if adapter.owner_tenant_id is not None
            else "a shared adapter must lie on a shared endpoint"
        )
    return errors


def _is_tenant(actor) -> bool:
    return actor is not None and not isinstance(actor, str) and not principal_is_operator(actor)


def adapter_artifact_root(adapter: Adapter) -> Path:
    """The directory the adapter's ``artifact_path`` is relative to: its owner's part of the LoRA root."""
    return owner_root(lora_root(), adapter.owner_tenant_id)


def _artifact_errors(adapter: Adapter, actor=None) -> dict[str, list[str]]:
    """The artifact under its owner's root, its rank against the endpoint's maximum, its base model against the
    endpoint's. A tenant reads one message for every artifact refusal (``ARTIFACT_REFUSED``)."""
    errors = _artifact_checks(adapter)
    if _is_tenant(actor) and "artifact_path" in errors:
        errors["artifact_path"] = [ARTIFACT_REFUSED]
    return errors


def _artifact_checks(adapter: Adapter) -> dict[str, list[str]]:
    endpoint = adapter.endpoint
    slots, max_rank = endpoint.lora
    errors: dict[str, list[str]] = {}
    if slots == 0:
        errors["endpoint"] = [f"`{endpoint.name}` serves no LoRA adapters (set its launch option max_loras)"]
    try:
        artifact = inspect_artifact(adapter.artifact_path, root=adapter_artifact_root(adapter))
    except ArtifactError as exc:
        errors["artifact_path"] = [str(exc)]
        return errors
    if adapter.rank is None:
        adapter.rank = artifact.rank
    if adapter.rank is None:
        errors["rank"] = ["adapter_config.json names no rank r: give it"]
    elif artifact.rank is not None and adapter.rank != artifact.rank:
        errors["rank"] = [f"adapter_config.json says r={artifact.rank}, not {adapter.rank}"]
    elif slots and adapter.rank > max_rank:
        errors["rank"] = [f"rank {adapter.rank} exceeds `{endpoint.name}`'s max_lora_rank {max_rank}"]
    adapter.base_model = artifact.base_model[:255]
    model = endpoint.model_profile.name
    if not same_base_model(artifact.base_model, model, endpoint_model_path=_endpoint_model_path(endpoint)):
        found = artifact.base_model or "no base_model_name_or_path"
        errors["artifact_path"] = [f"the adapter was trained on {found!r}, not `{endpoint.name}`'s model {model!r}"]
    return errors


def adapter_validate(adapter: Adapter, *, actor=None, check_artifact: bool = True) -> None:
    """Field validators, the name (unique among adapters and endpoints: both are a request's ``model``), who may
    own it on which endpoint, and its artifact; all problems as one ValidationError of field errors."""
    errors: dict[str, list[str]] = {}
    try:
        adapter.full_clean(validate_unique=False, exclude=["rank", "base_model"])
    except ValidationError as exc:
        errors.update(exc.message_dict)
    if adapter.rank is not None and adapter.rank < 1:
        errors["rank"] = ["must be at least 1"]
    name_taken = Adapter.objects.filter(name=adapter.name).exclude(pk=adapter.pk).exists()
    if adapter.name and (name_taken or Endpoint.objects.filter(name=adapter.name).exists()):
        errors.setdefault("name", []).append(NAME_TAKEN)
    if adapter.endpoint_id is not None and "endpoint" not in errors:
        for field, messages in _ownership_errors(adapter, actor).items():
            errors.setdefault(field, []).extend(messages)
        if check_artifact and not errors.get("artifact_path"):
            for field, messages in _artifact_errors(adapter, actor).items():
                errors.setdefault(field, []).extend(messages)
    if errors:
        raise ValidationError(errors)


def _audit(*, actor, action: str, adapter: Adapter, detail: dict) -> None:
    audit_log(actor=actor, action=action, obj=adapter, tenant=adapter.owner_tenant, detail=detail)


def adapter_create(*, actor=None, **fields) -> Adapter:
    unknown = set(fields) - ADAPTER_CREATE_FIELDS
    if unknown:
        raise ValidationError({name: ["not a settable adapter field"] for name in sorted(unknown)})
    adapter = Adapter(**fields)
    adapter_validate(adapter, actor=actor)
    with transaction.atomic():
        try:
            with transaction.atomic():
                adapter.save()
        except IntegrityError:  # the same name registered meanwhile
            raise ValidationError({"name": [NAME_TAKEN]}) from None
        detail = {"name": adapter.name, "endpoint": adapter.endpoint.name, "rank": adapter.rank}
        _audit(actor=actor, action="adapter.create", adapter=adapter, detail=detail | {"path": adapter.artifact_path})
    return adapter


def adapter_update(*, adapter: Adapter, actor=None, **changes) -> Adapter:
    # A full update (PUT) resends the fixed fields: unchanged, they are no change.
    changes = {k: v for k, v in changes.items() if k in ADAPTER_UPDATE_FIELDS or getattr(adapter, k, None) != v}
    unknown = set(changes) - ADAPTER_UPDATE_FIELDS
    if unknown:
        message = "cannot change: register a new adapter for another artifact, rank or endpoint"
        raise ValidationError({name: [message] for name in sorted(unknown)})
    before = {name: str(getattr(adapter, name)) for name in changes}
    for name, value in changes.items():
        setattr(adapter, name, value)
    if "owner_tenant" in changes:
        _check_reservations_stay_valid(adapter)  # first: whatever its files, such a move is refused
    adapter_validate(adapter, actor=actor, check_artifact="owner_tenant" in changes)
    with transaction.atomic():
        try:
            with transaction.atomic():
                adapter.save(update_fields=sorted({*changes, "updated_at"}))
        except IntegrityError:
            raise ValidationError({"name": [NAME_TAKEN]}) from None
        diff = {n: [before[n], str(getattr(adapter, n))] for n in changes if before[n] != str(getattr(adapter, n))}
        if diff:
            _audit(actor=actor, action="adapter.update", adapter=adapter, detail={"changes": diff})
    return adapter


def _check_reservations_stay_valid(adapter: Adapter) -> None:
    """A new owner must not strand another tenant's reservation on the adapter (tenants.CapacityReservation: only its
    owner, or anyone for a shared adapter, may hold one)."""
    if adapter.owner_tenant_id is None:
        return  # shared: any tenant may hold one
    if adapter.reservations.exclude(tenant_id=adapter.owner_tenant_id).exists():
        raise ValidationError(
            {"owner_tenant": ["other tenants hold reservations on this adapter; delete those first"]}
        )


def adapter_delete(*, adapter: Adapter, actor=None) -> None:
    with transaction.atomic():
        _audit(actor=actor, action="adapter.delete", adapter=adapter, detail={"name": adapter.name})
        adapter.delete()


ADAPTER_RATE_WINDOW_S = 86_400.0
ADAPTER_RATE_CHANGE = 0.1  # a relative change below this is not worth a config reload of every proxy


def adapter_rates_refresh(*, now: datetime | None = None, window_s: float = ADAPTER_RATE_WINDOW_S) -> int:
    """Each adapter's request rate over the last ``window_s`` from the usage records (``Adapter.request_rate``),
    which the proxies' infercap router counts in its popularity (docs/lora.md#routing). Proxies reload their
    snapshot when a rate moved by at least ``ADAPTER_RATE_CHANGE``; returns how many adapters changed."""
    now = now or timezone.now()
    counts = dict(
        UsageRecord.objects.filter(finished_at__gt=now - timedelta(seconds=window_s), finished_at__lte=now)
        .exclude(adapter="")
        .values_list("adapter")
        .annotate(n=Count("id"))
    )
    changed = []
    for adapter in Adapter.objects.only("pk", "name", "request_rate"):
        rate = counts.get(adapter.name, 0) / window_s
        if abs(rate - adapter.request_rate) > ADAPTER_RATE_CHANGE * max(rate, adapter.request_rate):
            adapter.request_rate = rate
            changed.append(adapter)
    if changed:
        with transaction.atomic():
            # bulk_update sends no post_save (a save per adapter would bump the proxies' version once each).
            Adapter.objects.bulk_update(changed, ["request_rate"], batch_size=500)
            transaction.on_commit(bump_config_version)
    return len(changed)
