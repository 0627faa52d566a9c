"""A canary task for operators and the reliability bench: it proves that a task whose worker dies is
redelivered (late acks) and that redelivery is harmless (the task's effect is idempotent).

Each attempt increments a Redis counter, holds for ``hold_s`` (long enough to kill the worker under
it), then records its token once as an audit entry; a second attempt finds the entry and adds nothing.
"""

import time

import redis
from celery import shared_task
from django.conf import settings
from django.db import transaction

from tenants.models import AuditEntry

ATTEMPTS_KEY = "infercap:canary:{token}:attempts"


@shared_task(name="canary.hold", acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def hold(token: str, hold_s: float = 0.0) -> bool:
    if settings.REDIS_URL:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2)
        client.incr(ATTEMPTS_KEY.format(token=token))
        client.expire(ATTEMPTS_KEY.format(token=token), 3600)
    time.sleep(hold_s)
    with transaction.atomic():
        _, created = AuditEntry.objects.get_or_create(
            action="canary.completed", object_type="canary", object_id=token[:64], defaults={"actor_label": "celery"}
        )
    return created
