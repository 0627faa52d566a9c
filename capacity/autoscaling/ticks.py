"""The autoscaler's decisions: one tick per endpoint and axis, and the inputs each policy reads.

Each tick: take the (axis, endpoint) lock in Redis, skip if the tick's decision already exists (a redelivered
task), gather inputs, run the pure policy, store an ``AutoscalerDecision`` with inputs and reason, then act through
``capacity.autoscaling.services`` (reconcile). The unique (endpoint, axis, tick) constraint is the last guard: a
second writer gets IntegrityError and stops.

Sources: demand from the proxies' Redis reports; replica counts from ``Replica`` rows; the predictive floor's
history from the per-minute usage rollups (``billing.UsageMinute``: requests per minute, a day back); the
split between on-demand and spot from ``capacity.autoscaling.spot``. The vertical tick (per-replica concurrency,
from the replicas' own ``/metrics``) is ``capacity.autoscaling.vertical_ticks``, re-exported here.
"""

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import Max, Min
from django.utils import timezone

from capacity.autoscaling import horizontal, pins, spot, store, tick_reads
from capacity.autoscaling.demand import DemandSample
from capacity.autoscaling.limits import QuotaLeft, quota_ceiling
from capacity.autoscaling.prefill_ticks import prefill_decision
from capacity.autoscaling.services import (
    ACTIVE,
    SUSPENDED_REASON,
    actuator_or_none,
    defrag_copy_states,
    finish_drains,
    owner_suspended,
    reconcile,
    safe_call,
    serving_role,
)
from capacity.autoscaling.tick_reads import TickReads, predicted_floor
from capacity.autoscaling.vertical_ticks import vertical_tick, vertical_ticks  # noqa: F401 - both axes through one module
from capacity.models import AutoscalerDecision
from capacity.unit_resolver import endpoint_coefficients
from capacity.units import REFERENCE_REQUEST, MUCoefficients, estimate_request_mu
from endpoints.models import Endpoint, ReplicaState, ServingMode

log = logging.getLogger(__name__)


HORIZONTAL = AutoscalerDecision.Axis.HORIZONTAL


# -- horizontal ---------------------------------------------------------------------------------------------
def horizontal_tick(*, endpoint_id: int, tick: str, now: float | None = None) -> AutoscalerDecision | None:
    """Decide and apply the replica count for one endpoint (a wake-up: the activator, an interruption notice); None
    when another worker owns this tick, or when Redis (lock, demand window) cannot be reached: no decision then,
    rather than one on a demand read as zero."""
    return horizontal_ticks(endpoint_ids=[endpoint_id], tick=tick, now=now).get(endpoint_id)


def horizontal_ticks(*, endpoint_ids, tick: str, now: float | None = None) -> dict[int, AutoscalerDecision | None]:
    """The horizontal tick for a batch of endpoints (the beat's shards): one batch of reads (``tick_reads``), the
    pure policy per endpoint, the decisions written together, and the actuators called only where an endpoint's
    replicas must change (docs/architecture.md#the-horizontal-tick-at-fleet-scale). Endpoints another worker holds,
    or already decided for this tick, are left out."""
    try:
        return _horizontal_ticks(list(dict.fromkeys(endpoint_ids)), tick=tick, now=now)
    except store.RedisError as exc:
        log.warning("autoscaler: horizontal tick %s for %d endpoints skipped: Redis: %s", tick, len(endpoint_ids), exc)
        return {}


@dataclass
class _Plan:
    """One endpoint's decision before it is stored; ``steady``: its replicas already match, nothing to call."""

    endpoint: Endpoint
    actuator: object | None
    decision: horizontal.HorizontalDecision
    pinned: pins.PinState
    steady: bool


def _horizontal_ticks(ids: list[int], *, tick: str, now: float | None) -> dict[int, AutoscalerDecision | None]:
    with store.TickLocks(axis=HORIZONTAL, endpoint_ids=ids) as locks:
        todo = set(locks.held) - _decided_many(locks.held, HORIZONTAL, tick)
        endpoints = list(
            Endpoint.objects.filter(pk__in=todo).select_related("owner_tenant", "hardware_profile").order_by("pk")
        )
        now = time.time() if now is None else now
        actuators = {e.pk: actuator_or_none(e) for e in endpoints}
        for endpoint in endpoints:
            if actuators[endpoint.pk] is not None:
                safe_call(actuators[endpoint.pk].sync, endpoint)
        reads = TickReads(endpoints, now=now)
        plans = [_plan(e, actuators[e.pk], reads, now=now) for e in endpoints]
        rows = _store_plans(plans, tick=tick, now=now)
        for plan in plans:
            row = rows.get(plan.endpoint.pk)
            if row is None or plan.steady:
                continue
            try:
                _apply(plan, row, rollout=plan.endpoint.pk in reads.rollouts, tick=tick, now=now)
            except Exception:
                if len(plans) == 1:
                    raise
                # One endpoint's failure (its actuator, a lock timeout) must not cost the batch's others their tick.
                log.exception("autoscaler: applying tick %s to endpoint %s failed", tick, plan.endpoint.pk)
        return rows


