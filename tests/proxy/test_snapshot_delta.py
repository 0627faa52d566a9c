"""The snapshot's key table carried over with only the changed keys read again (docs/request-path.md, "The key
table"): the result equals a fresh read whatever the writes, the rest of the snapshot is reused, a change nobody
announced (a deletion) is caught by the checksum, and the refresh plan picks the cheapest read that is right."""

import random
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from endpoints.config_version import ALL, ALL_KEY, CONFIG, CONFIG_KEY, KEYS, VERSION_KEY
from gateway.proxy.snapshot import KeyInfo, KeyTable
from gateway.proxy.snapshot_keys import key_checksum, read_key_changes, read_keys
from gateway.proxy.snapshot_loader import read_snapshot
from gateway.proxy.snapshot_refresh import CHECK, LOADS, RefreshTimes, Stamps, refresh, refresh_plan
from tenants.keys import hash_key
from tenants.models import ApiKey, Tenant
from tenants.services import api_key_create, api_key_revoke, api_key_update, tenant_update
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db


def _loads(kind: str) -> float:
    return LOADS.labels(kind)._value.get()


def _step(rng: random.Random, tenants: list[Tenant]) -> str:
    """One random write of the kinds a platform makes all day; returns what it did."""
    keys = list(ApiKey.objects.order_by("pk"))
    tenant = rng.choice(tenants)
    choice = rng.choice(["create", "create", "revoke", "edit", "bulk", "tenant", "tenant_bulk", "used"])
    if choice == "create" or not keys:
        controls = rng.choice([{}, {"rpm_limit": rng.randint(1, 100)}, {"allowed_models": ["m"]}])
        api_key_create(tenant=tenant, name="k", **controls)
        return "create"
    key = rng.choice(keys)
    if choice == "revoke":
        api_key_revoke(api_key=key)
    elif choice == "edit":
        change = rng.choice(
            [
                {"scopes": rng.choice([["inference"], ["read"], ["inference", "write"]])},
                {"max_priority": rng.choice(["critical", "standard", "sheddable"])},
                {"expires_at": timezone.now() + timedelta(days=rng.randint(-1, 30))},
            ]
        )
        api_key_update(api_key=key, **change)
    elif choice == "bulk":  # no signal, no save(): the trigger stamps it all the same
        ApiKey.objects.filter(pk=key.pk).update(budget_usd=rng.choice([None, 5.0]), tpm_limit=rng.randint(1, 9))
    elif choice == "tenant":
        tenant_update(tenant=tenant, is_active=not tenant.is_active)
    elif choice == "tenant_bulk":
        Tenant.objects.filter(pk=tenant.pk).update(
            accepts_fallback=rng.random() < 0.5, budget_usd=rng.choice([None, 10.0]), budget_hard_stop=True
        )
    else:
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=timezone.now())
    return choice


@pytest.mark.django_db(transaction=True)  # each write commits, as in production: the watermark moves past it
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_table_with_changes_applied_equals_a_fresh_read(seed):
    rng = random.Random(seed)
    tenants = [TenantFactory() for _ in range(3)]
    for tenant in tenants:
        api_key_create(tenant=tenant, name="first")
    keys, cursor = read_keys()
    done = set()
    for _ in range(60):
        done.add(_step(rng, tenants))
        before, held = keys, dict(keys)
        keys, cursor = read_key_changes(keys, cursor)
        fresh, _ = read_keys()
        assert keys == fresh
        assert before == held, "the table a request may hold is never modified"
        assert (cursor.count, cursor.checksum) == key_checksum()
    assert {"create", "revoke", "edit", "bulk", "tenant", "tenant_bulk"} <= done


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("seed", [4, 5])
def test_refreshed_snapshots_equal_a_fresh_full_read(seed):
    """Through ``refresh`` as the proxy calls it, ``keys`` and ``config`` refreshes at random, keys deleted now
    and then without the ``all`` their signal would announce: the next ``check`` refresh must catch those."""
    rng = random.Random(seed)
    tenants = [TenantFactory() for _ in range(3)]
    for tenant in tenants:
        api_key_create(tenant=tenant, name="first")
    snap = refresh(None, ALL, Stamps("0", "0", "0"))
    for step in range(40):
        if rng.random() < 0.1 and ApiKey.objects.exists():
            ApiKey.objects.filter(pk=rng.choice(list(ApiKey.objects.values_list("pk", flat=True)))).delete()
            kind = CHECK
        else:
            _step(rng, tenants)
            kind = rng.choice([KEYS, KEYS, CONFIG])
        snap = refresh(snap, kind, Stamps(str(step + 1), "0", "0"))
        assert snap.keys_by_hash == read_snapshot().keys_by_hash


