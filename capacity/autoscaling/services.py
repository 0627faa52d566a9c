"""Making replicas match the autoscaler's decisions (``capacity.autoscaling.ticks`` decides): reconcile and converge,
launches within the tenant's quota and the per-tick caps, the warm pool, drains (graceful, at the end of an
interruption notice, of a suspended tenant's replicas), and the actuator calls around them.

Launch caps hold whatever demand or a bad setting asks: per endpoint in one reconcile, and for the whole fleet in one
horizontal tick window (a shared Redis counter), so one tick can never start hundreds of replicas.
"""

import contextlib
import copy
import logging
import time
from datetime import timedelta

import httpx
from celery import signature
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from capacity.autoscaling import replica_metrics, spot, store
from capacity.autoscaling.actuators import ActuatorError, get_actuator
from capacity.autoscaling.actuators.local_gpus import NoWholeGroup
from capacity.autoscaling.limits import QuotaLeft, launch_allowance
from capacity.models import HardwareProfile
from capacity.runtimes.replica_http import replica_client
from endpoints.models import (
    ROLLOUT_ACTIVE_STATES,
    Endpoint,
    Replica,
    ReplicaRole,
    ReplicaState,
    Rollout,
    ServingMode,
)
from tenants.models import Tenant
from tenants.quotas import live_usage, lock_tenant, quota_for
from tenants.services import audit_log

log = logging.getLogger(__name__)

ACTIVE = (ReplicaState.PENDING, ReplicaState.STARTING, ReplicaState.READY)
DRAIN_GRACE_S = 2.0  # the proxies' snapshots stop routing to a draining replica within a second
DRAIN_TIMEOUT_S = 120.0  # a stream still running after this is cut: the replica must go eventually
# Launch caps whatever demand or a bad setting asks: per endpoint in one reconcile, and for the whole fleet in one
# horizontal tick window (a shared Redis counter), so one tick can never start hundreds of replicas.
DEFAULT_MAX_LAUNCHES_PER_TICK = 8
DEFAULT_MAX_FLEET_LAUNCHES_PER_TICK = 32
TICK_WINDOW_S = 5.0  # workers.tasks.autoscaling.HORIZONTAL_S


def _limit(name: str, default: int) -> int:
    return int(getattr(settings, "INFERCAP", {}).get(name, default))


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


def gpus_per_replica(endpoint: Endpoint) -> int:
    """A replica's GPUs as the owner's quota counts them: on the launch's own profile (a spot or prefill pool's, set
    by ``pool_endpoint``), else the endpoint's."""
    hardware_id = getattr(endpoint, "launch_hardware_profile_id", None) or endpoint.hardware_profile_id
    value = HardwareProfile.objects.filter(pk=hardware_id).values_list("gpus_per_replica", flat=True).first()
    return max(1, int(value or 1))


def quota_allowance(
    endpoint: Endpoint, view: Endpoint, *, wanted: int, standby: bool, per_tick_left: int
) -> tuple[int, list[str]]:
    """How many of ``wanted`` replicas of ``view`` (the launch: a pool's or a version's profile, whose GPUs it
    counts) the owner's quota lets start now, and why fewer. Locks the owner's row until the caller's transaction
    ends, so that the launch and its registration happen before another launch of the tenant reads the quota."""
    lock_tenant(endpoint.owner_tenant_id)
    return launch_allowance(
        wanted=wanted,
        standby=standby,
        left=quota_left(endpoint, exclude_own_serving=False),
        gpus_per_replica=gpus_per_replica(view),
        per_tick_left=per_tick_left,
    )


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
    role: str | None = None,
) -> list[str]:
    """Launch up to ``wanted`` replicas within the owner's quota, the per-endpoint and the fleet's per-tick caps.
    ``role``: the pool of a disaggregated endpoint they serve in (``pool_endpoint``); None: the endpoint's own.

    The owner's row is locked while its quota is read and the replicas registered, so two endpoints of one tenant
    ticking at once cannot both take the last slot. Returns the actions, with "capped" ones saying which limit bound.
    """
    budget = budget or LaunchBudget()
    role = role or serving_role(endpoint)
    label = "warm pool: " if standby else ("spot: " if hardware_profile is not None else "")
    label = "prefill: " + label if role == ReplicaRole.PREFILL else label
    actions: list[str] = []
    view = pool_endpoint(endpoint, hardware_profile, role=role)
    # What the launch starts and cannot register is stopped (an actuator without processes of its own has none).
    undone_on_error = getattr(actuator, "launches_undone_on_error", contextlib.nullcontext)
    with undone_on_error(), transaction.atomic():
        allowed, notes = quota_allowance(endpoint, view, wanted=wanted, standby=standby, per_tick_left=budget.left)
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
        before = endpoint.replicas.count()
        try:
            started = actuator.launch(view, allowed, standby=standby)
        except ActuatorError as exc:
            log.warning("autoscaler: %s", exc)
            if hardware_profile is not None:  # no spot to be had: on-demand only for the back-off
                try:
                    store.mark_spot_unavailable(endpoint.pk, spot.SpotConfig().unavailable_backoff_s)
                except store.RedisError as redis_exc:
                    log.warning("autoscaler: spot back-off not recorded: %s", redis_exc)
            failed = f"{label}launch failed: {exc}"
            if hardware_profile is None and role != ReplicaRole.PREFILL and isinstance(exc.__cause__, NoWholeGroup):
                rest = allowed - (endpoint.replicas.count() - before)
                failed += fall_back(endpoint=endpoint, actuator=actuator, wanted=rest, standby=standby, role=role)
            return [*actions, failed]
    names = f": {', '.join(r.name for r in started)}" if started else ""
    return [*actions, f"{label}{'started' if standby else 'launched'} {allowed}{names}"]


