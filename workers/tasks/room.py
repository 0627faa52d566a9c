"""Room on Kubernetes: every 30 s, read the cluster's GPU nodes and the GPUs live pods hold, and publish them for the
capacity ledger's whole-replica figures (``capacity.autoscaling.actuators.kubernetes_room``; docs/placement.md, "In
the ledger"). Does nothing where no endpoint runs on Kubernetes."""

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded

from capacity.autoscaling.actuators.kubernetes_room import REFRESH_S, publish_unknown, refresh_room


@shared_task(name="capacity.room_refresh", ignore_result=True, soft_time_limit=20, time_limit=25)
def room_refresh() -> dict | None:
    try:
        room = refresh_room()
    except SoftTimeLimitExceeded:
        room = publish_unknown("the nodes and pods were not read within 20 s")
    if room is None:
        return None
    return {"nodes": len(room.get("nodes") or []), "unknown": room.get("unknown")}


BEAT_SCHEDULE = {
    "capacity-room-refresh": {
        "task": "capacity.room_refresh",
        "schedule": REFRESH_S,
        "options": {"expires": REFRESH_S - 5},
    },
}
