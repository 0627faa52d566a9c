"""The Celery app; the beat schedule lives in workers.schedule."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")

app = Celery("infercap")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["workers"])


@app.on_after_finalize.connect
def _install_beat_schedule(sender, **kwargs):
    from workers.schedule import beat_schedule

    sender.conf.beat_schedule = beat_schedule()
