"""``changed_at`` on API keys and tenants, kept by a trigger: the watermark the proxies read key changes by
(docs/request-path.md, "The key table"). A trigger rather than ``save()``, so a ``QuerySet.update`` or a hand-written
UPDATE moves it too; only the columns the proxy's snapshot reads count, so ``last_used_at`` bookkeeping does not.

PostgreSQL stamps with its own clock (``clock_timestamp()``: the statement's time, one clock for every writer);
SQLite (the embedded default) with its ``'now'``, on the same machine as its only writers."""

import django.utils.timezone
from django.db import migrations, models

KEY_COLUMNS = (
    "key_hash", "prefix", "tenant_id", "scopes", "max_priority", "expires_at", "revoked_at", "rpm_limit",
    "tpm_limit", "mu_per_min_limit", "allowed_models", "budget_usd", "budget_period",
)  # fmt: skip
TENANT_COLUMNS = ("slug", "is_active", "accepts_fallback", "budget_usd", "budget_hard_stop")
TABLES = (("tenants_apikey", KEY_COLUMNS), ("tenants_tenant", TENANT_COLUMNS))


def _postgresql(table: str, columns: tuple[str, ...]) -> list[str]:
    new = ", ".join(f"NEW.{c}" for c in columns)
    old = ", ".join(f"OLD.{c}" for c in columns)
    return [
        f"""
        CREATE OR REPLACE FUNCTION {table}_stamp_changed() RETURNS trigger AS $$
        BEGIN
            IF TG_OP = 'INSERT' OR ROW({new}) IS DISTINCT FROM ROW({old}) THEN
                NEW.changed_at := clock_timestamp();
            ELSE
                NEW.changed_at := OLD.changed_at;
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


def _sqlite(table: str, columns: tuple[str, ...]) -> list[str]:
    differs = " OR ".join(f"OLD.{c} IS NOT NEW.{c}" for c in columns)
    return [
        f"DROP TRIGGER IF EXISTS {table}_changed",
        f"""
        CREATE TRIGGER {table}_changed AFTER UPDATE OF {", ".join(columns)} ON {table}
        FOR EACH ROW WHEN {differs}
        BEGIN
            UPDATE {table} SET changed_at = strftime('%Y-%m-%d %H:%M:%f', 'now') WHERE id = NEW.id;
        END
        """,
    ]


def create_triggers(apps, schema_editor) -> None:
    vendor = schema_editor.connection.vendor
    build = {"postgresql": _postgresql, "sqlite": _sqlite}.get(vendor)
    if build is None:
        return  # another database: the model's default stamps inserts; the proxies' periodic full read does the rest
    for table, columns in TABLES:
        for statement in build(table, columns):
            schema_editor.execute(statement)


def drop_triggers(apps, schema_editor) -> None:
    vendor = schema_editor.connection.vendor
    for table, _ in TABLES:
        if vendor == "postgresql":
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_changed ON {table}")
            schema_editor.execute(f"DROP FUNCTION IF EXISTS {table}_stamp_changed()")
        elif vendor == "sqlite":
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_changed")


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0006_key_controls_and_budgets"),
    ]

    operations = [
        migrations.AddField(
            model_name="apikey",
            name="changed_at",
            field=models.DateTimeField(db_index=True, default=django.utils.timezone.now, editable=False),
        ),
        migrations.AddField(
            model_name="tenant",
            name="changed_at",
            field=models.DateTimeField(db_index=True, default=django.utils.timezone.now, editable=False),
        ),
        migrations.RunPython(create_triggers, drop_triggers),
    ]
