"""The snapshot's key table: read whole, or carried over with only the keys changed since its last read applied
(docs/request-path.md, "The key table"). Synchronous: the proxy calls it from a worker thread.

``ApiKey``/``Tenant`` ``changed_at`` and ``changed_xid`` are the watermark, stamped by a trigger on every write of a
field read here (``tenants.change_triggers``). On PostgreSQL a read first notes the oldest transaction still running
(``txid_snapshot_xmin``), and the next read takes the rows written by it or any later one: a write that a read
could not see was made by such a transaction, however long it stayed open. On SQLite (the embedded default, one
writer at a time) the next read takes the rows stamped after the database's time at the last read, less
``LOOKBACK``. A deleted key leaves no row, so the table's size and checksum (a sum over its keys of a term of the
key's id, its row's and its tenant's ``changed_xid``) are compared with the database's (``key_checksum``, which
``snapshot_refresh`` runs when no change was announced): a key deleted, or changed behind the watermark's back,
moves them."""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import datetime, timedelta

from django.db import connections
from django.db.models import Count, F, Q, Sum
from django.db.models.expressions import RawSQL
from django.db.models.functions import Now

from gateway.proxy.snapshot import KeyCursor, KeyInfo, KeyTable
from tenants.models import ApiKey, Tenant

LOOKBACK = timedelta(seconds=15)  # SQLite only: how far before the last read's time a stamp is still read
# A key's checksum term, (id * A + (changed_xid mod M) * B + (its tenant's changed_xid mod M) * C) mod M: every
# intermediate below 2**53 and a sum of a million terms below 2**52, so SQLite's 64-bit SUM cannot overflow.
_MOD, _A, _B, _C = 2_147_483_647, 1_000_003, 999_983, 999_979
_COLUMNS = (
    "key_hash",
    "pk",
    "prefix",
    "tenant_id",
    "tenant__slug",
    "scopes",
    "max_priority",
    "expires_at",
    "tenant__accepts_fallback",
    "rpm_limit",
    "tpm_limit",
    "mu_per_min_limit",
    "allowed_models",
    "budget_usd",
    "budget_period",
    "tenant__budget_usd",
    "tenant__budget_hard_stop",
    "changed_xid",
    "tenant__changed_xid",
)
# What a changed row adds: whether it is usable now.
_DELTA_COLUMNS = (*_COLUMNS, "revoked_at", "tenant__is_active")
_REVOKED, _ACTIVE = len(_COLUMNS), len(_COLUMNS) + 1


def _usable():
    return ApiKey.objects.filter(revoked_at__isnull=True, tenant__is_active=True)


def _key_info(row: tuple) -> KeyInfo:
    return KeyInfo(
        id=row[1],
        prefix=row[2],
        tenant_id=row[3],
        tenant_slug=row[4],
        scopes=frozenset(row[5] or ()),
        max_priority=row[6],
        expires_at=row[7].timestamp() if row[7] else None,
        accepts_fallback=row[8],
        rpm_limit=row[9],
        tpm_limit=row[10],
        mu_per_min_limit=row[11],
        allowed_models=frozenset(row[12] or ()),
        budget_usd=row[13],
        budget_period=row[14],
        tenant_budget_usd=row[15] if row[16] else None,
        stamp=checksum_term(row[1], row[17], row[18]),
    )


def checksum_term(key_id: int, key_xid: int, tenant_xid: int) -> int:
    return (key_id * _A + (key_xid % _MOD) * _B + (tenant_xid % _MOD) * _C) % _MOD


def read_keys() -> tuple[KeyTable, KeyCursor]:
    """Usable keys of active tenants, by the SHA-256 the proxy computes from the bearer token, and the table's
    cursor. Read as tuples, not model instances: at 100,000 keys building the instances was most of the
    snapshot's time. The watermark is read first: what changes after it is read by the next
    ``read_key_changes``."""
    since, xmin = _watermark()
    keys, checksum = {}, 0
    for row in _usable().values_list(*_COLUMNS).iterator(chunk_size=5000):
        info = keys[row[0]] = _key_info(row)
        checksum += info.stamp
    return KeyTable(keys), KeyCursor(since=since, count=len(keys), checksum=checksum, read_at=time.time(), xmin=xmin)


def read_key_changes(keys: Mapping[str, KeyInfo], cursor: KeyCursor) -> tuple[Mapping[str, KeyInfo], KeyCursor]:
    """``keys`` with the keys changed since ``cursor`` applied: each changed key's row read again (added or
    replaced if usable, removed if not), and every key of a tenant changed since. Three small queries (the
    watermark, the changed tenants, the changed keys); ``keys`` itself is never modified (a request may hold it):
    the changes go into a new ``KeyTable`` sharing its base, and with none ``keys`` is returned as it is."""
    since, xmin = _watermark()
    rows, tenant_stamps = ApiKey.objects.all(), frozenset()
    if cursor.xmin is not None or cursor.since is not None:
        if cursor.xmin is not None:
            changed = Q(changed_xid__gte=cursor.xmin)
        else:
            changed = Q(changed_at__gt=cursor.since - LOOKBACK)
        tenant_stamps = frozenset(Tenant.objects.filter(changed).values_list("pk", "changed_at"))
        # A tenant change already applied is not read again while the watermark still takes it: a tenant's keys
        # are all read with it, and a big tenant's would otherwise be read again at every refresh meanwhile.
        tenants = [pk for pk, _ in tenant_stamps - cursor.tenant_stamps]
        rows = rows.filter(changed | Q(tenant_id__in=tenants) if tenants else changed)
    rows = list(rows.values_list(*_DELTA_COLUMNS))
    moved = {"since": since or cursor.since, "xmin": xmin or cursor.xmin, "tenant_stamps": tenant_stamps}
    if not rows:
        return keys, _moved(cursor, **moved)
    changes, count, checksum = {}, cursor.count, cursor.checksum
    for row in rows:
        before = changes[row[0]] if row[0] in changes else keys.get(row[0])
        if before is not None:
            count, checksum = count - 1, checksum - before.stamp
        if row[_REVOKED] is None and row[_ACTIVE]:
            info = changes[row[0]] = _key_info(row)
            count, checksum = count + 1, checksum + info.stamp
        else:
            changes[row[0]] = None
    table = keys if isinstance(keys, KeyTable) else KeyTable(dict(keys))
    return table.with_changes(changes), _moved(cursor, count=count, checksum=checksum, **moved)


def key_checksum() -> tuple[int, int]:
    """The usable keys' count and checksum in the database, to compare with a cursor's: one aggregate query."""
    term = (F("id") * _A + F("changed_xid") % _MOD * _B + F("tenant__changed_xid") % _MOD * _C) % _MOD
    found = _usable().aggregate(n=Count("id"), s=Sum(term))
    return found["n"], int(found["s"] or 0)


def _watermark() -> tuple[datetime | None, int | None]:
    """The database's clock and, on PostgreSQL, the oldest transaction still running, in one query (None while
    there is no tenant, hence no key, to read them with: the next read then takes every row)."""
    tenants = Tenant.objects.annotate(now=Now())
    if connections[tenants.db].vendor != "postgresql":
        return tenants.values_list("now", flat=True).first(), None
    xmin = RawSQL("txid_snapshot_xmin(txid_current_snapshot())", ())
    return tenants.annotate(xmin=xmin).values_list("now", "xmin").first() or (None, None)


def _moved(cursor: KeyCursor, **changes) -> KeyCursor:
    return KeyCursor(**{**cursor.__dict__, **changes})
