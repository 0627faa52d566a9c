"""``bench scale``'s ``key_change`` loop: what one proxy process pays to apply one key change to its snapshot
(``gateway.proxy.snapshot_refresh``: the changed keys read, the rest carried over), against reading it whole,
at a size of API keys. One size at a time, in a transaction rolled back after it.

The keys are stamped an hour old before the first read, as on a platform whose keys were written long before; the
changes then come one after the other (a key created, the previous one revoked, another's expiry moved), each
applied by a ``keys`` refresh. The whole run is one transaction, still open at every read, so on PostgreSQL each
refresh reads again every change the run has made (the watermark is the oldest open transaction,
``snapshot_keys``): as a proxy does while a long writer is open, a little more than under plain churn.
"""

from __future__ import annotations

import random
import statistics
from datetime import timedelta

from django.db import connection, transaction
from django.utils import timezone

from benchmarks.operations.scale_fleet import KEYS_PER_ENDPOINT, REPLICAS_PER_ENDPOINT, _fleet, _keys
from benchmarks.operations.scale_rows import timed_cpu
from endpoints.config_version import ALL, CONFIG, KEYS
from gateway.proxy.snapshot_keys import read_keys
from gateway.proxy.snapshot_refresh import CHECK, refresh
from tenants.models import ApiKey, Tenant
from tenants.services import api_key_create, api_key_revoke, api_key_update

CHANGES = 30
REBUILDS = 3  # of each of the two rebuilds of all but the keys, alternated (one is noisy on a shared machine)


def key_change(keys: int, *, progress) -> dict:
    """The mean CPU seconds (this process and its PostgreSQL backends) of a ``keys`` refresh after one key
    change, with ``keys`` keys over ``keys / 100`` endpoints; beside it the whole read's, a ``config`` refresh's
    (everything but the key table read again, the table carried over) and a ``check`` refresh's (the same, the
    table's size and checksum compared with the database's), each the mean of three."""
    rng = random.Random(11)
    with transaction.atomic():
        endpoints = max(1, keys // KEYS_PER_ENDPOINT)
        _fleet(endpoints, replicas=REPLICAS_PER_ENDPOINT, actuator="local")
        _old_keys(keys)
        tenants = list(Tenant.objects.filter(slug__startswith="scale-keys-").values_list("pk", flat=True)[:50])
        existing = list(ApiKey.objects.values_list("pk", flat=True)[:1000])
        _, full_cpu, snap = timed_cpu(refresh, None, ALL, None)
        walls, cpus, created = [], [], None
        for i in range(CHANGES):
            created = _change(i, rng, tenants, existing, created)
            wall, cpu, snap = timed_cpu(refresh, snap, KEYS, None)
            walls.append(wall)
            cpus.append(cpu)
        rebuilds = {CONFIG: [], CHECK: []}
        for kind in [CONFIG, CHECK] * REBUILDS:
            _, cpu, snap = timed_cpu(refresh, snap, kind, None)
            rebuilds[kind].append(cpu)
        config_cpu, check_cpu = statistics.mean(rebuilds[CONFIG]), statistics.mean(rebuilds[CHECK])
        if snap.keys_by_hash != read_keys()[0]:
            raise RuntimeError("the key table with the changes applied differs from a fresh read")
        transaction.set_rollback(True)
    # The mean: the backends' CPU is read from /proc in 10 ms ticks, which only a sum over many changes resolves.
    change_cpu = statistics.mean(cpus)
    progress(
        f"  key change: {keys:,} keys: {change_cpu * 1e3:.1f} CPU-ms a change (mean of {CHANGES}), "
        f"whole read {full_cpu:.2f} CPU-s, rest rebuilt {config_cpu:.3f} CPU-s "
        f"({check_cpu:.3f} with the table checked)"
    )
    return {
        "seconds": statistics.median(walls),
        "cpu_s": round(change_cpu, 5),
        "full_cpu_s": round(full_cpu, 3),
        "config_cpu_s": round(config_cpu, 3),
        "check_cpu_s": round(check_cpu, 3),
        "endpoints": endpoints,
    }


def _old_keys(count: int) -> None:
    """``count`` usable keys over ``count / 10`` tenants (``scale_fleet._keys``), every stamp an hour old: the
    trigger that stamps them is set aside for the inserts (``session_replication_role``), so the rows are written
    as a platform's long-standing keys are, with no dead versions left for the index scans to step over."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL session_replication_role = replica")
    _keys(count, changed_at=timezone.now() - timedelta(hours=1))
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL session_replication_role = DEFAULT")


def _change(i: int, rng: random.Random, tenants: list[int], existing: list[int], created):
    """One key change, by the service an operator's or tenant's edit goes through; returns the key it created."""
    kind = i % 3
    if kind == 0:
        key, _ = api_key_create(tenant=Tenant.objects.get(pk=rng.choice(tenants)), name=f"churn {i}")
        return key
    if kind == 1 and created is not None:
        api_key_revoke(api_key=created)
    else:
        key = ApiKey.objects.get(pk=rng.choice(existing))
        api_key_update(api_key=key, expires_at=timezone.now() + timedelta(days=rng.randint(1, 90)))
    return created