@pytest.mark.django_db(transaction=True)
def test_a_deactivated_tenant_loses_its_keys_and_gets_them_back():
    tenant = TenantFactory()
    other = TenantFactory()
    _, raw = api_key_create(tenant=tenant, name="one")
    _, other_raw = api_key_create(tenant=other, name="other")
    keys, cursor = read_keys()
    tenant_update(tenant=tenant, is_active=False)
    keys, cursor = read_key_changes(keys, cursor)
    assert hash_key(raw) not in keys and hash_key(other_raw) in keys
    tenant_update(tenant=tenant, is_active=True)
    keys, cursor = read_key_changes(keys, cursor)
    assert hash_key(raw) in keys


def test_a_tenant_change_reads_its_keys_once():
    tenant = TenantFactory()
    raws = [api_key_create(tenant=tenant, name=f"k{i}")[1] for i in range(5)]
    _age_stamps()
    keys, cursor = read_keys()
    Tenant.objects.filter(pk=tenant.pk).update(budget_usd=50.0, budget_hard_stop=True)
    keys, cursor = read_key_changes(keys, cursor)
    assert all(keys[hash_key(raw)].tenant_budget_usd == 50.0 for raw in raws)
    api_key_create(tenant=TenantFactory(), name="unrelated")  # a change within the look-back of the tenant's
    later, _ = read_key_changes(keys, cursor)
    assert all(later[hash_key(raw)] is keys[hash_key(raw)] for raw in raws), "the tenant's keys were not read again"
    Tenant.objects.filter(pk=tenant.pk).update(accepts_fallback=True)  # a new change of the tenant is, of course
    later, _ = read_key_changes(keys, cursor)
    assert all(later[hash_key(raw)].accepts_fallback for raw in raws)


def test_last_used_bookkeeping_does_not_move_the_watermark():
    key, _ = api_key_create(tenant=TenantFactory(), name="busy")
    stamped = ApiKey.objects.get(pk=key.pk).changed_at
    ApiKey.objects.filter(pk=key.pk).update(last_used_at=timezone.now(), name="renamed")
    assert ApiKey.objects.get(pk=key.pk).changed_at == stamped
    ApiKey.objects.filter(pk=key.pk).update(rpm_limit=7)
    assert ApiKey.objects.get(pk=key.pk).changed_at > stamped


