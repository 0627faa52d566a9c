"""The rollout tick: applies the state machine's decisions (``endpoints.rollouts.machine``) to one rollout.

A tick is idempotent and keeps nothing in memory: it observes the replicas and usage records, asks
``machine.decide`` and records the decision in the row (a compare-and-set on the state the decision was based on)
*before* acting; a worker that dies after the record re-does the idempotent action (drain, launch the shortfall)
on the next tick from the recorded state. Celery beat runs ``tick_active_rollouts`` every few seconds.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import replace
from datetime import datetime

import httpx
from django.db import transaction
from django.utils import timezone

from capacity.autoscaling import actuators, store
from capacity.autoscaling.actuators.base import version_endpoint
from capacity.autoscaling.services import finish_drains, quota_allowance
from endpoints.models import (
    ROLLOUT_ACTIVE_STATES,
    Replica,
    ReplicaState,
    Rollout,
    RolloutState,
)
from endpoints.rollouts import machine
from endpoints.rollouts.selectors import version_stats
from endpoints.rollouts.services import (
    FINAL_STATES,
    audit_rollout,
    bump_proxies,
    mirror_version,
    record_event,
    replicas_of,
)

log = logging.getLogger(__name__)


WARMUP_TIMEOUT_S = 10.0


# A tick takes seconds (a warm-up request per new replica); a worker killed while holding the lock blocks the
# rollout for at most this long.
LOCK_TTL_S = 30


# -- the tick -------------------------------------------------------------------------------------------------
def tick_active_rollouts(*, now: datetime | None = None) -> list[int]:
    ticked = []
    for rollout_id in Rollout.objects.filter(state__in=ROLLOUT_ACTIVE_STATES).values_list("id", flat=True):
        try:
            rollout_tick(rollout_id=rollout_id, now=now)
        except Exception:  # noqa: BLE001 - one broken rollout must not stop the others
            log.exception("rollout %s: tick failed", rollout_id)
        ticked.append(rollout_id)
    return ticked


def rollout_tick(*, rollout_id: int, now: datetime | None = None) -> Rollout | None:
    """Observe, decide, record, act, for one rollout. None when another worker holds its lock."""
    rollout = Rollout.objects.select_related("endpoint", "from_version", "to_version").get(pk=rollout_id)
    with store.TickLock(axis="rollout", endpoint_id=rollout.endpoint_id, ttl_s=LOCK_TTL_S) as lock:
        if not lock.held:
            return None
        rollout.refresh_from_db()
        if rollout.state in FINAL_STATES or rollout.state == RolloutState.PAUSED:
            return rollout
        return _tick(rollout, now or timezone.now())


def _tick(rollout: Rollout, now: datetime) -> Rollout:
    endpoint = rollout.endpoint
    endpoint.refresh_from_db(fields=["current_version"])
    if rollout.state in machine.ROLLBACK_FROM and endpoint.current_version_id != rollout.from_version_id:
        # Someone switched the serving version behind the rollout's back (the admin, the database): its idea of
        # old and new no longer holds, so it stops where it is and an operator decides.
        failed = machine.Decision(
            state=RolloutState.FAILED,
            traffic_percent=rollout.traffic_percent,
            step_index=rollout.step_index,
            kind="failed",
            reason=f"the endpoint's serving version changed outside the rollout (now {endpoint.current_version_id})",
        )
        _record(rollout, _facts(rollout, now), failed, now)
        return rollout
    actuator = actuators.get_actuator(endpoint)
    try:
        actuator.sync(endpoint)
    except Exception:  # noqa: BLE001 - the observation below still holds what the rows say
        log.exception("rollout %s: actuator sync failed", rollout.pk)
    finish_drains(endpoint=endpoint, actuator=actuator)
    _warm_up(rollout)
    facts = _facts(rollout, now)
    decision = machine.decide(facts, _config(rollout))
    if not _record(rollout, facts, decision, now):
        return rollout  # an operator (or another worker) changed the row meanwhile: the next tick decides again
    if decision.launch:
        try:
            _launch(rollout, actuator, rollout.to_version, decision.launch, "new-version replica(s)", {})
        except actuators.ActuatorError as exc:
            # The new version cannot even start (bad launch options, no capacity): same as replicas failing.
            failed = machine.decide(
                replace(facts, state=rollout.state, new_failures=(f"could not start: {exc}",)), _config(rollout)
            )
            _record(rollout, replace(facts, state=rollout.state), failed, now)
            # The rest of the decision (drain old replicas of this batch) assumed the launch; the next tick acts
            # on the rollback instead, so the old version keeps its capacity.
            return rollout
    if decision.drain_old:
        # a batch of the rolling replacement drains that many; promoting drains whatever is left of the old version
        count = None if decision.state == RolloutState.PROMOTING else decision.drain_old
        _drain(rollout, actuator, old=True, count=count)
    if decision.drain_new:
        _drain(rollout, actuator, old=False)
    if decision.launch_old:
        try:
            _launch(
                rollout,
                actuator,
                rollout.from_version,
                decision.launch_old,
                "old-version replica(s) again",
                {"version": "old"},
            )
        except actuators.ActuatorError as exc:  # the rollback still drains the new version; an operator sees why
            record_event(
                rollout, "launch_failed", rollout.state, rollout.state, f"old version: {exc}", {"version": "old"}
            )
    return rollout


def _launch(rollout: Rollout, actuator, version, count: int, what: str, data: dict) -> None:
    """Start ``count`` replicas of ``version`` and record it; ActuatorError propagates (callers differ on it).

    Each batch is a launch like the autoscaler's: with the owner's row locked, it starts only what the tenant's
    quota has left now (the surge was checked when the rollout began, but a sibling endpoint may have taken the
    room since). What does not fit waits: the decision launches the shortfall again next tick, and the capped
    launch is an event saying which limit bound (once, not every tick it stays so), as a Deployment's rollout
    stalls on a ResourceQuota. A rollback's old-version launches are held to the quota the same way, while the
    new version's draining replicas still count against it."""
    view = version_endpoint(rollout.endpoint, version)
    undone_on_error = getattr(actuator, "launches_undone_on_error", contextlib.nullcontext)
    with undone_on_error(), transaction.atomic():
        allowed, notes = quota_allowance(rollout.endpoint, view, wanted=count, standby=False, per_tick_left=count)
        if allowed < count:
            message = f"started {allowed} of {count} {what}: {', '.join(notes)}; the rest wait for quota"
            last = rollout.events.filter(kind__in=("launch_capped", "launched")).order_by("-pk").first()
            # Once until something starts or the cap changes: a rollout waiting on a full quota asks again every
            # tick, and says so once.
            if not (last and last.kind == "launch_capped" and last.message == message):
                record_event(
                    rollout,
                    "launch_capped",
                    rollout.state,
                    rollout.state,
                    message,
                    {"wanted": count, "allowed": allowed, **data},
                )
        if allowed <= 0:
            return
        started = actuator.launch(view, allowed)
        record_event(
            rollout,
            "launched",
            rollout.state,
            rollout.state,
            f"started {allowed} {what}",
            {"replicas": [r.name for r in started], **data},
        )