def _plan(endpoint: Endpoint, actuator, reads: TickReads, *, now: float) -> _Plan:
    pin = reads.pins.get(endpoint.pk)
    if pin is None:
        pinned = pins.PinState()
    elif pin.until.timestamp() > now:
        pinned = pins.PinState(pin=pin)
    else:
        pinned = pins.pin_state(endpoint, now=now)  # ran out: deleted and audited there
    moving = defrag_copy_states(endpoint, actuator) if actuator is not None else []
    inputs, capped_by = _inputs(endpoint, reads, now=now, moving=moving)
    decision = horizontal.decide(inputs)
    if capped_by and _quota_binds(decision, endpoint):
        decision = horizontal.HorizontalDecision(
            current=decision.current,
            desired=decision.desired,
            reason=f"{decision.reason}; {capped_by} (max_replicas {endpoint.max_replicas})",
            inputs={**decision.inputs, "quota_ceiling": inputs.max_replicas},
        )
    if not owner_suspended(endpoint):  # a suspension holds the endpoint at zero, pin or not
        decision = pins.pinned_decision(
            decision, pinned, min_replicas=inputs.min_replicas, max_replicas=inputs.max_replicas
        )
    steady = actuator is not None and _converged(endpoint, actuator, reads, desired=decision.desired)
    return _Plan(endpoint, actuator, decision, pinned, steady)


def _converged(endpoint: Endpoint, actuator, reads: TickReads, *, desired: int) -> bool:
    """Whether ``reconcile`` would find nothing to do: the count unchanged, as many serving replicas as desired and
    standbys as the warm pool, none draining or under notice, and none of the cases reconcile treats apart (a spot
    pool, a prefill pool, a rollout, a suspended owner)."""
    if (
        desired != endpoint.desired_replicas
        or endpoint.spot_hardware_profile_id is not None
        or endpoint.serving_mode == ServingMode.DISAGGREGATED
        or endpoint.pk in reads.rollouts
        or owner_suspended(endpoint)
    ):
        return False
    rows = reads.replicas.get(endpoint.pk, [])
    if any(r.state == ReplicaState.DRAINING or r.terminate_at is not None for r in rows):
        return False
    role = serving_role(endpoint)
    serving = [r for r in reads.serving(endpoint) if r.state in ACTIVE and not r.is_standby]
    if len(serving) != desired or any(r.role != role for r in serving):
        return False
    if not getattr(actuator, "supports_standby", True):
        return True
    standby = [r for r in rows if r.is_standby and r.actuator == actuator.name]
    return len(standby) == endpoint.warm_pool_size and all(r.role == role for r in standby)


def _store_plans(plans: list[_Plan], *, tick: str, now: float) -> dict[int, AutoscalerDecision | None]:
    """Every plan's decision in one insert; a steady one is stored applied, with no actions. Should another worker
    have stored one meanwhile (the unique tick constraint), each is stored alone and that endpoint skipped."""
    at = datetime.fromtimestamp(now, tz=UTC)
    rows = [
        AutoscalerDecision(
            endpoint=p.endpoint,
            axis=HORIZONTAL,
            tick=tick,
            current=p.decision.current,
            desired=p.decision.desired,
            reason=p.decision.reason[:255],
            inputs={**p.decision.inputs, "actions": []} if p.steady else p.decision.inputs,
            applied=p.steady,
            at=at,
        )
        for p in plans
    ]
    try:
        with transaction.atomic():
            AutoscalerDecision.objects.bulk_create(rows)
        return {row.endpoint_id: row for row in rows}
    except IntegrityError:
        stored = {}
        for p, row in zip(plans, rows, strict=True):
            stored[p.endpoint.pk] = _store(
                p.endpoint, HORIZONTAL, tick, row.current, row.desired, row.reason, row.inputs, at=now
            )
            if stored[p.endpoint.pk] is not None and p.steady:
                AutoscalerDecision.objects.filter(pk=stored[p.endpoint.pk].pk).update(applied=True)
        return stored


