"""The key table's watermark (docs/request-path.md, "The key table"): a change made in a transaction that stays open
across a proxy's reads is read once it commits, however long it was open; the triggers watch exactly the columns
the snapshot reads, exist and stamp on both backends after the real migrations, and survive a table rebuild."""

import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection

from gateway.proxy import snapshot_keys
from gateway.proxy.snapshot_keys import key_checksum, read_key_changes, read_keys
from tenants.change_triggers import KEY_COLUMNS, TENANT_COLUMNS
from tenants.keys import hash_key
from tenants.models import ApiKey, Tenant
from tenants.services import api_key_create
from tests.factories import TenantFactory

ROOT = Path(__file__).resolve().parents[2]


def _other_connection() -> psycopg.Connection:
    """A second client of the test database, as another process writing keys would be."""
    s = connection.settings_dict
    return psycopg.connect(
        dbname=s["NAME"], user=s["USER"], password=s["PASSWORD"] or None, host=s["HOST"], port=s["PORT"] or None
    )


@pytest.mark.django_db(transaction=True)
def test_a_change_committed_after_reads_that_began_during_it_is_read(monkeypatch):
    # A look-back this short would miss the change below: the watermark must not depend on it on PostgreSQL.
    monkeypatch.setattr(snapshot_keys, "LOOKBACK", timedelta(0))
    tenant = TenantFactory()
    scoped, scoped_raw = api_key_create(tenant=tenant, name="narrowed", scopes=["inference", "write"])
    revoked, revoked_raw = api_key_create(tenant=tenant, name="revoked")
    keys, cursor = read_keys()
    writer = _other_connection()
    try:
        writer.execute("UPDATE tenants_apikey SET scopes = '[\"read\"]' WHERE id = %s", [scoped.pk])
        writer.execute("UPDATE tenants_apikey SET revoked_at = now() WHERE id = %s", [revoked.pk])
        for _ in range(2):  # reads while the transaction is open, the watermark moving past its UPDATE's time
            time.sleep(0.05)
            api_key_create(tenant=TenantFactory(), name="unrelated")
            keys, cursor = read_key_changes(keys, cursor)
            assert keys[hash_key(scoped_raw)].scopes == {"inference", "write"} and hash_key(revoked_raw) in keys
        writer.commit()
    finally:
        writer.close()
    keys, cursor = read_key_changes(keys, cursor)
    assert keys[hash_key(scoped_raw)].scopes == {"read"}
    assert hash_key(revoked_raw) not in keys
    assert (cursor.count, cursor.checksum) == key_checksum()


@contextmanager
def _no_triggers():
    """Writes that no trigger stamps, as a restore or a hand-run ``session_replication_role`` would make."""
    with connection.cursor() as sql:
        sql.execute("SET session_replication_role = replica")
        try:
            yield sql
        finally:
            sql.execute("SET session_replication_role = DEFAULT")


@pytest.mark.django_db(transaction=True)
def test_the_checksum_sees_what_a_count_and_id_sum_cannot():
    """Two tenants swapping which of them is active with keys of equal count and id sum, or a key's stamp moved
    behind the watermark's back: the table's checksum differs from the database's."""
    one, two = TenantFactory(), TenantFactory(is_active=False)
    for tenant, wanted in ((one, (1_000_010, 1_000_030)), (two, (1_000_015, 1_000_025))):
        for pk in wanted:
            key, _ = api_key_create(tenant=tenant, name=str(pk))
            ApiKey.objects.filter(pk=key.pk).update(id=pk)
    keys, cursor = read_keys()
    assert (cursor.count, cursor.checksum) == key_checksum()
    with _no_triggers() as sql:
        sql.execute("UPDATE tenants_tenant SET is_active = NOT is_active WHERE id IN (%s, %s)", [one.pk, two.pk])
    assert sum(ApiKey.objects.filter(tenant__is_active=True).values_list("id", flat=True)) == 2_000_040
    assert key_checksum()[0] == cursor.count and key_checksum() != (cursor.count, cursor.checksum)
    keys, cursor = read_keys()
    assert key_checksum() == (cursor.count, cursor.checksum)
    with _no_triggers() as sql:
        sql.execute("UPDATE tenants_apikey SET changed_xid = 3 WHERE id = 1000015")
    assert key_checksum() != (cursor.count, cursor.checksum)