def _config(rollout: Rollout) -> machine.RolloutConfig:
    return machine.RolloutConfig(
        strategy=rollout.strategy,
        canary_steps=tuple(rollout.canary_steps or ()),
        step_duration_s=float(rollout.step_duration_s),
        max_surge=rollout.max_surge,
        health_timeout_s=float(rollout.health_timeout_s),
        error_rate_margin=rollout.error_rate_margin,
        latency_burn_margin=rollout.latency_burn_margin,
        min_samples=rollout.min_samples,
    )


def _new_replicas(rollout: Rollout):
    return replicas_of(rollout.endpoint, rollout.to_version, current=None).filter(created_at__gte=rollout.created_at)


def _old_replicas(rollout: Rollout):
    return replicas_of(rollout.endpoint, rollout.from_version, current=rollout.from_version)


def _facts(rollout: Rollout, now: datetime) -> machine.RolloutFacts:
    warmed = set(rollout.warmed_replica_ids or ())
    new = list(_new_replicas(rollout).values("id", "name", "state", "failure_reason", "created_at"))
    old_states = list(_old_replicas(rollout).values_list("state", flat=True))
    waiting = [
        r["created_at"]
        for r in new
        if r["state"] in (ReplicaState.PENDING, ReplicaState.STARTING)
        or (r["state"] == ReplicaState.READY and r["id"] not in warmed)
    ]
    count = lambda states, s: sum(1 for x in states if x == s)  # noqa: E731
    new_states = [r["state"] for r in new]
    failures = tuple(
        f"{r['name']}: {r['failure_reason'] or 'failed'}"
        for r in new
        if r["state"] == ReplicaState.FAILED or (r["state"] == ReplicaState.STOPPED and r["failure_reason"])
    )
    canary = baseline = machine.VersionStats()
    if rollout.state == RolloutState.SHIFTING and rollout.step_started_at is not None:
        stats = version_stats(endpoint=rollout.endpoint, since=rollout.step_started_at)
        canary = stats.get(rollout.to_version_id, canary)
        baseline = stats.get(rollout.from_version_id, baseline)
    return machine.RolloutFacts(
        state=rollout.state,
        now=now.timestamp(),
        state_since=rollout.state_changed_at.timestamp(),
        traffic_percent=rollout.traffic_percent,
        step_index=rollout.step_index,
        step_started_at=rollout.step_started_at.timestamp() if rollout.step_started_at else None,
        baseline_ready=rollout.baseline_ready,
        new_starting=count(new_states, ReplicaState.PENDING) + count(new_states, ReplicaState.STARTING),
        new_ready=sum(1 for r in new if r["state"] == ReplicaState.READY and r["id"] not in warmed),
        new_warmed=sum(1 for r in new if r["state"] == ReplicaState.READY and r["id"] in warmed),
        new_draining=count(new_states, ReplicaState.DRAINING),
        new_waiting_since=min(waiting).timestamp() if waiting else None,
        new_failures=failures,
        old_ready=count(old_states, ReplicaState.READY),
        old_draining=count(old_states, ReplicaState.DRAINING),
        old_starting=count(old_states, ReplicaState.PENDING) + count(old_states, ReplicaState.STARTING),
        canary=canary,
        baseline=baseline,
    )


