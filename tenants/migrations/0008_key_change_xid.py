"""``changed_xid`` on API keys and tenants: on PostgreSQL the id of the transaction that last changed a field the
proxy's snapshot reads, on SQLite a per-row change counter; the triggers (``tenants.change_triggers``, created again
after every ``migrate``) stamp it with ``changed_at`` (docs/request-path.md, "The key table")."""

import importlib

from django.db import migrations, models

from tenants import change_triggers


def create_triggers(apps, schema_editor) -> None:
    change_triggers.install(schema_editor.connection)


def restore_0007_triggers(apps, schema_editor) -> None:
    change_triggers.drop(schema_editor.connection)
    importlib.import_module("tenants.migrations.0007_key_change_watermark").create_triggers(apps, schema_editor)


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0007_key_change_watermark"),
    ]

    operations = [
        migrations.AddField(
            model_name="apikey",
            name="changed_xid",
            field=models.BigIntegerField(db_default=0, db_index=True, default=0, editable=False),
        ),
        migrations.AddField(
            model_name="tenant",
            name="changed_xid",
            field=models.BigIntegerField(db_default=0, db_index=True, default=0, editable=False),
        ),
        migrations.RunPython(create_triggers, restore_0007_triggers),
    ]
