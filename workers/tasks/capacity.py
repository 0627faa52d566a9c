"""Capacity tasks: the automatic replica benchmark (long: a load sweep), enqueued by the API or the admin.

Thin: load the endpoint, call ``capacity.services.benchmark_run``. No retry: a failed sweep is recorded as a failed
benchmark with its reason, and re-running it is an operator's decision (it loads a serving replica).
"""

from celery import shared_task

from capacity.replica_benchmark.sweep import BenchmarkError
from capacity.services import benchmark_run
from endpoints.models import Endpoint, Replica


@shared_task(name="capacity.benchmark_endpoint", soft_time_limit=3600, time_limit=3700, acks_late=False)
def benchmark_endpoint(
    endpoint_id: int, replica_id: int | None = None, quick: bool = False, pin: bool = False
) -> dict:
    endpoint = Endpoint.objects.select_related("model_profile", "hardware_profile").get(pk=endpoint_id)
    replica = Replica.objects.get(pk=replica_id, endpoint=endpoint) if replica_id else None
    try:
        benchmark = benchmark_run(endpoint=endpoint, replica=replica, quick=quick, pin=pin)
    except BenchmarkError as exc:
        return {"endpoint": endpoint_id, "status": "failed", "error": str(exc)}
    return {"endpoint": endpoint_id, "status": "succeeded", "benchmark": benchmark.pk, "version": benchmark.version}
