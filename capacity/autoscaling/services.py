"""One decision tick per endpoint and axis, and the reconcile loop that makes replicas match the decision.

Each tick: take the (axis, endpoint) lock in Redis, skip if the tick's decision already exists (a redelivered
task), gather inputs, run the pure policy, store an ``AutoscalerDecision`` with inputs and reason, then act.
The unique (endpoint, axis, tick) constraint is the last guard: a second writer gets IntegrityError and stops.

Sources: demand from the proxies' Redis reports; replica counts from ``Replica`` rows; the predictive floor's
history from the per-minute usage rollups (``billing.UsageMinute``: requests per minute, a day back); the
vertical policy's p95s, KV usage and queue from the replicas' own ``/metrics`` histograms, diffed per cycle.
"""

import copy
import logging
import math
import time
from datetime import UTC, datetime, timedelta

import httpx
from celery import signature
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import F, Max, Min, Q, Sum
from django.utils import timezone

from billing.models import UsageMinute
from capacity.autoscaling import horizontal, pins, predictive, replica_metrics, spot, store, vertical
from capacity.autoscaling.actuators import ActuatorError, get_actuator
from capacity.autoscaling.demand import DemandSample, sum_fresh_reports
from capacity.autoscaling.limits import QuotaLeft, launch_allowance, quota_ceiling
from capacity.models import AutoscalerDecision, HardwareProfile
from capacity.unit_resolver import endpoint_coefficients
from capacity.units import REFERENCE_REQUEST, estimate_request_mu
from endpoints.models import ROLLOUT_ACTIVE_STATES, Endpoint, Replica, ReplicaState, Rollout
from tenants.models import Tenant
from tenants.quotas import live_usage, lock_tenant, quota_for
from tenants.services import audit_log

log = logging.getLogger(__name__)

HORIZONTAL = AutoscalerDecision.Axis.HORIZONTAL
VERTICAL = AutoscalerDecision.Axis.VERTICAL
ACTIVE = (ReplicaState.PENDING, ReplicaState.STARTING, ReplicaState.READY)
DRAIN_GRACE_S = 2.0  # the proxies' snapshots stop routing to a draining replica within a second
DRAIN_TIMEOUT_S = 120.0  # a stream still running after this is cut: the replica must go eventually
DEFAULT_SECONDS_PER_REQUEST = 10.0
PREDICTIVE = predictive.PredictiveConfig()
# Launch caps whatever demand or a bad setting asks: per endpoint in one reconcile, and for the whole fleet in one
# horizontal tick window (a shared Redis counter), so one tick can never start hundreds of replicas.
DEFAULT_MAX_LAUNCHES_PER_TICK = 8
DEFAULT_MAX_FLEET_LAUNCHES_PER_TICK = 32
TICK_WINDOW_S = 5.0  # workers.tasks.autoscaling.HORIZONTAL_S


def _limit(name: str, default: int) -> int:
    return int(getattr(settings, "INFERCAP", {}).get(name, default))


# -- horizontal ---------------------------------------------------------------------------------------------
def horizontal_tick(*, endpoint_id: int, tick: str, now: float | None = None) -> AutoscalerDecision | None:
    """Decide and apply the replica count for one endpoint; None when another worker owns this tick, or when Redis
    (lock, demand window) cannot be reached: no decision then, rather than one on a demand read as zero."""
    try:
        return _horizontal_tick(endpoint_id=endpoint_id, tick=tick, now=now)
    except store.RedisError as exc:
        log.warning("autoscaler: horizontal tick %s for endpoint %s skipped: Redis: %s", tick, endpoint_id, exc)
        return None