def fall_back(*, endpoint: Endpoint, actuator, wanted: int, standby: bool, role: str) -> str:
    """The replicas a launch could not place as whole TP groups on the endpoint's hardware, launched on its
    ``fallback_hardware_profile`` (docs/placement.md, "Falling back to another hardware profile"), within the owner's
    GPU quota counted in the fallback's GPUs per replica. What happened, to append to the capped action."""
    fallback = endpoint.fallback_hardware_profile if endpoint.fallback_hardware_profile_id else None
    if fallback is None or wanted <= 0:
        return ""
    allowed, notes = launch_allowance(
        wanted=wanted,
        standby=standby,
        left=quota_left(endpoint, exclude_own_serving=False),
        gpus_per_replica=max(1, fallback.gpus_per_replica),
        per_tick_left=wanted,  # within the launches already counted against the per-tick caps
    )
    said = f"; fell back to {fallback.name}: "
    if allowed <= 0:
        return said + f"launched 0 of {wanted} ({', '.join(notes)})"
    view = pool_endpoint(endpoint, fallback, role=role)
    if "tensor_parallel_size" in (view.launch_options or {}):  # the fallback's own group size
        view.launch_options = {**view.launch_options, "tensor_parallel_size": max(1, fallback.gpus_per_replica)}
    try:
        started = actuator.launch(view, allowed, standby=standby)
    except ActuatorError as exc:
        log.warning("autoscaler: fallback to %s: %s", fallback.name, exc)
        return said + f"launch failed: {exc}"
    capped = f" of {wanted} ({', '.join(notes)})" if notes else ""
    names = f": {', '.join(r.name for r in started)}" if started else ""
    return said + f"launched {len(started)}{capped}{names}"


def pool_endpoint(
    endpoint: Endpoint, hardware_profile: HardwareProfile | None, *, role: str | None = None
) -> Endpoint:
    """The endpoint as an actuator launches it: on ``hardware_profile`` (a spot pool), which the actuator records on
    the replica (``Replica.hardware_profile``), and in ``role`` (``launch_role``, which the actuators record on the
    replica and turn into the engine's KV-transfer flags). A disaggregated endpoint's prefill pool launches with its
    own hardware profile and launch options (docs/disaggregation.md). The endpoint itself when nothing differs."""
    role = role or serving_role(endpoint)
    if hardware_profile is None and role == ReplicaRole.MIXED:
        return endpoint
    view = copy.copy(endpoint)
    view.launch_role = role
    if role == ReplicaRole.PREFILL:
        # The endpoint's launch options with the prefill pool's laid over them (its profile, speed, CPUs stay).
        view.launch_options = endpoint.prefill_pool_launch_options
        hardware_profile_id = endpoint.prefill_hardware_profile_id
        if hardware_profile_id and hardware_profile_id != endpoint.hardware_profile_id:
            view.launch_hardware_profile_id = hardware_profile_id
    if hardware_profile is not None:
        view.launch_hardware_profile_id = hardware_profile.pk
    return view


