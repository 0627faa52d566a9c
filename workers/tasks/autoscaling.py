"""Autoscaling loops: demand sampled every second, horizontal decisions every 5 s, vertical every 30 s; the
decision loops fan out in batches of endpoints.

The tick id is the wall-clock slot (``h-<unix//5>``, ``v-<unix//30>``) taken at fan-out, so a redelivered or
duplicated task lands on the same id and the services store at most one decision for it.
"""

import logging
import time

from celery import shared_task
from django.conf import settings

from capacity.autoscaling.actuators import actuator_name
from capacity.autoscaling.defrag_ticks import DEFRAG_S, defrag_pass
from capacity.autoscaling.store import RedisError, TickLock
from capacity.autoscaling.tick_reads import append_samples
from capacity.autoscaling.ticks import decisions_prune, horizontal_tick, horizontal_ticks
from capacity.autoscaling.ticks import scale_apply as apply_scale
from capacity.autoscaling.vertical_ticks import vertical_tick, vertical_ticks
from endpoints.models import Endpoint

log = logging.getLogger(__name__)

HORIZONTAL_S = 5.0
VERTICAL_S = 30.0

SAMPLE_S = 1.0
SAMPLE_BATCH = 500  # endpoints per Redis pipeline in the sampler's second
TICK_BATCH = 250  # endpoints per horizontal batch task (INFERCAP["AUTOSCALE_TICK_BATCH"])
# Endpoints per vertical batch task (INFERCAP["AUTOSCALE_VERTICAL_BATCH"]): 2,500 replicas scraped, ~1.5 s of a
# worker at 64 scrapes in flight, well inside the task's 20-s soft limit and the batch's 15-s scrape deadline.
VERTICAL_BATCH = 250

BEAT_SCHEDULE = {
    "autoscale-sample-demand": {"task": "autoscale.sample_demand", "schedule": SAMPLE_S, "options": {"expires": 1}},
    "autoscale-horizontal": {"task": "autoscale.horizontal_all", "schedule": HORIZONTAL_S, "options": {"expires": 5}},
    "autoscale-vertical": {"task": "autoscale.vertical_all", "schedule": VERTICAL_S, "options": {"expires": 30}},
    "autoscale-decisions-retention": {"task": "autoscale.decisions_retention", "schedule": 3600.0},
    "autoscale-defrag": {"task": "autoscale.defrag", "schedule": DEFRAG_S, "options": {"expires": DEFRAG_S}},
}


def autoscaled_endpoint_ids() -> list[int]:
    """Endpoints with autoscaling on, and every endpoint of a suspended tenant whatever its setting: the ticks hold
    those at zero replicas and finish their drains (``capacity.autoscaling.services.suspended_hold``)."""
    endpoints = Endpoint.objects.select_related("owner_tenant").only(
        "id", "launch_options", "owner_tenant", "owner_tenant__is_active"
    )
    return [
        e.pk
        for e in endpoints
        if actuator_name(e) != "static"
        and ((e.launch_options or {}).get("autoscale", True) or (e.owner_tenant and not e.owner_tenant.is_active))
    ]


@shared_task(name="autoscale.sample_demand", ignore_result=True, soft_time_limit=2, time_limit=3)
def sample_demand() -> int:
    """One demand sample per autoscaled endpoint per second (the proxies report every second; ticks every 5 s)."""
    ids = autoscaled_endpoint_ids()
    try:
        # One sampler at a time: it is the arrivals' one writer (each sample counts those since the last).
        with TickLock(axis="sampler", endpoint_id=0, ttl_s=5) as turn:
            if not turn.held:
                return 0
            for first in range(0, len(ids), SAMPLE_BATCH):
                append_samples(ids[first : first + SAMPLE_BATCH], now=time.time())
    except RedisError as exc:  # Redis away: no sample this second (the ticks skip too); no traceback per second
        log.warning("autoscaler: demand sampling skipped: Redis: %s", exc)
        return 0
    return len(ids)