def _horizontal_tick(*, endpoint_id: int, tick: str, now: float | None) -> AutoscalerDecision | None:
    with store.TickLock(axis=HORIZONTAL, endpoint_id=endpoint_id) as lock:
        if not lock.held or _decided(endpoint_id, HORIZONTAL, tick):
            return None
        endpoint = Endpoint.objects.filter(pk=endpoint_id).first()
        if endpoint is None:
            return None
        now = time.time() if now is None else now
        actuator = _actuator_or_none(endpoint)
        if actuator is not None:
            _safe(actuator.sync, endpoint)
        pinned = pins.pin_state(endpoint, now=now)
        inputs, capped_by = _horizontal_inputs(endpoint, now=now)
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
        row = _store(
            endpoint, HORIZONTAL, tick, decision.current, decision.desired, decision.reason, decision.inputs, at=now
        )
        if row is None:
            return None
        if _rollout_active(endpoint):
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
            if pins.pin_stamp(endpoint.pk) != pinned.stamp:
                desired, desired_spot = row_now["desired_replicas"], row_now["desired_spot_replicas"]
                row.reason = f"{row.reason}; an operator scaled meanwhile: {desired} kept"[:255]
            elif (desired, desired_spot) != (row_now["desired_replicas"], row_now["desired_spot_replicas"]):
                Endpoint.objects.filter(pk=endpoint.pk).update(
                    desired_replicas=desired, desired_spot_replicas=desired_spot
                )
        endpoint.desired_replicas, endpoint.desired_spot_replicas = desired, desired_spot
        actions = reconcile(endpoint=endpoint) if actuator is not None else ["no actuator"]
        row.applied = actuator is not None
        row.inputs = {**row.inputs, "actions": actions}
        capped = [action for action in actions if "capped" in action]
        if capped:
            row.reason = "; ".join([row.reason, *capped])[:255]
        row.save(update_fields=["applied", "inputs", "reason"])
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
        actions = ["no actuator"] if _actuator_or_none(endpoint) is None else reconcile(endpoint=endpoint)
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

    Runs every second from beat (``autoscale.sample_demand``) and once more at each decision tick."""
    return _sample_demand(endpoint_id=endpoint_id, now=time.time() if now is None else now)[0]


def _sample_demand(*, endpoint_id: int, now: float) -> tuple[list[DemandSample], int]:
    """The window after this sample, and how many proxy reports were fresh for it."""
    sample, fresh = sum_fresh_reports(store.demand_reports(endpoint_id), now=now)
    if store.woken(endpoint_id) and sample.requests == 0:
        sample = DemandSample(t=now, queued=1)  # the activator saw a request waiting for a first replica
    window = []
    for s in store.push_sample(endpoint_id, sample.__dict__):
        try:
            window.append(
                DemandSample(**{k: float(v) for k, v in s.items() if k in DemandSample.__dataclass_fields__})
            )
        except (TypeError, ValueError, AttributeError):
            continue  # a corrupt stored sample is skipped, not a crashed tick
    return window, fresh


def horizontal_inputs(endpoint: Endpoint, *, now: float) -> horizontal.HorizontalInputs:
    return _horizontal_inputs(endpoint, now=now)[0]


def _horizontal_inputs(endpoint: Endpoint, *, now: float) -> tuple[horizontal.HorizontalInputs, str]:
    """The policy's inputs, with max replicas lowered to what the owner's quota has left (and why, when it is)."""
    ceiling, capped_by = quota_ceiling(
        max_replicas=endpoint.max_replicas,
        left=quota_left(endpoint, exclude_own_serving=True),
        gpus_per_replica=_gpus_per_replica(endpoint),
    )
    if owner_suspended(endpoint):
        ceiling, capped_by = 0, SUSPENDED_REASON
    window, fresh = _sample_demand(endpoint_id=endpoint.pk, now=now)
    # A noticed replica (terminate_at) may serve on for a while, but it is not capacity: its replacement is due now.
    serving = serving_replicas(endpoint).filter(state__in=ACTIVE, is_standby=False, terminate_at__isnull=True)
    replicas = list(serving.values_list("state", flat=True))
    ready = sum(1 for s in replicas if s == ReplicaState.READY)
    # The spot margin the last split added (replicas at risk, the safeguard) is not capacity the policy may count
    # on: counted, every hold would add it again (docs/algorithms.md#spot-capacity).
    margin = min(_last_spot_extra(endpoint), len(replicas))
    booting = len(replicas) - ready
    ready -= max(0, margin - booting)
    replicas = replicas[: len(replicas) - margin]
    floor, _ = predicted_floor_for(endpoint, now=now)
    last_up, last_down = _last_moves(endpoint)
    inputs = horizontal.HorizontalInputs(
        now=now,
        samples=window,
        ready=ready,
        starting=len(replicas) - ready,
        min_replicas=min(endpoint.min_replicas, ceiling),
        max_replicas=ceiling,
        target_concurrency=float(max(1, endpoint.concurrency_limit)),  # 0 slips past the model's validator in SQL
        mu_capacity_per_replica=mu_capacity_for(endpoint),
        provisioned_concurrency=endpoint.provisioned_concurrency,
        scale_to_zero=endpoint.scale_to_zero,
        predicted_floor=floor,
        last_scale_up_at=last_up,
        last_scale_down_at=last_down,
        # No fresh report with a live proxy: it has not served this endpoint since it started (zero demand). No
        # report and no live proxy: unknown demand (proxies down or cut off from Redis), which removes nothing.
        demand_reported=fresh > 0 or store.proxies_alive(),
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


def quota_left(endpoint: Endpoint, *, exclude_own_serving: bool) -> QuotaLeft:
    """What the endpoint's owner may still start (nothing is left out for a shared endpoint: no quota)."""
    if endpoint.owner_tenant_id is None:
        return QuotaLeft()
    quota = quota_for(endpoint.owner_tenant)
    usage = live_usage(endpoint.owner_tenant_id, exclude_serving_of=endpoint.pk if exclude_own_serving else None)
    return QuotaLeft(
        serving=quota.max_replicas - usage.serving_replicas,
        standby=quota.max_warm_pool - usage.standby_replicas,
        gpus=quota.max_gpus - usage.gpus,
    )