def _record(rollout: Rollout, facts: machine.RolloutFacts, decision: machine.Decision, now: datetime) -> bool:
    """Store the decision if the row still holds what it was based on (compare-and-set); events and the
    endpoint's serving version change in the same transaction."""
    changes: dict = {}
    if decision.state != rollout.state:
        changes.update(state=decision.state, state_changed_at=now)
    if decision.traffic_percent != rollout.traffic_percent:
        changes["traffic_percent"] = decision.traffic_percent
    if decision.step_index != rollout.step_index:
        changes["step_index"] = decision.step_index
    if decision.new_step:
        changes["step_started_at"] = now
    if decision.kind and decision.reason and decision.state != RolloutState.ROLLED_BACK:
        changes["reason"] = decision.reason[:500]  # a rolled-back rollout keeps saying why it was rolled back
    if rollout.started_at is None and decision.state != RolloutState.PENDING:
        changes["started_at"] = now
    if decision.state in FINAL_STATES:
        changes["finished_at"] = now
    if not changes and not decision.kind:
        return True
    with transaction.atomic():
        updated = Rollout.objects.filter(pk=rollout.pk, state=rollout.state, updated_at=rollout.updated_at).update(
            **changes, updated_at=now
        )
        if not updated:
            return False
        before = rollout.state
        for name, value in changes.items():
            setattr(rollout, name, value)
        rollout.updated_at = now
        if decision.kind:
            record_event(rollout, decision.kind, before, decision.state, decision.reason, _facts_data(facts))
        if decision.state == RolloutState.PROMOTING and before != RolloutState.PROMOTING:
            mirror_version(rollout.endpoint, rollout.to_version)
        if decision.state == RolloutState.ROLLING_BACK and before != RolloutState.ROLLING_BACK:
            audit_rollout(
                None,
                "rollout.rollback",
                rollout.endpoint,
                {"rollout": rollout.pk, "reason": decision.reason, "automatic": True},
            )
        if "traffic_percent" in changes or "state" in changes:
            transaction.on_commit(bump_proxies)
    return True


