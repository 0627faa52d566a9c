"""Celery: broker from the resolved backends, late acks so a killed worker's task is redelivered."""

from .backends import Backends


def celery_settings(backends: Backends) -> dict:
    return {
        "CELERY_BROKER_URL": backends.celery_broker_url,
        "CELERY_BROKER_TRANSPORT": backends.celery_broker_transport,
        "CELERY_BROKER_TRANSPORT_OPTIONS": backends.celery_broker_options,
        "CELERY_RESULT_BACKEND": backends.celery_result_backend,
        "CELERY_TASK_ACKS_LATE": True,
        "CELERY_TASK_REJECT_ON_WORKER_LOST": True,
        "CELERY_WORKER_PREFETCH_MULTIPLIER": 1,
        "CELERY_TASK_TIME_LIMIT": 300,
        "CELERY_TASK_SOFT_TIME_LIMIT": 240,
        "CELERY_TIMEZONE": "UTC",
        "CELERY_TASK_ALWAYS_EAGER": False,
    }
