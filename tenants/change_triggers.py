"""The triggers that stamp ``changed_at`` and ``changed_xid`` on API keys and tenants whenever a column the proxy's
snapshot reads changes: the watermark the proxies read key changes by (docs/request-path.md, "The key table").

A trigger rather than ``save()``, so a ``QuerySet.update`` or a hand-written UPDATE stamps too; only the columns the
snapshot reads count, so ``last_used_at`` bookkeeping does not. PostgreSQL (a BEFORE trigger) stamps the statement's
time and the writing transaction's id (``txid_current()``): a proxy reads the rows whose transaction had not ended
when it last read. SQLite (the embedded default, one writer at a time; AFTER triggers) stamps its ``'now'`` and a
per-row change counter, and puts the stamps back when a ``save()`` of unwatched fields writes stale ones.

``install`` builds them from the columns the tables have now, so it is run again after every ``migrate``
(``TenantsConfig``): a SQLite table rebuild drops its triggers, and a renamed or removed column would leave a
PostgreSQL trigger naming it."""

from __future__ import annotations

KEY_COLUMNS = (
    "key_hash", "prefix", "tenant_id", "scopes", "max_priority", "expires_at", "revoked_at", "rpm_limit",
    "tpm_limit", "mu_per_min_limit", "allowed_models", "budget_usd", "budget_period",
)  # fmt: skip
TENANT_COLUMNS = ("slug", "is_active", "accepts_fallback", "budget_usd", "budget_hard_stop")
TABLES = (("tenants_apikey", KEY_COLUMNS), ("tenants_tenant", TENANT_COLUMNS))


def postgresql_statements(table: str, columns: tuple[str, ...], *, xid: bool) -> list[str]:
    new = ", ".join(f"NEW.{c}" for c in columns)
    old = ", ".join(f"OLD.{c}" for c in columns)
    stamp_xid = "NEW.changed_xid := txid_current();" if xid else ""
    keep_xid = "NEW.changed_xid := OLD.changed_xid;" if xid else ""
    return [
        f"""
        CREATE OR REPLACE FUNCTION {table}_stamp_changed() RETURNS trigger AS $$
        BEGIN
            IF TG_OP = 'INSERT' OR ROW({new}) IS DISTINCT FROM ROW({old}) THEN
                NEW.changed_at := clock_timestamp();
                {stamp_xid}
            ELSE
                NEW.changed_at := OLD.changed_at;
                {keep_xid}
            END IF;
            RETURN NEW;
        END
        $$ LANGUAGE plpgsql
        """,
        f"DROP TRIGGER IF EXISTS {table}_changed ON {table}",
        f"""
        CREATE TRIGGER {table}_changed BEFORE INSERT OR UPDATE ON {table}
        FOR EACH ROW EXECUTE FUNCTION {table}_stamp_changed()
        """,
    ]


def sqlite_statements(table: str, columns: tuple[str, ...], *, xid: bool) -> list[str]:
    """Two AFTER UPDATE triggers (SQLite cannot assign NEW): one stamps a row whose watched columns changed; the
    other puts the old stamps back when none did but the stamps moved back (a ``save()`` writing the instance's
    stale ones; the first trigger's own UPDATE moves them forward, so it does not undo it)."""
    differs = " OR ".join(f"OLD.{c} IS NOT NEW.{c}" for c in columns)
    stamp_xid = ", changed_xid = OLD.changed_xid + 1" if xid else ""
    keep_xid = ", changed_xid = OLD.changed_xid" if xid else ""
    moved = "NEW.changed_at < OLD.changed_at" + (" OR NEW.changed_xid < OLD.changed_xid" if xid else "")
    return [
        f"DROP TRIGGER IF EXISTS {table}_changed",
        f"""
        CREATE TRIGGER {table}_changed AFTER UPDATE ON {table}
        FOR EACH ROW WHEN {differs}
        BEGIN
            UPDATE {table} SET changed_at = strftime('%Y-%m-%d %H:%M:%f', 'now'){stamp_xid} WHERE id = NEW.id;
        END
        """,
        f"DROP TRIGGER IF EXISTS {table}_kept",
        f"""
        CREATE TRIGGER {table}_kept AFTER UPDATE ON {table}
        FOR EACH ROW WHEN NOT ({differs}) AND ({moved})
        BEGIN
            UPDATE {table} SET changed_at = OLD.changed_at{keep_xid} WHERE id = NEW.id;
        END
        """,
    ]


def install(connection) -> None:
    """(Re)create both tables' triggers on ``connection``, for the watched columns the tables have now: nothing
    before ``changed_at`` exists (migrations before 0007), no transaction id stamped before ``changed_xid`` does
    (before 0008). Idempotent. Other databases get none: the model's default stamps inserts, and the proxies'
    periodic full read does the rest."""
    build = {"postgresql": postgresql_statements, "sqlite": sqlite_statements}.get(connection.vendor)
    if build is None:
        return
    with connection.cursor() as cursor:
        tables = set(connection.introspection.table_names(cursor))
        for table, watched in TABLES:
            if table not in tables:
                continue
            present = {c.name for c in connection.introspection.get_table_description(cursor, table)}
            columns = tuple(c for c in watched if c in present)
            if "changed_at" not in present or not columns:
                continue
            for statement in build(table, columns, xid="changed_xid" in present):
                cursor.execute(statement)


def drop(connection) -> None:
    with connection.cursor() as cursor:
        for table, _ in TABLES:
            if connection.vendor == "postgresql":
                cursor.execute(f"DROP TRIGGER IF EXISTS {table}_changed ON {table}")
                cursor.execute(f"DROP FUNCTION IF EXISTS {table}_stamp_changed()")
            elif connection.vendor == "sqlite":
                cursor.execute(f"DROP TRIGGER IF EXISTS {table}_changed")
                cursor.execute(f"DROP TRIGGER IF EXISTS {table}_kept")