def _apply(plan: _Plan, row: AutoscalerDecision, *, rollout: bool, tick: str, now: float) -> AutoscalerDecision:
    """Apply one endpoint's stored decision: its count (and spot split) on the endpoint's row, its prefill pool's
    decision, then ``reconcile``; the actions go on the decision."""
    endpoint, actuator, decision = plan.endpoint, plan.actuator, plan.decision
    if rollout:
        # The rollout owns the replicas until it ends: record what demand asked for, change nothing, and keep
        # the decision out of the cooldowns (they read applied decisions only).
        actions = finish_drains(endpoint=endpoint, actuator=actuator) if actuator is not None else []
        row.inputs = {**row.inputs, "actions": actions + ["rollout in progress: not applied"]}
        row.save(update_fields=["inputs"])
        return row
    desired, desired_spot = decision.desired, 0
    split = spot_split(endpoint, decision.desired, now=now)
    if split is not None:
        desired, desired_spot = split.on_demand + split.spot, split.spot
        row.inputs = {**row.inputs, "spot": spot_record(split)}
    with transaction.atomic():
        # The endpoint's row, as an operator's scale takes it: a scale that landed while this tick decided wins
        # (its pin is newer than the one read above) and this tick converges on its count instead.
        current = Endpoint.objects.select_for_update().values("desired_replicas", "desired_spot_replicas")
        row_now = current.get(pk=endpoint.pk)
        if pins.pin_stamp(endpoint.pk) != plan.pinned.stamp:
            desired, desired_spot = row_now["desired_replicas"], row_now["desired_spot_replicas"]
            row.reason = f"{row.reason}; an operator scaled meanwhile: {desired} kept"[:255]
        elif (desired, desired_spot) != (row_now["desired_replicas"], row_now["desired_spot_replicas"]):
            Endpoint.objects.filter(pk=endpoint.pk).update(
                desired_replicas=desired, desired_spot_replicas=desired_spot
            )
    endpoint.desired_replicas, endpoint.desired_spot_replicas = desired, desired_spot
    # A disaggregated endpoint's prefill pool: decided here, under this lock, so one reconcile converges both.
    prefill_row = prefill_decision(endpoint, tick=tick, now=now, store_row=_store)
    actions = reconcile(endpoint=endpoint) if actuator is not None else ["no actuator"]
    for decided in (row, prefill_row):
        if decided is None:
            continue
        decided.applied = actuator is not None
        prefill_side = decided is prefill_row
        own = [a for a in actions if a.startswith("prefill: ") == prefill_side]
        decided.inputs = {**decided.inputs, "actions": own}
        capped = [action for action in own if "capped" in action]
        if capped:
            decided.reason = "; ".join([decided.reason, *capped])[:255]
        decided.save(update_fields=["applied", "inputs", "reason"])
    return row


def scale_apply(*, endpoint_id: int, decision_id: int | None = None) -> list[str] | None:
    """Converge an endpoint on its desired count at once after an operator's scale, under the horizontal tick's lock;
    the actions go on the scale's decision. None while a tick holds the lock (the task retries; that tick reads the
    pin too)."""
    with store.TickLock(axis=HORIZONTAL, endpoint_id=endpoint_id) as lock:
        if not lock.held:
            return None
        endpoint = Endpoint.objects.select_related("owner_tenant").filter(pk=endpoint_id).first()
        if endpoint is None:
            return []
        actions = ["no actuator"] if actuator_or_none(endpoint) is None else reconcile(endpoint=endpoint)
        decision = AutoscalerDecision.objects.filter(pk=decision_id, endpoint_id=endpoint_id).first()
        if decision is not None:
            decision.inputs = {**decision.inputs, "actions": actions}
            decision.save(update_fields=["inputs"])
        return actions


def _quota_binds(decision: horizontal.HorizontalDecision, endpoint: Endpoint) -> bool:
    """Whether the tenant quota's ceiling, not the endpoint's own max, decided this tick's count."""
    ceiling = decision.inputs.get("max_replicas", endpoint.max_replicas)
    if ceiling >= endpoint.max_replicas or decision.desired != ceiling:
        return False
    wanted = max(decision.inputs.get("up_need", 0), decision.inputs.get("floor", 0), endpoint.min_replicas)
    return wanted > ceiling or decision.current > ceiling