def serving_role(endpoint: Endpoint) -> str:
    """The role of the replicas that take the endpoint's admitted requests: decode on a disaggregated endpoint
    (the horizontal policy's pool), mixed on an aggregated one."""
    return ReplicaRole.DECODE if endpoint.serving_mode == ServingMode.DISAGGREGATED else ReplicaRole.MIXED


def prefill_pool(endpoint: Endpoint):
    """The serving version's prefill replicas (``serving_replicas`` of role prefill)."""
    return serving_replicas(endpoint).filter(role=ReplicaRole.PREFILL)


def admission_pool(endpoint: Endpoint):
    """The serving version's replicas the horizontal policy counts: the decode pool of a disaggregated endpoint, the
    mixed replicas of an aggregated one."""
    return serving_replicas(endpoint).filter(role=serving_role(endpoint))


def rollout_active(endpoint: Endpoint) -> bool:
    return Rollout.objects.filter(endpoint=endpoint, state__in=ROLLOUT_ACTIVE_STATES).exists()


# -- reconcile: make replicas match desired_replicas ----------------------------------------------------------
def reconcile(*, endpoint: Endpoint) -> list[str]:
    """Converge the endpoint's replicas on ``desired_replicas``: finish drains, promote standbys, start, drain,
    keep the warm pool. Returns what it did, for the decision's record."""
    actuator = get_actuator(endpoint)
    actions: list[str] = []
    budget = LaunchBudget()
    safe_call(actuator.sync, endpoint)
    actions += finish_drains(endpoint=endpoint, actuator=actuator)
    actions += drain_noticed(endpoint=endpoint, actuator=actuator)
    if owner_suspended(endpoint):
        # Before the rollout's claim: a suspended tenant's replicas go whoever started them, its warm pool too.
        return actions + suspended_hold(endpoint=endpoint, actuator=actuator)
    if rollout_active(endpoint):
        # Surge, drain and rollback replicas belong to the rollout until it ends; scaling resumes after it.
        return actions + ["rollout in progress: replicas left to the rollout"]
    everyone = list(
        serving_replicas(endpoint)
        .filter(state__in=ACTIVE, is_standby=False, terminate_at__isnull=True)  # a noticed one is being replaced
        .exclude(name__in=list(defrag_copies(actuator)))  # a move's copy replaces its source once ready
        .order_by("created_at")
    )
    role = serving_role(endpoint)
    active = [r for r in everyone if r.role == role]
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
    if role == ReplicaRole.DECODE:
        prefills = [r for r in everyone if r.role == ReplicaRole.PREFILL]
        actions += converge(
            endpoint,
            actuator,
            budget,
            want=endpoint.prefill_desired_replicas,
            members=prefills,
            role=ReplicaRole.PREFILL,
        )
    actions += retire_other_roles(endpoint, actuator, members=everyone, role=role)
    actions += keep_warm_pool(endpoint=endpoint, actuator=actuator, budget=budget)
    return actions


def defrag_copies(actuator) -> dict[str, int]:
    """The replicas a defragmenting move is copying onto other GPUs (name → endpoint id), still loading
    (docs/placement.md, "Local"): not capacity, and not the autoscaler's to cancel; each replaces its source once
    ready."""
    copies = getattr(actuator, "defrag_copies", None)
    return dict(copies()) if copies is not None else {}


def defrag_copy_states(endpoint: Endpoint, actuator) -> list[str]:
    """The states of the endpoint's serving replicas that are a move's copies (one query, only while it has some),
    for the horizontal tick to leave out of its counts."""
    names = [name for name, owner in defrag_copies(actuator).items() if owner == endpoint.pk]
    if not names:
        return []
    copies = endpoint.replicas.filter(name__in=names, role=serving_role(endpoint), is_standby=False)
    return list(copies.filter(state__in=ACTIVE, terminate_at__isnull=True).values_list("state", flat=True))


