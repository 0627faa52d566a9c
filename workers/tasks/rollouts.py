"""Rollouts: every active rollout is ticked every few seconds (``endpoints.rollouts.ticks.rollout_tick``).

A tick holds the rollout's endpoint lock in Redis, records its decision in the Rollout row before acting, and
keeps nothing in memory: a worker killed mid-rollout leaves the next tick (on any worker) to carry on.
"""

from celery import shared_task

from endpoints.models import ROLLOUT_ACTIVE_STATES, Rollout
from endpoints.rollouts.ticks import rollout_tick

TICK_S = 3.0

BEAT_SCHEDULE = {
    "rollouts-tick": {"task": "rollouts.tick_all", "schedule": TICK_S, "options": {"expires": TICK_S * 2}},
}


@shared_task(name="rollouts.tick_all", ignore_result=True)
def tick_all() -> int:
    ids = list(Rollout.objects.filter(state__in=ROLLOUT_ACTIVE_STATES).values_list("id", flat=True))
    for rollout_id in ids:
        tick_one.apply_async(args=[rollout_id], expires=TICK_S * 2)
    return len(ids)


@shared_task(name="rollouts.tick_one", ignore_result=True, soft_time_limit=90, time_limit=120)
def tick_one(rollout_id: int) -> str | None:
    rollout = rollout_tick(rollout_id=rollout_id)
    return rollout.state if rollout is not None else None
