"""In-process config snapshot: keys, endpoints, replicas, reservations and MU coefficients.

The hot path reads only this object, never the database. A new one replaces it (built in a worker thread by
``snapshot_refresh``) when the version stamps in Redis change; ``gateway.proxy.signals`` bumps them when an admin
edits any of these models. A key change carries the key table over with only the changed keys read again.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from capacity.units import MUCoefficients


@dataclass(frozen=True)
class KeyInfo:
    id: int
    prefix: str
    tenant_id: int
    tenant_slug: str
    scopes: frozenset
    max_priority: str
    expires_at: float | None  # unix seconds
    accepts_fallback: bool = False  # its tenant's opt-in (``Tenant.accepts_fallback``)
    # Per-key controls (docs/security.md, "Per-key controls"): limits over every endpoint the key calls, on top of
    # the tenant's reservation; the model names it may call (empty: all its tenant may); a dollar budget per period.
    rpm_limit: int | None = None
    tpm_limit: int | None = None
    mu_per_min_limit: float | None = None
    allowed_models: frozenset = frozenset()
    budget_usd: float | None = None
    budget_period: str = "month"
    # The tenant's monthly budget when it stops requests (``Tenant.budget_hard_stop``); None: no hard stop.
    tenant_budget_usd: float | None = None
    # This key's term of the table's checksum (``snapshot_keys.checksum_term``: its id and the change stamps of its
    # row and its tenant's), so the proxy keeps the checksum as keys come and go.
    stamp: int = 0

    def usable(self, now: float) -> bool:
        return self.expires_at is None or self.expires_at > now

    def may_call(self, model: str) -> bool:
        return not self.allowed_models or model in self.allowed_models


@dataclass(frozen=True)
class ReservationInfo:
    mu_per_min: float
    burst_minutes: float
    priority: str
    rpm_limit: int | None
    tpm_limit: int | None
    # A LoRA adapter's reservation (docs/lora.md): its buckets are its own, apart from the base-model reservation's.
    adapter_id: int | None = None


@dataclass(frozen=True)
class ReplicaInfo:
    id: int
    name: str
    url: str
    concurrency_limit: int
    version_id: int | None = None  # the endpoint version it runs (hand-registered: the current one)
    # Launched with --scheduling-policy priority (the platform's default), so the proxy sends the admitted class's
    # engine priority; an fcfs replica refuses the field (400), so it gets none (``request.upstream_payload``).
    takes_priority: bool = True
    # The model name its engine serves (``Replica.served_model_name``); empty: the endpoint's name. The proxy sends
    # this name as ``model`` and writes the endpoint's back into what the client sees (``runtime.Slot``).
    served_model_name: str = ""
    # Where its engine publishes KV-cache events (``Replica.kv_events_endpoint``); the proxy subscribes to it
    # (``gateway.proxy.kv_feeds``). Empty: no events, the router's approximate index answers for it.
    kv_events_endpoint: str = ""
    # The hardware profile it runs on (its own, a spot pool's; else its version's): the cost_aware router's type.
    hardware_profile: str = ""
    # How fast it serves the endpoint's model against a replica on the endpoint's own hardware profile
    # (``capacity.unit_resolver.hardware_speeds``): its MU capacity is the endpoint's times this.
    speed: float = 1.0
    # Its pool (``Replica.role``): "mixed" on an aggregated endpoint; "prefill" or "decode" on a disaggregated one,
    # where the runtime admits over the decode replicas and picks a prefill replica apart (docs/request-path.md).
    role: str = "mixed"


@dataclass(frozen=True)
class EndpointInfo:
    id: int
    name: str
    owner_tenant_id: int | None
    coeffs: MUCoefficients
    routing_policy: str
    scale_to_zero: bool
    concurrency_limit: int
    ttft_slo_ms: int
    tpot_slo_ms: int
    max_model_len: int
    created: int
    # The model the replicas load (the model profile's name: a model id or a path); /v1/models shows it as ``root``
    # as vLLM does, and vLLM's own benchmark client loads its tokenizer from it.
    model: str = ""
    replicas: tuple[ReplicaInfo, ...] = ()
    # During a rollout: (version id, percent of requests) for each version that takes traffic; empty otherwise
    # (every ready replica is routed). Replicas of a version not listed here get no traffic.
    version_weights: tuple[tuple[int, int], ...] = ()
    # Graceful degradation (``gateway.proxy.brownout``): the fallback endpoint's name and the classes it serves,
    # and the max_tokens that degraded requests are capped at (None: none are served shorter).
    fallback_name: str | None = None
    fallback_classes: frozenset = frozenset()
    degrade_max_tokens: int | None = None
    # Under overload, the share of each replica's slots the degraded classes may hold together (None: no limit).
    degrade_slot_share: float | None = None
    # LoRA adapter slots per replica (launch option max_loras; 0: no adapters are served here; docs/lora-serving.md).
    max_loras: int = 0
    # The cost_aware policy's plan (``Endpoint.routing_plan``), as JSON text: the runtime builds its router from it.
    routing_plan: str = ""
    # Prefill/decode disaggregation (docs/request-path.md, "Prefill/decode disaggregation"): "aggregated" or
    # "disaggregated"; how KV moves ("shared_storage" or "nixl"); the uncached prompt tokens below which a request
    # skips the prefill pool; the prefill pool's coefficients (its uncached prompt tokens are priced with them;
    # None on an aggregated endpoint).
    serving_mode: str = "aggregated"
    kv_connector: str = "shared_storage"
    pd_min_uncached_tokens: int = 256
    prefill_coeffs: MUCoefficients | None = None

    @property
    def disaggregated(self) -> bool:
        return self.serving_mode == "disaggregated"

    @property
    def admission_replicas(self) -> tuple[ReplicaInfo, ...]:
        """The replicas requests are admitted to: all of them, or a disaggregated endpoint's all but its prefill
        pool (``gateway.proxy.disaggregation.PrefillPool`` routes that)."""
        if self.serving_mode != "disaggregated":
            return self.replicas
        return tuple(r for r in self.replicas if r.role != "prefill")

    def visible_to(self, tenant_id: int) -> bool:
        return self.owner_tenant_id is None or self.owner_tenant_id == tenant_id


@dataclass(frozen=True)
class AdapterInfo:
    """A LoRA adapter a request may name as its ``model`` (``endpoints.models.Adapter``; docs/lora-serving.md)."""

    name: str
    owner_tenant_id: int | None  # None: shared by the operators
    endpoint_name: str  # its base endpoint
    rank: int
    path: str  # the artifact's absolute directory (``lora_path`` for the engine); never shown to tenants
    created: int
    root: str = ""  # its owner's part of the LoRA storage root, which it lies under
    mu_factor: float = 1.0  # its requests cost the base endpoint's MU times this (``snapshot_loader.lora_mu_factor``)
    request_rate: float = 0.0  # requests/s over the last day (``Adapter.request_rate``): the router's history
    # What replicas hold this artifact version under (``lora_artifacts.engine_name``: owner, id, files' fingerprint):
    # the ``lora_name`` loaded, the ``model`` sent upstream, the router's and the slots' key. Empty: the public name.
    engine_name: str = ""

    def __post_init__(self) -> None:
        if not self.engine_name:
            object.__setattr__(self, "engine_name", self.name)

    def visible_to(self, tenant_id: int) -> bool:
        return self.owner_tenant_id is None or self.owner_tenant_id == tenant_id


_ABSENT = object()


class KeyTable(Mapping):
    """Keys by hash as a large base shared by successive snapshots plus a small overlay of the changes since (a
    ``KeyInfo``, or None for a key removed), so applying a key change copies the overlay, not 100,000 entries.
    Immutable: ``with_changes`` returns a new table; past ``max(COMPACT_MIN, len(base) / COMPACT_SHARE)`` changes
    the overlay is folded into a new base (one copy of the whole table every that many changes)."""

    COMPACT_MIN = 1024
    COMPACT_SHARE = 64
    __slots__ = ("_base", "_overlay", "_len")

    def __init__(self, base: dict[str, KeyInfo], overlay: dict[str, KeyInfo | None] | None = None) -> None:
        self._base = base
        self._overlay = overlay or {}
        self._len = len(base) + sum((value is not None) - (key in base) for key, value in self._overlay.items())

    def get(self, key: str, default=None):
        found = self._overlay.get(key, _ABSENT)
        if found is _ABSENT:
            return self._base.get(key, default)
        return default if found is None else found

    def __getitem__(self, key: str) -> KeyInfo:
        found = self.get(key, _ABSENT)
        if found is _ABSENT:
            raise KeyError(key)
        return found

    def __contains__(self, key: object) -> bool:
        return self.get(key, _ABSENT) is not _ABSENT

    def __iter__(self) -> Iterator[str]:
        for key in self._base:
            if key not in self._overlay:
                yield key
        for key, value in self._overlay.items():
            if value is not None:
                yield key

    def __len__(self) -> int:
        return self._len

    def with_changes(self, changes: dict[str, KeyInfo | None]) -> KeyTable:
        overlay = {**self._overlay, **changes}
        if len(overlay) <= max(self.COMPACT_MIN, len(self._base) // self.COMPACT_SHARE):
            return KeyTable(self._base, overlay)
        base = dict(self._base)
        for key, value in overlay.items():
            if value is None:
                base.pop(key, None)
            else:
                base[key] = value
        return KeyTable(base)


@dataclass(frozen=True)
class KeyCursor:
    """Where a snapshot's key table stands (docs/request-path.md, "The key table"): the database's time when it was
    last read and, on PostgreSQL, the oldest transaction still running then (``xmin``: the next read takes the keys
    and tenants written by it or later; on SQLite, those stamped since ``since`` less a look-back; None: every row),
    the table's size and checksum (the sum of its keys' ``stamp``, compared with the database's: a deleted key or
    a missed change moves it), when the whole table was last read (unix seconds), and the tenants changed since the
    watermark whose keys were read with their change (id, ``changed_at``), so they are not read again."""

    since: datetime | None
    count: int
    checksum: int
    read_at: float
    tenant_stamps: frozenset = frozenset()
    xmin: int | None = None


@dataclass(frozen=True)
class Snapshot:
    version: str
    loaded_at: float
    keys_by_hash: Mapping[str, KeyInfo] = field(default_factory=dict)  # a ``KeyTable`` once refreshed
    endpoints_by_name: dict[str, EndpointInfo] = field(default_factory=dict)
    # Base-model reservations by (tenant id, endpoint id); adapter reservations by (tenant id, endpoint id, adapter name).
    reservations: dict[tuple[int, int], ReservationInfo] = field(default_factory=dict)
    adapters_by_name: dict[str, AdapterInfo] = field(default_factory=dict)
    adapter_reservations: dict[tuple[int, int, str], ReservationInfo] = field(default_factory=dict)
    # The key table's watermark (None: built by hand, so the next refresh reads every key); the Redis stamps of the
    # last rebuild of everything but the keys, and of the last read of everything (``endpoints.config_version``);
    # when everything but the keys was last read (unix seconds).
    keys_cursor: KeyCursor | None = None
    config_stamp: str = ""
    all_stamp: str = ""
    config_loaded_at: float = 0.0
    # Derived: a tenant's MU/min reserved on an endpoint, base model and adapters together (fair pain weighs its
    # offered load there against all of it).
    _reserved_totals: dict[tuple[int, int], float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        totals: dict[tuple[int, int], float] = {}
        for (tenant_id, endpoint_id), r in self.reservations.items():
            totals[(tenant_id, endpoint_id)] = totals.get((tenant_id, endpoint_id), 0.0) + r.mu_per_min
        for (tenant_id, endpoint_id, _), r in self.adapter_reservations.items():
            totals[(tenant_id, endpoint_id)] = totals.get((tenant_id, endpoint_id), 0.0) + r.mu_per_min
        object.__setattr__(self, "_reserved_totals", totals)

    def reservation_for(self, tenant_id: int, endpoint_id: int, adapter: str | None = None) -> ReservationInfo | None:
        """What a request draws from: its adapter's reservation when the tenant holds one, else the tenant's
        base-model reservation on the endpoint (a base-model request never draws from an adapter's)."""
        if adapter is not None:
            found = self.adapter_reservations.get((tenant_id, endpoint_id, adapter))
            if found is not None:
                return found
        return self.reservations.get((tenant_id, endpoint_id))

    def reserved_mu_per_min(self, tenant_id: int, endpoint_id: int) -> float:
        return self._reserved_totals.get((tenant_id, endpoint_id), 0.0)

    def endpoints_for(self, tenant_id: int) -> list[EndpointInfo]:
        return [e for e in self.endpoints_by_name.values() if e.visible_to(tenant_id)]

    def adapter_for(self, name: str, tenant_id: int) -> tuple[AdapterInfo, EndpointInfo] | None:
        """The adapter ``name`` and its base endpoint, if this tenant may use both (else None: a 404 like a missing
        model, whether the adapter is another tenant's or does not exist)."""
        adapter = self.adapters_by_name.get(name)
        if adapter is None or not adapter.visible_to(tenant_id):
            return None
        endpoint = self.endpoints_by_name.get(adapter.endpoint_name)
        if endpoint is None or not endpoint.visible_to(tenant_id) or endpoint.max_loras <= 0:
            return None
        return adapter, endpoint

    def adapters_for(self, tenant_id: int) -> list[tuple[AdapterInfo, EndpointInfo]]:
        return [found for name in self.adapters_by_name if (found := self.adapter_for(name, tenant_id))]

    def adapter_rates(self, endpoint_name: str) -> dict[str, float]:
        """The request rates of the adapters served on ``endpoint_name`` by engine name (the router's history; never
        shown)."""
        return {
            a.engine_name: a.request_rate
            for a in self.adapters_by_name.values()
            if a.endpoint_name == endpoint_name and a.request_rate > 0
        }

    def endpoint_adapters(self, endpoint_name: str) -> dict[str, AdapterInfo]:
        """The adapters served on ``endpoint_name`` by public name (the runtime's engine names and quotas)."""
        return {a.name: a for a in self.adapters_by_name.values() if a.endpoint_name == endpoint_name}


def takes_priority(launch_options) -> bool:
    """Whether replicas launched with these options run vLLM's priority scheduler: the ``scheduling_policy``
    option (``capacity.runtimes.vllm.serve_command``, default priority) or a ``--scheduling-policy`` in
    ``extra_args``, which vLLM reads last."""
    options = launch_options if isinstance(launch_options, dict) else {}
    policy = options.get("scheduling_policy") or "priority"
    args = options.get("extra_args")
    if isinstance(args, list):
        for i, arg in enumerate(args):
            if arg == "--scheduling-policy" and i + 1 < len(args):
                policy = args[i + 1]
            elif isinstance(arg, str) and arg.startswith("--scheduling-policy="):
                policy = arg.partition("=")[2]
    return policy == "priority"
