"""When the proxy refreshes its snapshot and how much it reads (docs/request-path.md, "The key table").

Kinds of refresh: ``keys`` carries everything over but the keys changed since the last read; ``config`` reads
everything but the key table again and applies the changed keys; ``check`` is a ``config`` refresh that also
compares the table's size and checksum (over each key's id and change stamps) with the database's (a key deleted
with no announcement leaves no row to read), run when nothing announced a change (the periodic safety net, Redis
unreachable); ``all`` reads everything. The first three answer the kinds of change ``endpoints.config_version``
announces. ``refresh_plan`` is pure (clock injected); ``refresh`` runs in the proxy's worker thread."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

from django.conf import settings
from prometheus_client import Counter

from endpoints.config_version import ALL, CONFIG, KEYS
from gateway.proxy.snapshot import KeyCursor, Snapshot
from gateway.proxy.snapshot_keys import key_checksum, read_key_changes, read_keys
from gateway.proxy.snapshot_loader import read_snapshot

CHECK = "check"
LOADS = Counter(
    "infercap_proxy_snapshot_loads", "Snapshot refreshes by what they read (keys, config, check, all)", ["kind"]
)


@dataclass(frozen=True)
class Stamps:
    """The Redis counters (``endpoints.config_version``): any change, a change but a key's, a deletion."""

    version: str
    config: str
    all: str


@dataclass(frozen=True)
class RefreshTimes:
    fallback_s: float  # Redis unreachable (or none): a ``check`` refresh this often, as changes go unannounced
    config_s: float = 60.0  # with Redis: a ``check`` refresh at least this often (a bump lost with its writer)
    all_s: float = 600.0  # everything read at least this often, whatever the stamps and checksums say


def refresh_times(fallback_s: float) -> RefreshTimes:
    """``INFERCAP["SNAPSHOT_CONFIG_REFRESH_S"]`` and ``["SNAPSHOT_FULL_REFRESH_S"]``, overridden by the
    ``INFERCAP_PROXY_SNAPSHOT_CONFIG_REFRESH_S`` and ``INFERCAP_PROXY_SNAPSHOT_FULL_REFRESH_S`` variables."""
    knobs = getattr(settings, "INFERCAP", {})

    def seconds(name: str, default: float) -> float:
        raw = os.environ.get(f"INFERCAP_PROXY_{name}") or knobs.get(name)
        value = float(raw) if raw not in (None, "") else default
        if value <= 0:
            raise ValueError(f"{name} must be positive")
        return value

    return RefreshTimes(
        fallback_s=fallback_s,
        config_s=seconds("SNAPSHOT_CONFIG_REFRESH_S", RefreshTimes.config_s),
        all_s=seconds("SNAPSHOT_FULL_REFRESH_S", RefreshTimes.all_s),
    )


def refresh_plan(snap: Snapshot | None, stamps: Stamps | None, *, now: float, times: RefreshTimes) -> str | None:
    """What to read now: ``ALL``, ``CHECK``, ``CONFIG``, ``KEYS`` or nothing (None). ``stamps`` None: Redis
    unreachable."""
    if snap is None or snap.keys_cursor is None or now - snap.keys_cursor.read_at > times.all_s:
        return ALL
    if stamps is None:
        return CHECK if now - snap.config_loaded_at > times.fallback_s else None
    if stamps.all != snap.all_stamp:
        return ALL
    if stamps.config != snap.config_stamp:
        return CONFIG
    if now - snap.config_loaded_at > times.config_s:
        return CHECK
    return KEYS if stamps.version != snap.version else None


def refresh(snap: Snapshot | None, kind: str, stamps: Stamps | None) -> Snapshot:
    """The snapshot after a ``kind`` refresh of ``snap``; a new object, ``snap`` untouched (requests in flight keep
    reading it). ``stamps`` None (Redis unreachable): the new one keeps ``snap``'s, so the changes announced while
    it was away are still acted on when it returns."""
    if stamps is None:
        stamps = Stamps(snap.version, snap.config_stamp, snap.all_stamp) if snap is not None else Stamps("", "", "")
    if snap is None or snap.keys_cursor is None:
        kind = ALL
    marks = {"config_stamp": stamps.config, "all_stamp": stamps.all}
    if kind == ALL:
        fresh = read_snapshot(stamps.version, **marks)
    elif kind in (CONFIG, CHECK):
        table = read_key_changes(snap.keys_by_hash, snap.keys_cursor)
        if kind == CHECK:
            table = _checked(*table)
            if table is None:
                kind, table = ALL, read_keys()
        fresh = read_snapshot(stamps.version, keys=table, **marks)
    else:
        keys, cursor = read_key_changes(snap.keys_by_hash, snap.keys_cursor)
        fresh = replace(snap, version=stamps.version, loaded_at=time.time(), keys_by_hash=keys, keys_cursor=cursor)
    LOADS.labels(kind).inc()
    return fresh


def _checked(keys: Mapping, cursor: KeyCursor) -> tuple[Mapping, KeyCursor] | None:
    """The table if its size and checksum match the database's (one aggregate query over the usable keys), else
    None (a key deleted, or a change the watermark missed: read it whole). A key written between the two reads
    also mismatches, so the changes are read once more before giving up."""
    for attempt in range(2):
        if key_checksum() == (cursor.count, cursor.checksum):
            return keys, cursor
        if attempt == 0:
            keys, cursor = read_key_changes(keys, cursor)
    return None
