"""KV hand-off sweep: every minute, the shared-storage folders of disaggregated endpoints lose what no decode replica
consumed within ``INFERCAP["KV_HANDOFF_TTL_S"]`` (``capacity.autoscaling.actuators.kv_storage``;
docs/disaggregation.md, "Cleaning the hand-off folders"). The sweep renames before it deletes, so two overlapping
runs (or a run and a loading engine) never remove the same folder twice."""

import time

from celery import shared_task

from capacity.autoscaling.actuators.kv_storage import sweep_root
from endpoints.models import Endpoint

SWEEP_EVERY_S = 60.0

BEAT_SCHEDULE = {
    "kv-handoff-sweep": {
        "task": "kv_storage.sweep",
        "schedule": SWEEP_EVERY_S,
        "options": {"expires": SWEEP_EVERY_S},
    },
}


@shared_task(name="kv_storage.sweep", ignore_result=True, soft_time_limit=50, time_limit=58)
def sweep() -> dict:
    live = set(Endpoint.objects.values_list("pk", flat=True))
    results = sweep_root(now=time.time(), live_endpoint_ids=live)
    return {name: {"removed": r.removed, "kept": r.kept, "bytes": r.removed_bytes} for name, r in results.items()}