@shared_task(name="autoscale.horizontal_all", ignore_result=True)
def horizontal_all() -> int:
    """Fan the tick out in batches of ``AUTOSCALE_TICK_BATCH`` endpoints: each batch's reads cost a fixed number of
    queries (``capacity.autoscaling.tick_reads``), and the workers share the batches."""
    tick = f"h-{int(time.time() // HORIZONTAL_S)}"
    ids = autoscaled_endpoint_ids()
    size = max(1, int(getattr(settings, "INFERCAP", {}).get("AUTOSCALE_TICK_BATCH", TICK_BATCH)))
    for first in range(0, len(ids), size):
        horizontal_batch.apply_async(args=[ids[first : first + size], tick], expires=HORIZONTAL_S * 2)
    return len(ids)


@shared_task(name="autoscale.horizontal_batch", ignore_result=True, soft_time_limit=20, time_limit=30)
def horizontal_batch(endpoint_ids: list[int], tick: str) -> int:
    decisions = horizontal_ticks(endpoint_ids=endpoint_ids, tick=tick)
    return sum(1 for decision in decisions.values() if decision is not None)


@shared_task(name="autoscale.horizontal_one", ignore_result=True, soft_time_limit=20, time_limit=30)
def horizontal_one(endpoint_id: int, tick: str) -> int | None:
    """One endpoint's tick at once (the activator's wake-up, an interruption notice), beside the beat's batches."""
    decision = horizontal_tick(endpoint_id=endpoint_id, tick=tick)
    return decision.pk if decision else None


@shared_task(name="autoscale.defrag", ignore_result=True, soft_time_limit=20, time_limit=30)
def defrag() -> int:
    """The defragmenting step on this host's GPUs (docs/placement.md, "Local"): a no-op without GPUs or when off."""
    return len(defrag_pass())


@shared_task(
    name="autoscale.scale_apply", bind=True, ignore_result=True, max_retries=10, soft_time_limit=20, time_limit=30
)
def scale_apply(self, endpoint_id: int, decision_id: int | None = None) -> list[str] | None:
    """An operator's scale, converged at once rather than at the next tick; retried while a tick holds the lock."""
    try:
        actions = apply_scale(endpoint_id=endpoint_id, decision_id=decision_id)
    except RedisError as exc:
        raise self.retry(countdown=2, exc=exc) from exc
    if actions is None:
        raise self.retry(countdown=1)
    return actions


@shared_task(name="autoscale.vertical_all", ignore_result=True)
def vertical_all() -> int:
    """Fan the vertical tick out in batches of ``AUTOSCALE_VERTICAL_BATCH`` endpoints: each batch's reads cost a fixed
    number of queries and its replicas are scraped together (``capacity.autoscaling.vertical_ticks``)."""
    tick = f"v-{int(time.time() // VERTICAL_S)}"
    ids = autoscaled_endpoint_ids()
    size = max(1, int(getattr(settings, "INFERCAP", {}).get("AUTOSCALE_VERTICAL_BATCH", VERTICAL_BATCH)))
    for first in range(0, len(ids), size):
        vertical_batch.apply_async(args=[ids[first : first + size], tick], expires=VERTICAL_S)
    return len(ids)


@shared_task(name="autoscale.vertical_batch", ignore_result=True, soft_time_limit=20, time_limit=30)
def vertical_batch(endpoint_ids: list[int], tick: str) -> int:
    decisions = vertical_ticks(endpoint_ids=endpoint_ids, tick=tick)
    return sum(1 for decision in decisions.values() if decision is not None)


@shared_task(name="autoscale.vertical_one", ignore_result=True, soft_time_limit=20, time_limit=30)
def vertical_one(endpoint_id: int, tick: str) -> int | None:
    """One endpoint's vertical tick (tasks queued before the batches)."""
    decision = vertical_tick(endpoint_id=endpoint_id, tick=tick)
    return decision.pk if decision else None


@shared_task(name="autoscale.decisions_retention", ignore_result=True, soft_time_limit=240, time_limit=300)
def decisions_retention() -> int:
    return decisions_prune()