def _gpus_per_replica(endpoint: Endpoint) -> int:
    value = (
        HardwareProfile.objects.filter(pk=endpoint.hardware_profile_id)
        .values_list("gpus_per_replica", flat=True)
        .first()
    )
    return max(1, int(value or 1))


class LaunchBudget:
    """Launches one reconcile of one endpoint may still make (serving and warm pool together)."""

    def __init__(self) -> None:
        self.left = _limit("AUTOSCALE_MAX_LAUNCHES_PER_TICK", DEFAULT_MAX_LAUNCHES_PER_TICK)


def launch_capped(
    *,
    endpoint: Endpoint,
    actuator,
    wanted: int,
    standby: bool = False,
    budget: LaunchBudget | None = None,
    hardware_profile: HardwareProfile | None = None,
) -> list[str]:
    """Launch up to ``wanted`` replicas within the owner's quota, the per-endpoint and the fleet's per-tick caps.

    The owner's row is locked while its quota is read and the replicas registered, so two endpoints of one tenant
    ticking at once cannot both take the last slot. Returns the actions, with "capped" ones saying which limit bound.
    """
    budget = budget or LaunchBudget()
    label = "warm pool: " if standby else ("spot: " if hardware_profile is not None else "")
    actions: list[str] = []
    with transaction.atomic():
        lock_tenant(endpoint.owner_tenant_id)
        allowed, notes = launch_allowance(
            wanted=wanted,
            standby=standby,
            left=quota_left(endpoint, exclude_own_serving=False),
            gpus_per_replica=_gpus_per_replica(endpoint),
            per_tick_left=budget.left,
        )
        if allowed > 0:
            cap = _limit("AUTOSCALE_MAX_FLEET_LAUNCHES_PER_TICK", DEFAULT_MAX_FLEET_LAUNCHES_PER_TICK)
            try:
                granted = store.claim_fleet_launches(allowed, cap=cap, window_s=TICK_WINDOW_S)
            except store.RedisError as exc:
                granted = 0  # the fleet budget cannot be counted: start nothing rather than start unbounded
                notes.append(f"fleet launch budget unreadable ({exc})")
            if granted < allowed:
                notes.append(f"fleet launches per tick allow {granted}")
            allowed = granted
        if notes:
            actions.append(f"{label}launch capped at {allowed} of {wanted}: {', '.join(notes)}")
        if allowed <= 0:
            return actions
        budget.left -= allowed
        try:
            started = actuator.launch(pool_endpoint(endpoint, hardware_profile), allowed, standby=standby)
        except ActuatorError as exc:
            log.warning("autoscaler: %s", exc)
            if hardware_profile is not None:  # no spot to be had: on-demand only for the back-off
                try:
                    store.mark_spot_unavailable(endpoint.pk, spot.SpotConfig().unavailable_backoff_s)
                except store.RedisError as redis_exc:
                    log.warning("autoscaler: spot back-off not recorded: %s", redis_exc)
            return [*actions, f"{label}launch failed: {exc}"]
    names = f": {', '.join(r.name for r in started)}" if started else ""
    return [*actions, f"{label}{'started' if standby else 'launched'} {allowed}{names}"]


def pool_endpoint(endpoint: Endpoint, hardware_profile: HardwareProfile | None) -> Endpoint:
    """The endpoint as an actuator launches it on ``hardware_profile`` (a spot pool), which the actuator records on
    the replica (``Replica.hardware_profile``); the endpoint itself without one."""
    if hardware_profile is None:
        return endpoint
    view = copy.copy(endpoint)
    view.launch_hardware_profile_id = hardware_profile.pk
    return view


