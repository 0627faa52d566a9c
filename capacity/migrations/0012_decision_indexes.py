"""Indexes for the ticks' reads of an endpoint's newest decisions (``capacity.models.AutoscalerDecision.Meta``).

Built concurrently on PostgreSQL: the decisions table holds two weeks of ticks (17,280 rows a day per endpoint and
axis), and a plain CREATE INDEX would hold every tick's insert for as long as the build takes. The embedded default
(SQLite) builds them plainly."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class AddIndexConcurrentlyOnPostgres(AddIndexConcurrently):
    """``AddIndexConcurrently`` where the database has it, ``AddIndex`` elsewhere."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            return super().database_forwards(app_label, schema_editor, from_state, to_state)
        return migrations.AddIndex.database_forwards(self, app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            return super().database_backwards(app_label, schema_editor, from_state, to_state)
        return migrations.AddIndex.database_backwards(self, app_label, schema_editor, from_state, to_state)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("capacity", "0011_hardware_topology"),
        ("endpoints", "0016_prefill_decode_disaggregation"),
    ]

    operations = [
        AddIndexConcurrentlyOnPostgres(
            model_name="autoscalerdecision",
            index=models.Index(fields=["endpoint", "axis", "-at"], name="decision_newest"),
        ),
        AddIndexConcurrentlyOnPostgres(
            model_name="autoscalerdecision",
            index=models.Index(
                condition=models.Q(("applied", True), ("axis", "horizontal"), ("desired__gt", models.F("current"))),
                fields=["endpoint", "-at"],
                name="decision_last_up",
            ),
        ),
        AddIndexConcurrentlyOnPostgres(
            model_name="autoscalerdecision",
            index=models.Index(
                condition=models.Q(("applied", True), ("axis", "horizontal"), ("desired__lt", models.F("current"))),
                fields=["endpoint", "-at"],
                name="decision_last_down",
            ),
        ),
    ]
