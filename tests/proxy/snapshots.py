"""In-memory snapshots for the proxy's stage tests: named keys and endpoints, no database."""

import hashlib

from capacity.units import MUCoefficients
from gateway.proxy.snapshot import EndpointInfo, KeyInfo, ReplicaInfo, ReservationInfo, Snapshot

COEFFS = MUCoefficients(alpha=0.001, alpha_cached=0.0001, beta=0.01, gamma=0.1, mu_per_min=6000.0)
TENANT_A, TENANT_B = 1, 2
RAW_KEY_A = "ic-tenant-a-key"


def key(*, id=11, tenant_id=TENANT_A, scopes=("inference",), max_priority="critical", expires_at=None) -> KeyInfo:
    return KeyInfo(
        id=id,
        prefix="ic-tenant-a",
        tenant_id=tenant_id,
        tenant_slug=f"tenant-{tenant_id}",
        scopes=frozenset(scopes),
        max_priority=max_priority,
        expires_at=expires_at,
    )


def endpoint(*, id=7, name="chat-7b", owner=None, replicas=2, limit=4, max_model_len=4096, **fields) -> EndpointInfo:
    return EndpointInfo(
        id=id,
        name=name,
        owner_tenant_id=owner,
        coeffs=COEFFS,
        routing_policy="least_request",
        scale_to_zero=False,
        concurrency_limit=limit,
        ttft_slo_ms=500,
        tpot_slo_ms=50,
        max_model_len=max_model_len,
        created=0,
        replicas=tuple(
            ReplicaInfo(id=100 + i, name=f"r{i}", url=f"http://replica-{i}", concurrency_limit=limit)
            for i in range(replicas)
        ),
        **fields,
    )


def reservation(*, priority="critical", mu_per_min=600.0, rpm=None, tpm=None) -> ReservationInfo:
    return ReservationInfo(mu_per_min=mu_per_min, burst_minutes=1.0, priority=priority, rpm_limit=rpm, tpm_limit=tpm)


def snapshot(*, keys=None, endpoints=(), reservations=None) -> Snapshot:
    keys = {RAW_KEY_A: key()} if keys is None else keys
    return Snapshot(
        version="1",
        loaded_at=0.0,
        keys_by_hash={hashlib.sha256(raw.encode()).hexdigest(): info for raw, info in keys.items()},
        endpoints_by_name={e.name: e for e in endpoints},
        reservations=dict(reservations or {}),
    )


def bearer(raw: str = RAW_KEY_A) -> dict[bytes, bytes]:
    return {b"authorization": f"Bearer {raw}".encode()}