def mu_capacity_for(endpoint: Endpoint) -> float | None:
    """In-flight MU one replica holds at the endpoint's concurrency limit: that many reference requests priced with
    the endpoint's MU coefficients (the ones its proxies price demand with). None when they cannot be resolved:
    the horizontal policy then scales on requests."""
    try:
        coeffs = endpoint_coefficients(endpoint)
        reference = estimate_request_mu(coeffs, prompt_tokens=REFERENCE_REQUEST[0], max_tokens=REFERENCE_REQUEST[1])
        return horizontal.mu_capacity_per_replica(float(endpoint.concurrency_limit), reference)
    except (ValueError, AttributeError) as exc:
        log.warning("endpoint %s: no MU capacity (%s); scaling on requests", endpoint.pk, exc)
        return None


def predicted_floor_for(endpoint: Endpoint, *, now: float) -> tuple[int, dict]:
    """The predictive floor from per-minute request counts of the usage rollups (yesterday and the last minutes)."""
    cfg = PREDICTIVE
    at = datetime.fromtimestamp(now, tz=UTC)
    yesterday_end = cfg.period_s - cfg.lead_s - cfg.lookahead_margin_s - cfg.bucket_s
    windows = [
        (at - timedelta(seconds=cfg.period_s + cfg.trend_window_s), at - timedelta(seconds=yesterday_end), False),
        (at - timedelta(seconds=cfg.trend_window_s + cfg.bucket_s), at, True),
    ]
    history: dict[int, float] = {}
    recent = {"ok": 0, "ttft": 0.0, "tpot": 0.0, "out": 0}
    for start, end, is_recent in windows:
        rows = (
            UsageMinute.objects.filter(endpoint=endpoint, start__gte=start, start__lt=end)
            .values("start")
            .annotate(
                n=Sum("requests"),
                ok=Sum("ok"),
                ttft=Sum("ttft_sum_ms"),
                tpot=Sum("tpot_sum_ms"),
                out=Sum("output_tokens"),
            )
        )
        for row in rows:
            history[predictive.bucket_of(row["start"].timestamp(), cfg)] = (row["n"] or 0) / cfg.bucket_s
            if is_recent:
                for key in recent:
                    recent[key] += row[key] or 0
    seconds = DEFAULT_SECONDS_PER_REQUEST
    if recent["ok"]:
        # Little's law needs how long a request is in flight: mean TTFT plus mean output × mean TPOT.
        seconds = (recent["ttft"] + recent["tpot"] * recent["out"] / recent["ok"]) / recent["ok"] / 1000.0
        seconds = max(seconds, 0.1)
    floor, detail = predictive.predicted_floor(
        history,
        now=now,
        target_concurrency=float(max(1, endpoint.concurrency_limit)),
        seconds_per_request=seconds,
        cfg=cfg,
    )
    return floor, {**detail, "seconds_per_request": round(seconds, 3)}


def _last_moves(endpoint: Endpoint) -> tuple[float | None, float | None]:
    applied = AutoscalerDecision.objects.filter(endpoint=endpoint, axis=HORIZONTAL, applied=True)
    up = applied.filter(desired__gt=F("current")).order_by("-at").values_list("at", flat=True).first()
    down = applied.filter(desired__lt=F("current")).order_by("-at").values_list("at", flat=True).first()
    return (up.timestamp() if up else None), (down.timestamp() if down else None)


def _rollout_active(endpoint: Endpoint) -> bool:
    return Rollout.objects.filter(endpoint=endpoint, state__in=ROLLOUT_ACTIVE_STATES).exists()


