"""Indexes for the ticks' reads of an endpoint's newest decisions (``capacity.models.AutoscalerDecision.Meta``).

Built concurrently: the decisions table holds two weeks of ticks (17,280 rows a day per endpoint and axis), and a
plain CREATE INDEX would hold every tick's insert for as long as the build takes."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("capacity", "0011_hardware_topology"),
        ("endpoints", "0016_prefill_decode_disaggregation"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="autoscalerdecision",
            index=models.Index(fields=["endpoint", "axis", "-at"], name="decision_newest"),
        ),
        AddIndexConcurrently(
            model_name="autoscalerdecision",
            index=models.Index(
                condition=models.Q(("applied", True), ("axis", "horizontal"), ("desired__gt", models.F("current"))),
                fields=["endpoint", "-at"],
                name="decision_last_up",
            ),
        ),
        AddIndexConcurrently(
            model_name="autoscalerdecision",
            index=models.Index(
                condition=models.Q(("applied", True), ("axis", "horizontal"), ("desired__lt", models.F("current"))),
                fields=["endpoint", "-at"],
                name="decision_last_down",
            ),
        ),
    ]
