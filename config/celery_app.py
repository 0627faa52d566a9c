"""The Celery app; the beat schedule lives in workers.schedule."""

import os

from celery import Celery

# Unset means production (fail closed); development sets config.settings.local explicitly (make run does).
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.production")

app = Celery("infercap")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["workers"])


@app.on_after_finalize.connect
def _install_beat_schedule(sender, **kwargs):
    # Imported once the app is finalized: this module loads with the settings, before the task modules' models.
    from workers.schedule import beat_schedule

    sender.conf.beat_schedule = beat_schedule()
