"""The snapshot's key table: read whole, or carried over with only the keys changed since its last read applied
(docs/request-path.md, "The key table"). Synchronous: the proxy calls it from a worker thread.

``ApiKey.changed_at`` and ``Tenant.changed_at`` are the watermark (a trigger stamps them with the database's clock
on every write of a field read here). A read takes the rows stamped after the database's time at the last read,
less ``LOOKBACK``: a writer stamps before it commits, so a row can become visible after a read that started later
than its stamp. A deleted key leaves no row, so the table's size and id sum can be compared with the database's
(``key_checksum``, which ``snapshot_refresh`` runs when no change was announced)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import datetime, timedelta

from django.db.models import Count, Q, Sum
from django.db.models.functions import Now

from gateway.proxy.snapshot import KeyCursor, KeyInfo, KeyTable
from tenants.models import ApiKey, Tenant

LOOKBACK = timedelta(seconds=15)  # longer than a transaction that writes a key takes from its UPDATE to its COMMIT
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
    )


def read_keys() -> tuple[KeyTable, KeyCursor]:
    """Usable keys of active tenants, by the SHA-256 the proxy computes from the bearer token, and the table's
    cursor. Read as tuples, not model instances: at 100,000 keys building the instances was most of the
    snapshot's time. The database's clock is read first: what changes after it is read by the next
    ``read_key_changes``."""
    since = _database_now()
    keys, id_sum = {}, 0
    for row in _usable().values_list(*_COLUMNS).iterator(chunk_size=5000):
        keys[row[0]] = _key_info(row)
        id_sum += row[1]
    return KeyTable(keys), KeyCursor(since=since, count=len(keys), id_sum=id_sum, read_at=time.time())


def read_key_changes(keys: Mapping[str, KeyInfo], cursor: KeyCursor) -> tuple[Mapping[str, KeyInfo], KeyCursor]:
    """``keys`` with the keys changed since ``cursor`` applied: each changed key's row read again (added or
    replaced if usable, removed if not), and every key of a tenant changed since. Three small queries (the clock,
    the changed tenants, the changed keys); ``keys`` itself is never modified (a request may hold it): the changes
    go into a new ``KeyTable`` sharing its base, and with none ``keys`` is returned as it is."""
    since = _database_now()
    rows, tenant_stamps = ApiKey.objects.all(), frozenset()
    if cursor.since is not None:
        after = cursor.since - LOOKBACK
        tenant_stamps = frozenset(Tenant.objects.filter(changed_at__gt=after).values_list("pk", "changed_at"))
        # A tenant change already applied is not read again for as long as the look-back shows it: a tenant's
        # keys are all read with it, and a big tenant's would otherwise be read again at every change for 15 s.
        tenants = [pk for pk, _ in tenant_stamps - cursor.tenant_stamps]
        changed = Q(changed_at__gt=after)
        rows = rows.filter(changed | Q(tenant_id__in=tenants) if tenants else changed)
    rows = list(rows.values_list(*_DELTA_COLUMNS))
    moved = {"since": since or cursor.since, "tenant_stamps": tenant_stamps}
    if not rows:
        return keys, _moved(cursor, **moved)
    changes, count, id_sum = {}, cursor.count, cursor.id_sum
    for row in rows:
        before = changes[row[0]] if row[0] in changes else keys.get(row[0])
        if before is not None:
            count, id_sum = count - 1, id_sum - before.id
        if row[_REVOKED] is None and row[_ACTIVE]:
            changes[row[0]] = _key_info(row)
            count, id_sum = count + 1, id_sum + row[1]
        else:
            changes[row[0]] = None
    table = keys if isinstance(keys, KeyTable) else KeyTable(dict(keys))
    return table.with_changes(changes), _moved(cursor, count=count, id_sum=id_sum, **moved)


def key_checksum() -> tuple[int, int]:
    """The usable keys' count and id sum in the database, to compare with a cursor's: one aggregate query."""
    found = _usable().aggregate(n=Count("id"), s=Sum("id"))
    return found["n"], found["s"] or 0


def _database_now() -> datetime | None:
    """The database's clock, which stamps ``changed_at`` (None while there is no tenant, hence no key, to read it
    with: the next read then takes every row)."""
    return Tenant.objects.annotate(now=Now()).values_list("now", flat=True).first()


def _moved(cursor: KeyCursor, **changes) -> KeyCursor:
    return KeyCursor(**{**cursor.__dict__, **changes})