def sample_demand(*, endpoint_id: int, now: float | None = None) -> list[DemandSample]:
    """Sum the proxies' fresh demand reports into one sample, append it to the endpoint's window, return the window.

    The beat's sampler does this for every autoscaled endpoint each second (``tick_reads.append_samples``); each
    decision tick appends one more."""
    now = time.time() if now is None else now
    tick_reads.append_samples([endpoint_id], now=now)
    raws = store.client().lrange(store.SAMPLES_KEY.format(endpoint_id=endpoint_id), 0, -1)
    return tick_reads.parse_window(raws)


def horizontal_inputs(endpoint: Endpoint, *, now: float) -> horizontal.HorizontalInputs:
    """The policy's inputs for one endpoint, as its tick reads them (this tick's demand sample appended)."""
    return _inputs(endpoint, TickReads([endpoint], now=now), now=now)[0]


def _inputs(
    endpoint: Endpoint, reads: TickReads, *, now: float, moving: list[str] | None = None
) -> tuple[horizontal.HorizontalInputs, str]:
    """The policy's inputs, with max replicas lowered to what the owner's quota has left (and why, when it is).
    ``moving``: the states of copies a defragmenting move is loading (``defrag_copy_states``), which replace their
    sources rather than add capacity."""
    ceiling, capped_by = quota_ceiling(
        max_replicas=endpoint.max_replicas,
        left=reads.quota_left.get(endpoint.pk, QuotaLeft()),
        gpus_per_replica=max(1, int(getattr(endpoint.hardware_profile, "gpus_per_replica", 1) or 1)),
    )
    if owner_suspended(endpoint):
        ceiling, capped_by = 0, SUSPENDED_REASON
    # A noticed replica (terminate_at) may serve on for a while, but it is not capacity: its replacement is due now.
    # A disaggregated endpoint's decode pool (its prefill pool is ``prefill_ticks``' own decision).
    role = serving_role(endpoint)
    replicas = [
        r.state
        for r in reads.serving(endpoint)
        if r.role == role and r.state in ACTIVE and not r.is_standby and r.terminate_at is None
    ]
    for state in moving or []:
        if state in replicas:
            replicas.remove(state)
    ready = sum(1 for s in replicas if s == ReplicaState.READY)
    # The spot margin the last split added (replicas at risk, the safeguard) is not capacity the policy may count
    # on: counted, every hold would add it again (docs/algorithms.md#spot-capacity).
    margin = min(_last_spot_extra(endpoint), len(replicas))
    booting = len(replicas) - ready
    ready -= max(0, margin - booting)
    replicas = replicas[: len(replicas) - margin]
    floor, _ = predicted_floor(reads.floors.get(endpoint.pk), concurrency_limit=endpoint.concurrency_limit, now=now)
    inputs = horizontal.HorizontalInputs(
        now=now,
        samples=reads.windows.get(endpoint.pk, []),
        ready=ready,
        starting=len(replicas) - ready,
        min_replicas=min(endpoint.min_replicas, ceiling),
        max_replicas=ceiling,
        target_concurrency=float(max(1, endpoint.concurrency_limit)),  # 0 slips past the model's validator in SQL
        mu_capacity_per_replica=mu_capacity_for(endpoint, reads.coefficients.get(endpoint.pk)),
        provisioned_concurrency=endpoint.provisioned_concurrency,
        scale_to_zero=endpoint.scale_to_zero,
        predicted_floor=floor,
        last_scale_up_at=reads.last_up.get(endpoint.pk),
        last_scale_down_at=reads.last_down.get(endpoint.pk),
        # No fresh report with a live proxy: it has not served this endpoint since it started (zero demand). No
        # report and no live proxy: unknown demand (proxies down or cut off from Redis), which removes nothing.
        demand_reported=reads.fresh.get(endpoint.pk, 0) > 0 or reads.proxies_alive,
    )
    return inputs, capped_by


SPOT_REPLACE_S = 120.0  # notice → replacement serving: a cold start (the local actuator's vLLM takes ~70 s)


SPOT_FLOOR_WINDOW_S = 3 * 3600.0


def spot_split(endpoint: Endpoint, desired: int, *, now: float) -> spot.SpotTargets | None:
    """The policy's count split between on-demand and the endpoint's spot pool (``spot.SpotPlanner``), or None
    without a pool. The on-demand floor is half the least count of the last three hours' decisions; a refused spot
    launch (``store.spot_unavailable``) puts the whole count on on-demand for the back-off."""
    pool = endpoint.spot_hardware_profile
    if pool is None:
        return None
    planner = spot.SpotPlanner(
        spot.SpotConfig(
            reclaims_per_replica_day=pool.preemptions_per_replica_day,
            replace_s=SPOT_REPLACE_S,
            floor_window_s=SPOT_FLOOR_WINDOW_S,
        )
    )
    if store.spot_unavailable(endpoint.pk):
        planner.unavailable_until = now + 1.0
    since = datetime.fromtimestamp(now - SPOT_FLOOR_WINDOW_S, tz=UTC)
    least = (
        AutoscalerDecision.objects.filter(endpoint=endpoint, axis=HORIZONTAL, at__gte=since)
        .aggregate(least=Min("desired"))
        .get("least")
    )
    return planner.targets(desired, now, trailing_min=desired if least is None else min(least, desired))