def test_the_triggers_watch_exactly_what_the_snapshot_reads():
    key_columns, tenant_columns = set(), set()
    for name in snapshot_keys._DELTA_COLUMNS:
        if name in ("pk", "changed_xid", "tenant__changed_xid"):
            continue
        if name.startswith("tenant__"):
            tenant_columns.add(Tenant._meta.get_field(name.removeprefix("tenant__")).column)
        else:
            key_columns.add(ApiKey._meta.get_field(name.removesuffix("_id")).column)
    assert key_columns == set(KEY_COLUMNS)
    assert tenant_columns == set(TENANT_COLUMNS)


@pytest.mark.django_db
def test_the_migrated_postgresql_triggers_stamp_and_follow_the_schema():
    with connection.cursor() as sql:
        sql.execute("SELECT tgname FROM pg_trigger WHERE tgname LIKE 'tenants_%' ORDER BY 1")
        assert [name for (name,) in sql.fetchall()] == ["tenants_apikey_changed", "tenants_tenant_changed"]
        sql.execute("SELECT txid_current()")
        (xid,) = sql.fetchone()
    key, _ = api_key_create(tenant=TenantFactory(), name="k")
    key.refresh_from_db()
    assert key.changed_xid == xid
    ApiKey.objects.filter(pk=key.pk).update(changed_xid=3)
    assert ApiKey.objects.get(pk=key.pk).changed_xid == xid, "a write of no watched column keeps the stamps"
    with _no_triggers() as sql:
        sql.execute("UPDATE tenants_apikey SET changed_xid = 3 WHERE id = %s", [key.pk])
    key.name = "renamed"
    key.save()  # the instance's stamp (``xid``) is stale: the trigger keeps the row's
    assert ApiKey.objects.get(pk=key.pk).changed_xid == 3
    key.scopes = ["read"]
    key.save()
    assert ApiKey.objects.get(pk=key.pk).changed_xid == xid
    tenant = key.tenant
    Tenant.objects.filter(pk=tenant.pk).update(budget_hard_stop=True)
    assert Tenant.objects.get(pk=tenant.pk).changed_xid == xid
    # A migration dropping a watched column leaves the trigger naming it (new sessions' writes then fail: this one
    # has the function compiled already); the next migrate's receiver rebuilds it from the columns there are.
    source = "SELECT prosrc FROM pg_proc WHERE proname = 'tenants_apikey_stamp_changed'"
    with connection.cursor() as sql:
        sql.execute("SET CONSTRAINTS ALL IMMEDIATE")  # no deferred check pending on the table
        sql.execute("ALTER TABLE tenants_apikey DROP COLUMN budget_period")
        sql.execute(source)
        assert "NEW.budget_period" in sql.fetchone()[0]
    call_command("migrate", verbosity=0)
    with connection.cursor() as sql:
        sql.execute(source)
        assert "NEW.budget_period" not in (found := sql.fetchone()[0]) and "NEW.rpm_limit" in found
        sql.execute("UPDATE tenants_apikey SET rpm_limit = 9 WHERE id = %s RETURNING changed_xid", [key.pk])
        assert sql.fetchone() == (xid,)


def test_the_migrated_sqlite_triggers_stamp_and_survive_a_table_rebuild(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(DJANGO_SETTINGS_MODULE="config.settings.local", INFERCAP_VAR_DIR=str(tmp_path))
    run = subprocess.run(
        [sys.executable, "-m", "tests.proxy.sqlite_triggers_probe"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["vendor"] == "sqlite"
    triggers = ["tenants_apikey_changed", "tenants_apikey_kept", "tenants_tenant_changed", "tenants_tenant_kept"]
    assert report["migrated"] == triggers
    stamps = report["stamps"]
    assert stamps["scoped"][0] > stamps["inserted"][0] and stamps["scoped"][1] == stamps["inserted"][1] + 1
    assert stamps["renamed"] == stamps["scoped"], "a later full save() does not move the stamps back"
    assert report["delta"] == {"scopes": ["read"], "budget": 5.0} and report["checksum_equal"]
    assert report["rebuilt"] == triggers[2:], "rebuilding the key table dropped its triggers"
    assert report["migrated_again"] == triggers
    after = report["stamps_after_rebuild"]
    assert after["after"][1] == after["before"][1] + 1