# -- reconcile: make replicas match desired_replicas ----------------------------------------------------------
def reconcile(*, endpoint: Endpoint) -> list[str]:
    """Converge the endpoint's replicas on ``desired_replicas``: finish drains, promote standbys, start, drain,
    keep the warm pool. Returns what it did, for the decision's record."""
    actuator = get_actuator(endpoint)
    actions: list[str] = []
    budget = LaunchBudget()
    _safe(actuator.sync, endpoint)
    actions += finish_drains(endpoint=endpoint, actuator=actuator)
    actions += drain_noticed(endpoint=endpoint, actuator=actuator)
    if owner_suspended(endpoint):
        # Before the rollout's claim: a suspended tenant's replicas go whoever started them, its warm pool too.
        return actions + suspended_hold(endpoint=endpoint, actuator=actuator)
    if _rollout_active(endpoint):
        # Surge, drain and rollback replicas belong to the rollout until it ends; scaling resumes after it.
        return actions + ["rollout in progress: replicas left to the rollout"]
    active = list(
        serving_replicas(endpoint)
        .filter(state__in=ACTIVE, is_standby=False, terminate_at__isnull=True)  # a noticed one is being replaced
        .order_by("created_at")
    )
    pool = endpoint.spot_hardware_profile
    if pool is None:
        actions += converge(endpoint, actuator, budget, want=endpoint.desired_replicas, members=active)
    else:
        # Two pools (docs/algorithms.md#spot-capacity): the on-demand floor and the spot rest. On-demand replicas
        # above their target drain only as far as the ready fleet can spare them (a fallback replica stays until
        # the spot one replacing it serves).
        on_spot = [r for r in active if r.hardware_profile_id == pool.pk]
        on_demand = [r for r in active if r.hardware_profile_id != pool.pk]
        spare = sum(r.state == ReplicaState.READY for r in active) - endpoint.desired_replicas
        want = endpoint.desired_replicas - endpoint.desired_spot_replicas
        actions += converge(endpoint, actuator, budget, want=want, members=on_demand, spare=max(0, spare))
        actions += converge(
            endpoint, actuator, budget, want=endpoint.desired_spot_replicas, members=on_spot, hardware_profile=pool
        )
    actions += keep_warm_pool(endpoint=endpoint, actuator=actuator, budget=budget)
    return actions


def converge(
    endpoint: Endpoint,
    actuator,
    budget: LaunchBudget,
    *,
    want: int,
    members: list[Replica],
    hardware_profile: HardwareProfile | None = None,
    spare: int | None = None,
) -> list[str]:
    """Bring one pool (``members``: its active serving replicas, oldest first) to ``want``: promote standbys, then
    launch; or cancel booting ones, then drain the ready ones with the least work (at most ``spare`` in all).
    ``hardware_profile``: the spot pool's profile (its replicas launch on it; standbys are on-demand)."""
    actions: list[str] = []
    missing = want - len(members)
    if missing > 0:
        if hardware_profile is None:
            standbys = endpoint.replicas.filter(is_standby=True, state=ReplicaState.READY).order_by("created_at")
            for standby in standbys[:missing]:
                try:
                    actuator.promote(standby)  # the proxy snapshot picks it up on this save
                except ActuatorError as exc:
                    actions.append(f"promote {standby.name} failed: {exc}")
                    continue
                actions.append(f"promoted standby {standby.name}")
                missing -= 1
        if missing > 0:
            actions += launch_capped(
                endpoint=endpoint, actuator=actuator, wanted=missing, budget=budget, hardware_profile=hardware_profile
            )
    elif missing < 0:
        owned = [r for r in members if actuator.owns(r)]
        # Replicas still booting go first (nothing to drain), then the ready ones with the least work.
        booting = [r for r in reversed(owned) if r.state != ReplicaState.READY]
        ready = sorted((r for r in owned if r.state == ReplicaState.READY), key=_drain_order)
        surplus = -missing if spare is None else min(-missing, spare)
        for replica in (booting + ready)[:surplus]:
            if replica.state == ReplicaState.READY:
                if actuator.move(replica, ReplicaState.DRAINING, "scale in"):
                    actions.append(f"draining {replica.name}")
            else:
                _safe(actuator.terminate, [replica], reason="scale in before ready")
                actions.append(f"cancelled {replica.name}")
    return actions


def serving_replicas(endpoint: Endpoint):
    """Replicas of the version serving traffic (hand-registered ones without a version count as it)."""
    if endpoint.current_version_id is None:
        return endpoint.replicas.all()
    return endpoint.replicas.filter(Q(version_id=endpoint.current_version_id) | Q(version__isnull=True))


def keep_warm_pool(*, endpoint: Endpoint, actuator, budget: LaunchBudget | None = None) -> list[str]:
    if not getattr(actuator, "supports_standby", True):
        return []
    standby = list(endpoint.replicas.filter(is_standby=True, state__in=ACTIVE, actuator=actuator.name))
    want = endpoint.warm_pool_size
    if len(standby) < want:
        return launch_capped(
            endpoint=endpoint, actuator=actuator, wanted=want - len(standby), standby=True, budget=budget
        )
    if len(standby) > want:
        extra = standby[want:]
        _safe(actuator.terminate, extra, reason="warm pool shrunk")
        return [f"warm pool: stopped {len(extra)}"]
    return []