def _facts_data(facts: machine.RolloutFacts) -> dict:
    return {
        "new": {
            "starting": facts.new_starting,
            "ready": facts.new_ready,
            "warmed": facts.new_warmed,
            "draining": facts.new_draining,
            "failures": list(facts.new_failures),
        },
        "old": {"ready": facts.old_ready, "draining": facts.old_draining, "starting": facts.old_starting},
        "canary": vars(facts.canary)
        | {"error_rate": round(facts.canary.error_rate, 4), "latency_burn": round(facts.canary.latency_burn, 4)},
        "baseline": vars(facts.baseline)
        | {"error_rate": round(facts.baseline.error_rate, 4), "latency_burn": round(facts.baseline.latency_burn, 4)},
    }


def _drain(rollout: Rollout, actuator, *, old: bool, count: int | None = None) -> None:
    """Stop routing to one version's replicas through the autoscaler's drain path (in-flight requests finish).

    ``count``: drain only that many of its ready replicas (a batch of a rolling replacement; oldest first) and
    leave its booting ones alone; None: all of them, booting ones stopped at once."""
    replicas = _old_replicas(rollout) if old else _new_replicas(rollout)
    label = f"rollout {rollout.pk}: " + ("replaced by the new version" if old else "rolled back")
    ready = replicas.filter(state=ReplicaState.READY).order_by("created_at", "id")
    for replica in ready[:count] if count is not None else ready:
        if actuator.move(replica, ReplicaState.DRAINING, label):
            record_event(
                rollout,
                "drain",
                rollout.state,
                rollout.state,
                f"draining {replica.name}",
                {"replica": replica.pk, "version": "old" if old else "new"},
            )
    if count is not None:
        return
    booting = list(replicas.filter(state__in=[ReplicaState.PENDING, ReplicaState.STARTING]))
    if booting:
        actuator.terminate(booting, reason=label)
    standby_versions = [rollout.from_version_id] if old else [rollout.to_version_id]
    standbys = list(
        Replica.objects.filter(endpoint=rollout.endpoint, is_standby=True, version_id__in=standby_versions).exclude(
            state__in=[ReplicaState.STOPPED]
        )
    )
    if standbys:
        actuator.terminate(standbys, reason=label)


def _warm_up(rollout: Rollout) -> None:
    """One short completion on each healthy new replica before it may take traffic (loads kernels, fills caches)."""
    if rollout.state not in (RolloutState.SURGING, RolloutState.SHIFTING):
        return
    warmed = list(rollout.warmed_replica_ids or ())
    fresh = _new_replicas(rollout).filter(state=ReplicaState.READY).exclude(pk__in=warmed)
    added = []
    for replica in fresh:
        ok, detail = warm_up_request(replica.url, model=rollout.endpoint.name)
        if ok:
            added.append(replica.pk)
        record_event(
            rollout,
            "warm_up",
            rollout.state,
            rollout.state,
            f"{replica.name}: warm-up {'passed' if ok else 'failed'}{': ' + detail if detail else ''}",
            {"replica": replica.pk, "ok": ok},
        )
    if added:
        rollout.warmed_replica_ids = warmed + added
        Rollout.objects.filter(pk=rollout.pk).update(warmed_replica_ids=rollout.warmed_replica_ids)


def warm_up_request(url: str, *, model: str, timeout_s: float = WARMUP_TIMEOUT_S) -> tuple[bool, str]:
    body = {"model": model, "prompt": "warm-up", "max_tokens": 1, "temperature": 0}
    try:
        response = httpx.post(f"{url.rstrip('/')}/v1/completions", json=body, timeout=timeout_s)
    except httpx.HTTPError as exc:
        return False, f"{type(exc).__name__}: {exc}"[:200]
    if response.status_code != 200:
        return False, f"HTTP {response.status_code}"
    return True, ""