def spot_record(split: spot.SpotTargets) -> dict:
    return {
        "on_demand": split.on_demand,
        "spot": split.spot,
        "floor": split.floor,
        "extra": split.extra,
        "reason": split.reason,
    }


def _last_spot_extra(endpoint: Endpoint) -> int:
    if endpoint.spot_hardware_profile_id is None:
        return 0
    inputs = (
        AutoscalerDecision.objects.filter(endpoint=endpoint, axis=HORIZONTAL)
        .order_by("-at")
        .values_list("inputs", flat=True)
        .first()
    )
    return int(((inputs or {}).get("spot") or {}).get("extra", 0))


def mu_capacity_for(endpoint: Endpoint, coeffs: MUCoefficients | None = None) -> float | None:
    """In-flight MU one replica holds at the endpoint's concurrency limit: that many reference requests priced with
    the endpoint's MU coefficients (the ones its proxies price demand with; ``coeffs`` when already read). None
    when they cannot be resolved: the horizontal policy then scales on requests."""
    try:
        coeffs = coeffs or endpoint_coefficients(endpoint)
        reference = estimate_request_mu(coeffs, prompt_tokens=REFERENCE_REQUEST[0], max_tokens=REFERENCE_REQUEST[1])
        return horizontal.mu_capacity_per_replica(float(endpoint.concurrency_limit), reference)
    except (ValueError, AttributeError) as exc:
        log.warning("endpoint %s: no MU capacity (%s); scaling on requests", endpoint.pk, exc)
        return None


def predicted_floor_for(endpoint: Endpoint, *, now: float) -> tuple[int, dict]:
    """The predictive floor from per-minute request counts of the usage rollups (yesterday and the last minutes)."""
    rows = tick_reads.floor_rows([endpoint.pk], now=now).get(endpoint.pk)
    return predicted_floor(rows, concurrency_limit=endpoint.concurrency_limit, now=now)


def decisions_prune(*, keep_days: int = 14, batch: int = 5000) -> int:
    """Delete decisions older than ``keep_days`` in batches (a tick every 5 s is 17,280 rows per endpoint a day).

    The newest applied decision of each axis per endpoint is kept whatever its age: the scale-down delay and the
    vertical streaks are read from it."""
    cutoff = timezone.now() - timedelta(days=keep_days)
    keep = set(
        AutoscalerDecision.objects.filter(applied=True)
        .values("endpoint", "axis")
        .annotate(last=Max("id"))
        .values_list("last", flat=True)
    )
    deleted = 0
    while True:
        ids = list(
            AutoscalerDecision.objects.filter(at__lt=cutoff).exclude(id__in=keep).values_list("id", flat=True)[:batch]
        )
        if not ids:
            return deleted
        deleted += AutoscalerDecision.objects.filter(id__in=ids).delete()[0]


# -- shared -----------------------------------------------------------------------------------------------
def _decided_many(endpoint_ids, axis: str, tick: str) -> set[int]:
    if not endpoint_ids:
        return set()
    decided = AutoscalerDecision.objects.filter(endpoint_id__in=endpoint_ids, axis=axis, tick=tick)
    return set(decided.values_list("endpoint_id", flat=True))


def _store(
    endpoint, axis, tick, current, desired, reason, inputs, at: float | None = None
) -> AutoscalerDecision | None:
    # Stamped with the tick's own clock: the scale-down delay and cooldown compare the next tick's ``now`` with it
    # (with the row's save time instead, an injected clock saw every earlier move as long past).
    stamp = {} if at is None else {"at": datetime.fromtimestamp(at, tz=UTC)}
    try:
        with transaction.atomic():
            return AutoscalerDecision.objects.create(
                endpoint=endpoint,
                axis=axis,
                tick=tick,
                current=current,
                desired=desired,
                reason=reason[:255],
                inputs=inputs,
                **stamp,
            )
    except IntegrityError:
        log.info("autoscaler: %s decision for endpoint %s tick %s already stored", axis, endpoint.pk, tick)
        return None