def finish_drains(*, endpoint: Endpoint, actuator) -> list[str]:
    """Stop draining replicas whose in-flight work is done (or whose drain ran past the timeout, or whose instance
    the cloud takes now: an interruption notice's ``terminate_at``)."""
    actions = []
    now = timezone.now()
    for replica in endpoint.replicas.filter(state=ReplicaState.DRAINING, actuator=actuator.name):
        if replica.terminate_at is not None and replica.terminate_at <= now:
            # Streams still running are cut; the proxy resumes them on another replica (gateway/proxy/resume.py).
            _safe(actuator.terminate, [replica], reason="reclaimed at the end of its interruption notice")
            actions.append(f"stopped {replica.name} (reclaimed)")
            continue
        age = (now - replica.state_changed_at).total_seconds()
        if age < DRAIN_GRACE_S:
            continue
        busy = _in_flight(replica)
        if busy == 0 or age > DRAIN_TIMEOUT_S or busy is None and age > 10:
            why = "drained" if busy == 0 else ("drain timed out" if busy else "drain: replica unreachable")
            _safe(actuator.terminate, [replica], reason=why)
            actions.append(f"stopped {replica.name} ({why})")
    return actions


def drain_noticed(*, endpoint: Endpoint, actuator) -> list[str]:
    """Stop routing to ready replicas the cloud takes within ``NOTICE_DRAIN_LEAD_S`` (an interruption notice)."""
    actions = []
    soon = timezone.now() + timedelta(seconds=NOTICE_DRAIN_LEAD_S)
    for replica in endpoint.replicas.filter(state=ReplicaState.READY, actuator=actuator.name, terminate_at__lte=soon):
        reason = f"interruption notice: taken at {replica.terminate_at:%H:%M:%S} UTC"
        if actuator.move(replica, ReplicaState.DRAINING, reason):
            actions.append(f"draining {replica.name} (taken at {replica.terminate_at:%H:%M:%S})")
    return actions


# -- a suspended tenant's endpoints (docs/security.md, "Suspended tenants") ------------------------------------
SUSPENDED_REASON = "owner tenant suspended"


def owner_suspended(endpoint: Endpoint) -> bool:
    """Whether the endpoint's owner is suspended (``Tenant.is_active`` off); shared endpoints never are."""
    return endpoint.owner_tenant_id is not None and not endpoint.owner_tenant.is_active


def suspended_hold(*, endpoint: Endpoint, actuator) -> list[str]:
    """Hold a suspended tenant's endpoint at zero: every replica its actuator runs (serving, standby, any version)
    drains if it is ready, so no stream is cut, and stops now if it never served; nothing is launched. Its settings
    (min, max, warm pool) are kept, so reactivation brings the replicas back at the next tick."""
    active = list(endpoint.replicas.filter(state__in=ACTIVE).order_by("created_at"))
    return converge(endpoint, actuator, LaunchBudget(), want=0, members=active)


def tenant_replicas_drain(*, tenant_id: int, actor=None) -> list[str]:
    """Drain the replicas of every endpoint a suspended tenant owns, now rather than at the next tick (which holds
    them at zero from then on: ``suspended_hold``). Replicas registered by hand (``static``) are left to the
    operators; a tenant that is active again is left alone."""
    actions: list[str] = []
    endpoints = Endpoint.objects.filter(owner_tenant_id=tenant_id, owner_tenant__is_active=False)
    for endpoint in endpoints.select_related("owner_tenant"):
        actuator = _actuator_or_none(endpoint)
        if actuator is None or actuator.name == "static":
            continue
        actions += [f"{endpoint.name}: {action}" for action in suspended_hold(endpoint=endpoint, actuator=actuator)]
        Endpoint.objects.filter(pk=endpoint.pk).update(desired_replicas=0, desired_spot_replicas=0)
    if actions:
        tenant = Tenant.objects.get(pk=tenant_id)
        audit_log(actor=actor, action="tenant.suspend_drain", obj=tenant, tenant=tenant, detail={"actions": actions})
    return actions


def replica_drain(*, replica: Replica, reason: str = "drain") -> Replica:
    """Stop routing to a ready replica; the next ticks stop it once its in-flight requests finished."""
    actuator = get_actuator(replica.endpoint)
    actuator.move(replica, ReplicaState.DRAINING, reason)
    return replica


MAX_NOTICE_S = 3600.0
NOTICE_DRAIN_LEAD_S = spot.NOTICE_DRAIN_LEAD_S


