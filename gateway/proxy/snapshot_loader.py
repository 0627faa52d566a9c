"""Reads the proxy's config snapshot (``snapshot.Snapshot``) from the database in a fixed number of queries,
whatever the number of keys, endpoints and replicas; the key table is read by ``snapshot_keys``, or carried over.
Synchronous: the proxy calls it from a worker thread."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from types import SimpleNamespace

from django.conf import settings
from django.db.models import F
from django.db.models.functions import Coalesce

from capacity.runtimes.lora_artifacts import artifact_fingerprint, engine_name, owner_root
from capacity.unit_resolver import coefficients_by_endpoint, hardware_speeds
from endpoints.models import Adapter, Endpoint, EndpointVersion, Replica, ReplicaState
from endpoints.rollouts.selectors import traffic_weights_by_endpoint
from gateway.proxy.snapshot import (
    AdapterInfo,
    EndpointInfo,
    KeyCursor,
    KeyInfo,
    ReplicaInfo,
    ReservationInfo,
    Snapshot,
    takes_priority,
)
from gateway.proxy.snapshot_keys import read_keys
from tenants.models import CapacityReservation

log = logging.getLogger(__name__)


def read_snapshot(
    version: str = "",
    *,
    keys: tuple[Mapping[str, KeyInfo], KeyCursor] | None = None,
    config_stamp: str = "",
    all_stamp: str = "",
) -> Snapshot:
    """Everything read from the database; ``keys``: a key table (and its cursor) to use instead of reading every
    key again (``snapshot_refresh``). The stamps are the Redis ones this read answers
    (``endpoints.config_version``)."""
    keys_by_hash, cursor = keys if keys is not None else read_keys()
    by_name = _endpoints(list(Endpoint.objects.select_related("model_profile")))
    reservations, adapter_reservations = _reservations()
    now = time.time()
    return Snapshot(
        version=version,
        loaded_at=now,
        keys_by_hash=keys_by_hash,
        endpoints_by_name=by_name,
        reservations=reservations,
        adapters_by_name=_adapters(by_name),
        adapter_reservations=adapter_reservations,
        keys_cursor=cursor,
        config_stamp=config_stamp,
        all_stamp=all_stamp,
        config_loaded_at=now,
    )


def _endpoints(endpoints: list[Endpoint]) -> dict[str, EndpointInfo]:
    coeffs = coefficients_by_endpoint(endpoints)
    prefill = _prefill_coefficients(endpoints)
    replicas = _ready_replicas(endpoints)
    weights = traffic_weights_by_endpoint()
    names = {e.pk: e.name for e in endpoints}
    return {
        e.name: EndpointInfo(
            id=e.pk,
            name=e.name,
            owner_tenant_id=e.owner_tenant_id,
            coeffs=coeffs[e.pk],
            routing_policy=e.routing_policy,
            scale_to_zero=e.scale_to_zero,
            concurrency_limit=e.concurrency_limit,
            ttft_slo_ms=e.ttft_slo_ms,
            tpot_slo_ms=e.tpot_slo_ms,
            max_model_len=e.model_profile.max_model_len,
            created=int(e.created_at.timestamp()),
            model=e.model_profile.name,
            replicas=tuple(replicas.get(e.pk, ())),
            version_weights=weights.get(e.pk, ()),
            fallback_name=names.get(e.fallback_id),
            fallback_classes=frozenset(e.fallback_classes or ()),
            degrade_max_tokens=e.degrade_max_tokens,
            degrade_slot_share=e.degrade_slot_share,
            max_loras=e.lora[0],
            routing_plan=json.dumps(e.routing_plan, sort_keys=True) if e.routing_plan else "",
            serving_mode=e.serving_mode,
            kv_connector=e.kv_connector,
            pd_min_uncached_tokens=e.pd_min_uncached_tokens,
            prefill_coeffs=prefill.get(e.pk),
        )
        for e in endpoints
    }


def _prefill_coefficients(endpoints: list[Endpoint]) -> dict:
    """The prefill pool's MU coefficients of each disaggregated endpoint: its pinned prefill benchmark, else the
    latest benchmark of its model on the prefill pool's hardware (the endpoint's when it names none), else the model
    profile's defaults (``unit_resolver.coefficients_by_endpoint``'s order, on the prefill pool's pair). No query
    when no endpoint is disaggregated."""
    pools = [
        SimpleNamespace(
            pk=e.pk,
            model_profile_id=e.model_profile_id,
            hardware_profile_id=e.prefill_hardware_profile_id or e.hardware_profile_id,
            pinned_benchmark_id=e.prefill_pinned_benchmark_id,
        )
        for e in endpoints
        if e.serving_mode == "disaggregated"
    ]
    return coefficients_by_endpoint(pools) if pools else {}


def _ready_replicas(endpoints: list[Endpoint]) -> dict[int, list[ReplicaInfo]]:
    """Ready, serving replicas with a URL, per endpoint id; whether each takes ``priority`` follows the launch
    options of the version it runs (a hand-registered replica: the endpoint's current version); the model name
    each serves is its own, else the endpoint's (what the actuators launch it with); a replica on other hardware
    than its endpoint's carries its speed against the endpoint's (two more queries for all of them)."""
    current_version = {e.pk: e.current_version_id for e in endpoints}
    endpoint_name = {e.pk: e.name for e in endpoints}
    priority_by_endpoint = {e.pk: takes_priority(e.launch_options) for e in endpoints}
    # A prefill replica runs its pool's launch options (``Endpoint.prefill_launch_options``), not its version's.
    prefill_priority = {e.pk: takes_priority(e.prefill_launch_options) for e in endpoints}
    priority_by_version = {
        pk: takes_priority(options) for pk, options in EndpointVersion.objects.values_list("pk", "launch_options")
    }
    replicas: dict[int, list[ReplicaInfo]] = {}
    ready = Replica.objects.filter(state=ReplicaState.READY, is_standby=False).exclude(url="")
    # The hardware profile each runs on: its own (a spot pool's), else its version's, else the endpoint's.
    ready = ready.annotate(
        profile_name=Coalesce(
            F("hardware_profile__name"), F("version__hardware_profile__name"), F("endpoint__hardware_profile__name")
        ),
        profile_id=Coalesce(
            F("hardware_profile_id"), F("version__hardware_profile_id"), F("endpoint__hardware_profile_id")
        ),
    )
    ready = list(ready.order_by("id"))
    # A replica on other hardware than its endpoint's (a mixed fleet, a spot pool) weighs load by its own speed.
    endpoint_hardware = {e.pk: (e.model_profile_id, e.hardware_profile_id, e.pinned_benchmark_id) for e in endpoints}
    triples = set()
    for r in ready:
        model, hardware, pin = endpoint_hardware.get(r.endpoint_id, (None, None, None))
        if model is not None and r.profile_id != hardware:
            triples.add((model, hardware, r.profile_id, pin))
    speeds = hardware_speeds(triples) if triples else {}
    for r in ready:
        version_id = r.version_id or current_version.get(r.endpoint_id)
        model, hardware, pin = endpoint_hardware.get(r.endpoint_id, (None, None, None))
        replicas.setdefault(r.endpoint_id, []).append(
            ReplicaInfo(
                id=r.pk,
                name=r.name,
                url=r.url.rstrip("/"),
                concurrency_limit=r.concurrency_limit,
                version_id=version_id,
                takes_priority=prefill_priority.get(r.endpoint_id, True)
                if r.role == "prefill"
                else priority_by_version.get(version_id, priority_by_endpoint.get(r.endpoint_id, True)),
                served_model_name=r.served_model_name or endpoint_name.get(r.endpoint_id, ""),
                kv_events_endpoint=r.kv_events_endpoint,
                hardware_profile=r.profile_name or "",
                speed=speeds.get((model, hardware, r.profile_id, pin), 1.0),
                role=r.role,
            )
        )
    return replicas


def _reservations() -> tuple[dict[tuple[int, int], ReservationInfo], dict[tuple[int, int, str], ReservationInfo]]:
    """Base-model reservations by (tenant, endpoint), and adapter reservations by (tenant, endpoint, adapter name),
    the name a request calls it by; one query."""
    base, by_adapter = {}, {}
    for r in CapacityReservation.objects.select_related("adapter"):
        info = ReservationInfo(
            mu_per_min=r.mu_per_min,
            burst_minutes=r.burst_minutes,
            priority=r.priority,
            rpm_limit=r.rpm_limit,
            tpm_limit=r.tpm_limit,
            adapter_id=r.adapter_id,
        )
        if r.adapter_id is None:
            base[(r.tenant_id, r.endpoint_id)] = info
        else:
            by_adapter[(r.tenant_id, r.endpoint_id, r.adapter.name)] = info
    return base, by_adapter


def lora_mu_factor(endpoint: EndpointInfo | None) -> float:
    """What an adapter request costs over a base one on ``endpoint``: 1 + the overhead its benchmark fitted
    (``CapacityBenchmark.lora_overhead``), else 1 + ``INFERCAP["LORA_MU_OVERHEAD"]``; never below 1."""
    fitted = endpoint.coeffs.lora_overhead if endpoint is not None else None
    overhead = fitted if fitted is not None else float(settings.INFERCAP.get("LORA_MU_OVERHEAD", 0.0))
    return 1.0 + max(0.0, overhead)


def _adapters(endpoints_by_name: dict[str, EndpointInfo]) -> dict[str, AdapterInfo]:
    """Every adapter with its artifact's absolute path under its owner's root (``lora_artifacts.owner_root``),
    resolved again here: one whose path a symlink made to leave that root since its registration is left out (its
    requests are a 404), as registration would refuse it. Its engine name carries a fingerprint of the files now, so
    an artifact rewritten in place is loaded afresh (docs/lora-serving.md)."""
    knobs = settings.INFERCAP
    root = os.path.realpath(knobs.get("LORA_ROOT") or "var/lora")
    adapters = {}
    for a in Adapter.objects.select_related("endpoint"):
        base = os.path.realpath(owner_root(root, a.owner_tenant_id))
        path = os.path.realpath(os.path.join(base, a.artifact_path))
        if not path.startswith(base + os.sep):
            log.warning("adapter %s: %s resolves outside its owner's LoRA root; not served", a.name, a.artifact_path)
            continue
        fingerprint = artifact_fingerprint(path)
        adapters[a.name] = AdapterInfo(
            name=a.name,
            owner_tenant_id=a.owner_tenant_id,
            endpoint_name=a.endpoint.name,
            rank=a.rank,
            path=path,
            created=int(a.created_at.timestamp()),
            root=base,
            mu_factor=lora_mu_factor(endpoints_by_name.get(a.endpoint.name)),
            request_rate=a.request_rate,
            engine_name=engine_name(adapter_id=a.pk, owner_tenant_id=a.owner_tenant_id, fingerprint=fingerprint),
        )
    return adapters
