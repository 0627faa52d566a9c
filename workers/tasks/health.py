"""Blackbox health probes from Celery beat: one cycle every few seconds over every ready replica.

Probing runs here rather than inside each proxy process so that a deployment has one prober (not one
per proxy worker), lifecycle writes stay in synchronous Django code, and a wedged proxy does not stop
failure detection. The cycle itself (``endpoints.health.health_check_cycle``) holds a Redis lock, so a
slow cycle and the next beat never probe the same replica twice.
"""

from celery import shared_task

from endpoints.health import health_check_cycle

HEALTH_INTERVAL_S = 3.0

BEAT_SCHEDULE = {
    "health-probe-cycle": {
        "task": "health.probe_cycle",
        "schedule": HEALTH_INTERVAL_S,
        # A cycle not started within one interval is stale: the next beat brings a fresh one.
        "options": {"expires": HEALTH_INTERVAL_S},
    },
}


@shared_task(name="health.probe_cycle", ignore_result=True, soft_time_limit=30, time_limit=45)
def probe_cycle() -> dict:
    report = health_check_cycle()
    return {"probed": len(report.probed_ids), "failed": report.failed_ids, "skipped": report.skipped}