def replica_interruption_notice(*, replica: Replica, notice_s: float, actor=None) -> Replica:
    """The cloud takes the replica's instance in ``notice_s`` seconds (a spot interruption notice: AWS gives 120 s,
    GCP and Azure 30 s; a host maintenance event on any capacity). From the node agent or an operator, by the API.

    The replica no longer counts as capacity, and the autoscaler is woken for a decision now rather than at its next
    tick, so it launches the replacement at once. It serves on until ``NOTICE_DRAIN_LEAD_S`` before it is taken,
    then stops taking new requests (ready → draining, at once for a shorter notice; the proxies' snapshots follow
    within a second), and stops at ``terminate_at`` whatever it still runs: the proxy retries what had not
    streamed and resumes what had elsewhere. One that never served (pending, starting) is stopped now. A second
    notice never moves ``terminate_at`` later. docs/algorithms.md#spot-capacity."""
    if replica.state in (ReplicaState.STOPPED, ReplicaState.FAILED):
        raise ValidationError({"replica": [f"replica {replica.name} is {replica.state}: nothing to take"]})
    if not 0 <= notice_s <= MAX_NOTICE_S:
        raise ValidationError({"notice_s": [f"must be between 0 and {MAX_NOTICE_S:.0f} seconds"]})
    terminate_at = timezone.now() + timedelta(seconds=notice_s)
    with transaction.atomic():
        locked = Replica.objects.select_for_update().get(pk=replica.pk)
        if locked.terminate_at is None or terminate_at < locked.terminate_at:
            locked.terminate_at = terminate_at
            locked.save(update_fields=["terminate_at"])
    replica.terminate_at = locked.terminate_at
    reason = f"interruption notice: taken at {replica.terminate_at:%H:%M:%S} UTC"
    actuator = get_actuator(replica.endpoint)
    if replica.state == ReplicaState.READY and notice_s <= NOTICE_DRAIN_LEAD_S:
        actuator.move(replica, ReplicaState.DRAINING, reason)
    elif replica.state in (ReplicaState.PENDING, ReplicaState.STARTING):
        _safe(actuator.terminate, [replica], reason=reason)
    audit_log(
        actor=actor,
        action="replica.interruption_notice",
        obj=replica,
        tenant=replica.endpoint.owner_tenant,
        detail={"notice_s": notice_s, "terminate_at": replica.terminate_at.isoformat(), "state": replica.state},
    )
    endpoint_id, tick = replica.endpoint_id, f"notice-{replica.pk}-{int(time.time())}"
    # By name (workers.tasks.autoscaling.horizontal_one), as the activator does; the beat tick is the fallback.
    transaction.on_commit(lambda: _wake_autoscaler(endpoint_id, tick))
    return replica


def _wake_autoscaler(endpoint_id: int, tick: str) -> None:
    try:
        signature("autoscale.horizontal_one", args=[endpoint_id, tick]).apply_async(expires=30)
    except Exception as exc:  # noqa: BLE001 - the beat tick decides within seconds anyway
        log.warning("autoscaler: could not wake endpoint %s after a notice: %s", endpoint_id, exc)


def _drain_order(replica: Replica) -> int:
    busy = _in_flight(replica)
    return -1 if busy is None else busy  # an unreachable replica goes first: it serves nobody well


def _in_flight(replica: Replica) -> int | None:
    """Requests the replica is running or queueing, from its /metrics; None if it cannot be read."""
    scrape = _scrape(replica)
    return None if scrape is None else int(scrape.running + scrape.waiting)


def _scrape(replica: Replica, timeout_s: float = 1.0) -> replica_metrics.Scrape | None:
    if not replica.url:
        return None
    try:
        response = httpx.get(f"{replica.url}/metrics", timeout=timeout_s)
        response.raise_for_status()
    except httpx.HTTPError:
        return None
    return replica_metrics.parse(response.text)


# -- vertical ---------------------------------------------------------------------------------------------
def vertical_tick(*, endpoint_id: int, tick: str) -> AutoscalerDecision | None:
    """Adjust the per-replica concurrency limit for one endpoint; None when another worker owns this tick or Redis
    (lock, histogram snapshots) cannot be reached."""
    try:
        return _vertical_tick(endpoint_id=endpoint_id, tick=tick)
    except store.RedisError as exc:
        log.warning("autoscaler: vertical tick %s for endpoint %s skipped: Redis: %s", tick, endpoint_id, exc)
        return None