def _age_stamps() -> None:
    """Every stamp an hour old and by a long-ended transaction, as on a platform whose keys were written long
    before (inside the test's transaction, which every read would otherwise take as still writing; the trigger
    would keep the stamps, so it is set aside for the statement)."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL session_replication_role = replica")  # no user trigger fires
        for table in ("tenants_apikey", "tenants_tenant"):
            cursor.execute(f"UPDATE {table} SET changed_at = changed_at - interval '1 hour', changed_xid = 3")
        cursor.execute("SET LOCAL session_replication_role = DEFAULT")


def test_a_keys_refresh_reuses_everything_else_and_reads_only_the_changes(tenant_a, django_assert_num_queries):
    _age_stamps()
    snap = refresh(None, ALL, Stamps("1", "0", "0"))
    _, raw = api_key_create(tenant=tenant_a.tenant, name="new")
    full = _loads(ALL)
    with django_assert_num_queries(3):  # the clock, the changed tenants, the changed keys
        fresh = refresh(snap, KEYS, Stamps("2", "0", "0"))
    assert _loads(ALL) == full
    assert hash_key(raw) in fresh.keys_by_hash and hash_key(raw) not in snap.keys_by_hash
    assert fresh.endpoints_by_name is snap.endpoints_by_name and fresh.version == "2"
    # A rebuild of the rest carries the key table over: the same objects for the keys that did not change (here,
    # older than the look-back, which reads the last seconds' changes again).
    rebuilt = refresh(fresh, CONFIG, Stamps("3", "1", "0"))
    assert rebuilt.endpoints_by_name is not fresh.endpoints_by_name and rebuilt.config_stamp == "1"
    assert rebuilt.keys_by_hash[hash_key(tenant_a.raw_key)] is snap.keys_by_hash[hash_key(tenant_a.raw_key)]
    assert _loads(ALL) == full


def test_a_deletion_nobody_announced_is_caught_by_the_checksum(tenant_a):
    other, raw = api_key_create(tenant=tenant_a.tenant, name="deleted behind our back")
    snap = refresh(None, ALL, Stamps("1", "0", "0"))
    assert hash_key(raw) in snap.keys_by_hash
    with connection.cursor() as cursor:  # no signal, no stamp: only the table's size and checksum say it
        cursor.execute("DELETE FROM tenants_apikey WHERE id = %s", [other.pk])
    assert hash_key(raw) in refresh(snap, KEYS, Stamps("2", "0", "0")).keys_by_hash  # a keys refresh cannot see it
    assert hash_key(raw) in refresh(snap, CONFIG, Stamps("2", "1", "0")).keys_by_hash  # nor a config one
    full = _loads(ALL)
    fresh = refresh(snap, CHECK, Stamps("2", "1", "0"))
    assert hash_key(raw) not in fresh.keys_by_hash and hash_key(tenant_a.raw_key) in fresh.keys_by_hash
    assert _loads(ALL) == full + 1, "the mismatch falls back to reading every key"


def test_deleting_a_key_announces_a_full_read_and_saving_one_a_keys_read(
    tenant_a, clean_redis, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        api_key_create(tenant=tenant_a.tenant, name="x")
    assert clean_redis.get(VERSION_KEY) is not None and clean_redis.get(CONFIG_KEY) is None
    with django_capture_on_commit_callbacks(execute=True):
        tenant_a.key.delete()
    assert clean_redis.get(ALL_KEY) == b"1" and clean_redis.get(CONFIG_KEY) is None
    with django_capture_on_commit_callbacks(execute=True):
        tenant_a.endpoint.save()
    assert clean_redis.get(CONFIG_KEY) == b"1"


TIMES = RefreshTimes(fallback_s=5.0, config_s=60.0, all_s=600.0)


def test_the_plan_reads_as_little_as_is_right(tenant_a):
    snap = refresh(None, ALL, Stamps("7", "3", "1"))
    now = snap.loaded_at
    plan = lambda stamps, at=now: refresh_plan(snap, stamps, now=at, times=TIMES)  # noqa: E731
    assert refresh_plan(None, None, now=now, times=TIMES) == ALL
    assert plan(Stamps("7", "3", "1")) is None
    assert plan(Stamps("8", "3", "1")) == KEYS
    assert plan(Stamps("8", "4", "1")) == CONFIG
    assert plan(Stamps("8", "4", "2")) == ALL
    assert plan(Stamps("7", "3", "1"), now + 61) == CHECK  # the safety net for a lost bump
    assert plan(Stamps("7", "3", "1"), now + 601) == ALL
    # Redis unreachable: the rest and the changed keys from PostgreSQL every fallback_s, the table checked.
    assert plan(None, now + 1) is None
    assert plan(None, now + 6) == CHECK
    # A refresh while Redis is away keeps the stamps it had, so what was announced meanwhile is acted on later.
    kept = refresh(snap, CHECK, None)
    assert (kept.version, kept.config_stamp, kept.all_stamp) == ("7", "3", "1")


def test_the_key_table_behaves_as_the_dict_it_stands_for(monkeypatch):
    monkeypatch.setattr(KeyTable, "COMPACT_MIN", 8)  # fold the overlay often
    rng = random.Random(5)
    info = lambda i: KeyInfo(i, f"p{i}", 1, "t", frozenset(), "standard", None)  # noqa: E731
    reference = {f"h{i}": info(i) for i in range(50)}
    table, tables = KeyTable(dict(reference)), []
    for step in range(300):
        changes = {f"h{rng.randrange(80)}": (info(step) if rng.random() < 0.6 else None) for _ in range(3)}
        before, held = table, dict(table)
        table = table.with_changes(changes)
        assert dict(before) == held, "a table a snapshot holds never changes"
        for key, value in changes.items():
            if value is None:
                reference.pop(key, None)
            else:
                reference[key] = value
        assert table == reference and len(table) == len(reference) and sorted(table) == sorted(reference)
        assert all(table.get(f"h{i}") == reference.get(f"h{i}") for i in range(80))
        assert ("h79" in table) == ("h79" in reference)
        tables.append(len(table._overlay))
    assert max(tables) <= 8 + 3 and min(tables) == 0, "the overlay is folded into the base as it grows"
