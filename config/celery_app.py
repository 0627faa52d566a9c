"""The Celery app; the beat schedule lives in workers.schedule."""

import os

from celery import Celery
from celery.signals import task_failure, task_postrun, task_prerun

from config import tracing

# Unset means production (fail closed); development sets config.settings.local explicitly (make run does).
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.production")

app = Celery("infercap")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["workers"])

# Task spans (beat ticks included) when tracing is on (config/tracing.py); the handlers return at once when off.
tracing.configure_from_env()
task_prerun.connect(tracing.task_started, weak=False)
task_failure.connect(tracing.task_failed, weak=False)
task_postrun.connect(tracing.task_finished, weak=False)


@app.on_after_finalize.connect
def _install_beat_schedule(sender, **kwargs):
    # Imported once the app is finalized: this module loads with the settings, before the task modules' models.
    from workers.schedule import beat_schedule

    sender.conf.beat_schedule = beat_schedule()