def retire_other_roles(endpoint: Endpoint, actuator, *, members: list[Replica], role: str) -> list[str]:
    """After a change of serving mode: the replicas of the other mode's roles drain, but only as far as the new
    mode's ready replicas cover the desired count, so the switch never leaves the endpoint with less than it had."""
    keep = {role, ReplicaRole.PREFILL} if role == ReplicaRole.DECODE else {role}
    stale = [r for r in members if r.role not in keep]
    if not stale:
        return []
    ready = sum(r.state == ReplicaState.READY for r in members if r.role == role)
    stale_ready = sum(r.state == ReplicaState.READY for r in stale)
    short = max(0, endpoint.desired_replicas - ready)  # what the new pool cannot serve yet: that many stay
    spare = len(stale) - stale_ready + max(0, stale_ready - short)
    return converge(endpoint, actuator, LaunchBudget(), want=0, members=stale, spare=spare)


def converge(
    endpoint: Endpoint,
    actuator,
    budget: LaunchBudget,
    *,
    want: int,
    members: list[Replica],
    hardware_profile: HardwareProfile | None = None,
    spare: int | None = None,
    role: str | None = None,
) -> list[str]:
    """Bring one pool (``members``: its active serving replicas, oldest first) to ``want``: promote standbys, then
    launch; or cancel booting ones, then drain the ready ones with the least work (at most ``spare`` in all).
    ``hardware_profile``: the spot pool's profile (its replicas launch on it; standbys are on-demand). ``role``: the
    pool's role when it is not the endpoint's serving one (a prefill pool: no warm pool of its own)."""
    actions: list[str] = []
    missing = want - len(members)
    if missing > 0:
        if hardware_profile is None and role in (None, serving_role(endpoint)):
            standbys = endpoint.replicas.filter(
                is_standby=True, state=ReplicaState.READY, role=serving_role(endpoint)
            ).order_by("created_at")
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
                endpoint=endpoint,
                actuator=actuator,
                wanted=missing,
                budget=budget,
                hardware_profile=hardware_profile,
                role=role,
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
                safe_call(actuator.terminate, [replica], reason="scale in before ready")
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
    standby = list(
        endpoint.replicas.filter(
            is_standby=True, state__in=ACTIVE, actuator=actuator.name, role=serving_role(endpoint)
        )
    )
    want = endpoint.warm_pool_size
    other = list(
        endpoint.replicas.filter(is_standby=True, state__in=ACTIVE, actuator=actuator.name).exclude(
            role=serving_role(endpoint)
        )
    )
    if other:  # the serving mode changed: a standby of the old role could never be promoted
        safe_call(actuator.terminate, other, reason="warm pool: serving mode changed")
        return [f"warm pool: stopped {len(other)} of another role"]
    if len(standby) < want:
        return launch_capped(
            endpoint=endpoint, actuator=actuator, wanted=want - len(standby), standby=True, budget=budget
        )
    if len(standby) > want:
        extra = standby[want:]
        safe_call(actuator.terminate, extra, reason="warm pool shrunk")
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
            safe_call(actuator.terminate, [replica], reason="reclaimed at the end of its interruption notice")
            actions.append(f"stopped {replica.name} (reclaimed)")
            continue
        age = (now - replica.state_changed_at).total_seconds()
        if age < DRAIN_GRACE_S:
            continue
        busy = _in_flight(replica)
        if busy == 0 or age > DRAIN_TIMEOUT_S or busy is None and age > 10:
            why = "drained" if busy == 0 else ("drain timed out" if busy else "drain: replica unreachable")
            safe_call(actuator.terminate, [replica], reason=why)
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
        actuator = actuator_or_none(endpoint)
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
        safe_call(actuator.terminate, [replica], reason=reason)
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
    scrape = scrape_replica(replica)
    return None if scrape is None else int(scrape.running + scrape.waiting)


def scrape_replica(replica: Replica, timeout_s: float = 1.0) -> replica_metrics.Scrape | None:
    if not replica.url:
        return None
    try:
        response = replica_client().get(f"{replica.url}/metrics", timeout=timeout_s)
        response.raise_for_status()
    except httpx.HTTPError:
        return None
    return replica_metrics.parse(response.text)


def actuator_or_none(endpoint: Endpoint):
    try:
        return get_actuator(endpoint)
    except ActuatorError as exc:
        log.warning("autoscaler: endpoint %s: %s", endpoint.pk, exc)
        return None


def safe_call(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except ActuatorError as exc:
        log.warning("autoscaler: %s", exc)
        return None