def _vertical_tick(*, endpoint_id: int, tick: str) -> AutoscalerDecision | None:
    with store.TickLock(axis=VERTICAL, endpoint_id=endpoint_id) as lock:
        if not lock.held or _decided(endpoint_id, VERTICAL, tick):
            return None
        endpoint = Endpoint.objects.filter(pk=endpoint_id).first()
        if endpoint is None:
            return None
        inputs = vertical_inputs(endpoint)
        decision = vertical.decide(inputs)
        record = {
            **decision.inputs,
            "overload_streak": decision.state.overload_streak,
            "healthy_streak": decision.state.healthy_streak,
        }
        row = _store(endpoint, VERTICAL, tick, decision.current, decision.desired, decision.reason, record)
        if row is None:
            return None
        if decision.desired != endpoint.concurrency_limit:
            with transaction.atomic():
                endpoint.concurrency_limit = decision.desired
                endpoint.save(update_fields=["concurrency_limit", "updated_at"])  # bumps the proxies' snapshot
                endpoint.replicas.filter(state__in=ACTIVE).update(concurrency_limit=decision.desired)
        row.applied = True
        row.save(update_fields=["applied"])
        return row


def vertical_inputs(endpoint: Endpoint) -> vertical.VerticalInputs:
    ttft, tpot, kv, waiting, running, seen = [], [], [], [], [], 0
    for replica in endpoint.replicas.filter(state=ReplicaState.READY, is_standby=False):
        scrape = _scrape(replica)
        if scrape is None:
            continue
        seen += 1
        kv.append(scrape.kv_usage)
        waiting.append(scrape.waiting)
        running.append(scrape.running)
        key = store.HIST_KEY.format(replica_id=replica.pk)
        before = store.load_json(key) or {}
        now_ttft, now_tpot = scrape.buckets(replica_metrics.TTFT), scrape.buckets(replica_metrics.TPOT)
        ttft.append(replica_metrics.diff(now_ttft, _unjson(before.get("ttft"))))
        tpot.append(replica_metrics.diff(now_tpot, _unjson(before.get("tpot"))))
        store.save_json(key, {"ttft": _json(now_ttft), "tpot": _json(now_tpot)})
    last = AutoscalerDecision.objects.filter(endpoint=endpoint, axis=VERTICAL).order_by("-at").first()
    state = vertical.VerticalState(
        overload_streak=int((last.inputs or {}).get("overload_streak", 0)) if last else 0,
        healthy_streak=int((last.inputs or {}).get("healthy_streak", 0)) if last else 0,
    )
    p95_ttft = replica_metrics.quantile(replica_metrics.merge(ttft))
    p95_tpot = replica_metrics.quantile(replica_metrics.merge(tpot))
    return vertical.VerticalInputs(
        current_limit=endpoint.concurrency_limit,
        # Bounds a SQL update can leave inverted or at 0 (the model's validators only run on full_clean): decide()
        # refuses them, which crashed the tick every 30 s; the maximum wins
        min_limit=max(1, min(endpoint.concurrency_min, endpoint.concurrency_max)),
        max_limit=max(1, endpoint.concurrency_max),
        ttft_slo_ms=endpoint.ttft_slo_ms,
        tpot_slo_ms=endpoint.tpot_slo_ms,
        ttft_p95_ms=None if p95_ttft is None else p95_ttft * 1000,
        tpot_p95_ms=None if p95_tpot is None else p95_tpot * 1000,
        kv_usage=max(kv) if kv else None,
        waiting_per_replica=sum(waiting) / seen if seen else None,
        busy_fraction=sum(running) / (seen * max(1, endpoint.concurrency_limit)) if seen else None,
        state=state,
    )


def _json(hist: dict[float, float]) -> list:
    return [["inf" if math.isinf(b) else b, c] for b, c in hist.items()]


def _unjson(rows) -> dict[float, float] | None:
    if not rows:
        return None
    return {(math.inf if b == "inf" else float(b)): float(c) for b, c in rows}


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
def _decided(endpoint_id: int, axis: str, tick: str) -> bool:
    return AutoscalerDecision.objects.filter(endpoint_id=endpoint_id, axis=axis, tick=tick).exists()


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


def _actuator_or_none(endpoint: Endpoint):
    try:
        return get_actuator(endpoint)
    except ActuatorError as exc:
        log.warning("autoscaler: endpoint %s: %s", endpoint.pk, exc)
        return None


def _safe(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except ActuatorError as exc:
        log.warning("autoscaler: %s", exc)
        return None
