"""Console loop: sample each endpoint's queue depth by priority class for the endpoint page's chart."""

from celery import shared_task

from console.queue_history import SAMPLE_EVERY_S, queue_sample
from endpoints.models import Endpoint


@shared_task(name="console.queue_sample", soft_time_limit=4, time_limit=5)
def queue_sample_task() -> int:
    return queue_sample(endpoint_ids=list(Endpoint.objects.values_list("pk", flat=True)))


BEAT_SCHEDULE = {
    "console-queue-sample": {
        "task": "console.queue_sample",
        "schedule": SAMPLE_EVERY_S,
        "options": {"expires": SAMPLE_EVERY_S - 1},
    },
}
