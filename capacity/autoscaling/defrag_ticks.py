"""The defragmenting step, carried out on this host's GPUs by the local actuator (docs/placement.md, "In the
actuators" > "Local"): a pass (the beat, every ``DEFRAG_S``) finishes the moves in flight and plans new ones with
``placement.defrag.propose``, the pure step the placement bench judges.

A move is make-before-break: a copy of the moved replica starts on the planned GPUs (a normal replica row of the
same endpoint, version and pool, left out of the autoscaler's counts while it loads), and only once the copy is ready
is the source drained (the router stops sending to it, its streams finish, the reconcile stops it and its GPUs
free). The waiting group's GPUs are reserved meanwhile; its next capped launch takes them once all are free. Every
step leaves an ``AutoscalerDecision`` whose reason starts with "defrag:".
"""

import fcntl
import logging
import time
from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, OperationalError, connection, transaction

from capacity.autoscaling import services, store
from capacity.autoscaling.actuators import ActuatorError
from capacity.autoscaling.actuators.base import version_endpoint
from capacity.autoscaling.actuators.local import LocalActuator
from capacity.autoscaling.actuators.local_gpus import RESERVED, GpuLedger
from capacity.models import AutoscalerDecision
from endpoints.models import Endpoint, Replica, ReplicaState
from placement.defrag import DefragConfig, MoveBudget, Plan, Waiting, propose
from tenants.quotas import lock_tenant

log = logging.getLogger(__name__)

DEFRAG_S = 10.0  # the beat entry (workers.tasks.autoscaling)
# A plan's reservation outlives its copies' start (the actuator's start timeout) and its sources' drain.
RESERVE_S = LocalActuator.defrag_move_s
HORIZONTAL = AutoscalerDecision.Axis.HORIZONTAL
TENANT_LOCK_WAIT_S = 5.0  # a copy waits this long for its owner's row (another launch's quota check) at most
LOCK_NOT_AVAILABLE = "55P03"  # PostgreSQL's lock_not_available: the wait above ran out


def enabled() -> bool:
    """``INFERCAP["PLACEMENT_DEFRAG"]`` (on by default): whether new moves start; the moves in flight finish
    either way."""
    return bool(settings.INFERCAP.get("PLACEMENT_DEFRAG", True))


def _ledger() -> GpuLedger | None:
    """This host's GPUs; None without any, or with a bad ``INFERCAP_LOCAL_GPUS`` (the launches' error to report,
    not every pass's)."""
    try:
        return LocalActuator.gpu_ledger()
    except ActuatorError:
        return None


def defrag_pass(*, now: float | None = None, config: DefragConfig | None = None) -> list[str]:
    """One pass: drain the sources whose copies are ready (or give up on copies that failed), then, when the step
    is on, plan for the groups that have waited and start their copies. What it did; [] on a host without GPUs,
    or while another pass runs."""
    ledger = _ledger()
    if ledger is None:
        return []
    now = time.time() if now is None else now
    config = config or DefragConfig()
    path = Path(settings.VAR_DIR) / "local-defrag.pass.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return []
        try:
            actions = progress_moves(ledger)
            return actions + (start_moves(ledger, now=now, config=config) if enabled() else [])
        except store.RedisError as exc:
            log.warning("defrag: pass skipped: Redis: %s", exc)
            return []
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


# -- the moves in flight --------------------------------------------------------------------------------------
def progress_moves(ledger: GpuLedger) -> list[str]:
    """Each move whose copy is ready drains its source; one whose copy failed ends, its group's reservation
    released and its source left serving; one whose source left during the copy stops the copy. A move ends
    (leaves the state) under its endpoint's tick lock, so no tick sees its source draining while its copy is
    still left out of the counts."""
    with ledger.defrag_state() as (_, state):
        moves = dict(state["moves"])
    actions = []
    for copy_name, move in moves.items():
        outcome = _progress(ledger, copy_name, move)
        if outcome is None:
            continue
        action, failed = outcome
        if failed:
            ledger.unreserve(move["group"])
        actions.append(action)
    return actions


def _end(ledger: GpuLedger, copy_name: str) -> None:
    with ledger.defrag_state() as (_, state):
        state["moves"].pop(copy_name, None)


def _progress(ledger: GpuLedger, copy_name: str, move: dict) -> tuple[str, bool] | None:
    """(what happened, whether the move failed), the move ended; or None while the copy loads (or another worker
    holds the endpoint's tick)."""
    rows = {r.name: r for r in Replica.objects.filter(name__in=[copy_name, move["source"]])}
    copy, source = rows.get(copy_name), rows.get(move["source"])
    endpoint = Endpoint.objects.filter(pk=move["endpoint_id"]).first()
    if endpoint is None:
        _end(ledger, copy_name)
        return f"defrag: move of {move['source']} ended: its endpoint is gone", True
    actuator = LocalActuator()
    with store.TickLock(axis=HORIZONTAL, endpoint_id=endpoint.pk) as lock:
        if not lock.held:
            return None
        if copy is not None:
            services.safe_call(actuator.sync, endpoint)
            copy.refresh_from_db()
        if source is not None:
            source.refresh_from_db()
        outcome = _step(actuator, endpoint, copy_name, copy, source, move)
        if outcome is not None:
            _end(ledger, copy_name)
        return outcome


def _step(actuator, endpoint, copy_name: str, copy, source, move: dict) -> tuple[str, bool] | None:
    """The move's next step, under the endpoint's tick lock: what happened and whether it failed; None while the
    copy loads."""
    if copy is None or copy.state in (ReplicaState.FAILED, ReplicaState.STOPPED):
        state = copy.state if copy is not None else "gone"
        reason = (
            f"defrag: copy {copy_name} of {move['source']} did not start ({state}); {move['source']} keeps "
            f"serving, GPUs held for a TP-{move['size']} group released"
        )
        _record(endpoint, f"defrag-{copy_name}-failed", reason, move)
        return reason, True
    if copy.state == ReplicaState.READY and (source is None or source.state != ReplicaState.READY):
        # The source already drains or left (an earlier pass drained it and stopped before ending the move): the
        # ready copy is the replica now.
        return f"defrag: move of {move['source']} to {copy_name} done", False
    if source is None or source.state != ReplicaState.READY:
        services.safe_call(actuator.terminate, [copy], reason="defrag: its source left during the copy")
        reason = f"defrag: stopped copy {copy_name}: its source {move['source']} left during the copy"
        _record(endpoint, f"defrag-{copy_name}-orphan", reason, move)
        return reason, False
    if copy.state != ReplicaState.READY:
        return None
    reason = f"defrag: draining {source.name} after its copy {copy_name} became ready"
    actuator.move(source, ReplicaState.DRAINING, reason)
    _record(endpoint, f"defrag-{copy_name}-drain", reason, move)
    return reason, False


# -- new moves ----------------------------------------------------------------------------------------------
def start_moves(ledger: GpuLedger, *, now: float, config: DefragConfig) -> list[str]:
    """Plans for the waiting groups without one (``propose``, within the hour's move budget), carried out."""
    with ledger.defrag_state() as (holdings, state):
        waiting, moves = dict(state["waiting"]), dict(state["moves"])
        state["spent"] = [t for t in state["spent"] if t > now - 3600.0]
        spent = list(state["spent"])
        cluster = ledger.cluster(holdings)
        held = dict(holdings)
    actions = []
    busy = {m["group"] for m in moves.values()}
    for name in held:
        key = name[len(RESERVED) :] if name.startswith(RESERVED) else None
        if key is not None and key not in waiting and key not in busy:
            ledger.unreserve(key)  # the group no longer asks (scaled in, fell back, found room): its hold goes
            actions.append(f"defrag: released GPUs {_gpus(held[name]['gpus'])} held for {key}: no longer waiting")
        busy |= {key} if key is not None else set()
    budget = MoveBudget(config.max_moves_per_hour)
    budget.times.extend(sorted(spent))
    groups = [Waiting(key, int(w["size"]), float(w["since"])) for key, w in waiting.items() if key not in busy]
    left = budget.left(now)
    if not groups or left <= 0:
        return actions
    rows = {
        r.name: r
        for r in Replica.objects.filter(name__in=list(held), actuator=LocalActuator.name).select_related("endpoint")
    }
    held_back: dict[tuple, str] = {}
    pinned = {name for name in held if _pinned(rows.get(name), held[name], held_back)}
    pinned |= set(moves) | {m["source"] for m in moves.values()}
    for plan in propose(cluster, groups, now_s=now, config=config, moves_left=left, pinned=pinned):
        actions += carry_out(ledger, plan, rows, size=waiting[plan.target]["size"], now=now)
    return actions


def _pinned(row: Replica | None, held: dict, held_back: dict[tuple, str]) -> bool:
    """Whether a holding may not move: a reservation, no replica row of ours, not ready (starting, draining), no
    pid yet, a standby, under an interruption notice, or its endpoint held back (``_held_back``, once per endpoint
    and pool in ``held_back``)."""
    if row is None or row.state != ReplicaState.READY or held.get("pid") is None:
        return True
    if row.is_standby or row.terminate_at is not None:
        return True
    key = (row.endpoint_id, row.hardware_profile_id, row.version_id, row.role)
    if key not in held_back:
        held_back[key] = _held_back(row)
    return bool(held_back[key])


def _held_back(source: Replica) -> str:
    """Why the source's endpoint may not have a replica moved ("" where it may): its owner is suspended, a rollout
    holds its replicas, or its tenant's quota has no room for one more replica of the source's pool (the copy
    counts against it while it loads, so a move at the quota would lower the endpoint's ceiling, or a sibling's,
    and scale a serving replica in)."""
    endpoint = source.endpoint
    if services.owner_suspended(endpoint):
        return "its owner is suspended"
    if services.rollout_active(endpoint):
        return "a rollout holds its replicas"
    left = services.quota_left(endpoint, exclude_own_serving=False)
    gpus = services.gpus_per_replica(copy_view(source))
    if (left.serving is not None and left.serving < 1) or (left.gpus is not None and left.gpus < gpus):
        return "its tenant's quota has no room for the copy"
    return ""


def carry_out(ledger: GpuLedger, plan: Plan, rows: dict[str, Replica], *, size: int, now: float) -> list[str]:
    """Reserve the plan's GPUs for its group and start each move's copy on its destination. A plan whose room
    changed since it was made (a GPU taken by other than the replicas it moves) is skipped; a copy that cannot
    start, or a failure on the way, releases the reservation (the copies already started finish their moves)."""
    key = str(plan.target)
    owners = {m.owner for m in plan.moves}
    if not ledger.reserve(key, [g.index for g in plan.gpus], for_s=RESERVE_S, owners=owners):
        log.info("defrag: plan for %s skipped: its GPUs changed hands since it was made", key)
        return []
    try:
        return _carry_out(ledger, plan, rows, key=key, size=size, now=now)
    except BaseException:
        ledger.unreserve(key)
        raise


def _carry_out(ledger: GpuLedger, plan: Plan, rows: dict[str, Replica], *, key: str, size: int, now: float):
    target = Endpoint.objects.filter(pk=int(key.split("/")[0])).first()
    target_name = target.name if target is not None else key
    actions = []
    for move in plan.moves:
        source = rows[move.owner]
        source_gpus, destination = [g.index for g in move.source], [g.index for g in move.destination]
        record = {"source": source.name, "endpoint_id": source.endpoint_id, "group": key, "size": size}
        record |= {"from_gpus": source_gpus, "to_gpus": destination, "started_at": now}
        copy, why = _start_copy(ledger, source, destination, record)
        if copy is None:
            ledger.unreserve(key)
            reason = (
                f"defrag: could not move {source.name} to GPU {_gpus(destination)} ({why}); {source.name} keeps "
                f"serving, GPUs held for a TP-{size} replica of {target_name} released"
            )
            _record(source.endpoint, f"defrag-{source.name}-{int(now)}-nostart", reason, record)
            return [*actions, reason]
        reason = (
            f"defrag: moving replica {source.name} (TP-{len(source_gpus)}) from GPU {_gpus(source_gpus)} to GPU "
            f"{_gpus(destination)} to open room for a TP-{size} replica of endpoint {target_name}; copy {copy.name}"
        )
        _record(source.endpoint, f"defrag-{copy.name}-start", reason, record | {"copy": copy.name})
        actions.append(reason)
    if target is not None:
        moved = ", ".join(m.owner for m in plan.moves)
        reason = f"defrag: holding GPUs {_gpus(g.index for g in plan.gpus)} for a TP-{size} replica; moving {moved}"
        _record(target, f"defrag-{key}-{int(now)}"[:64], reason, {"group": key, "moves": len(plan.moves)})
    return actions


def _start_copy(ledger: GpuLedger, source: Replica, gpus: list[int], record: dict) -> tuple[Replica | None, str]:
    """The copy of ``source`` on ``gpus``, started under the endpoint's tick lock and recorded as a move in flight
    (with the budget spent) before the lock is let go, so no tick counts it as capacity. The owner's row is locked
    while its quota is read and the copy registered, as a launch does (``services.launch_capped``): a launch of
    another of its endpoints at the same moment cannot take the same last slot."""
    with store.TickLock(axis=HORIZONTAL, endpoint_id=source.endpoint_id) as lock:
        if not lock.held:
            return None, "the endpoint's tick holds its replicas"
        try:
            with LocalActuator().launches_undone_on_error(), transaction.atomic():
                _bound_lock_wait()
                lock_tenant(source.endpoint.owner_tenant_id)
                if why := _held_back(source):  # again: another move of the plan may have taken the quota's room
                    return None, why
                try:
                    copy = LocalActuator().launch_at(copy_view(source), gpus)
                except ActuatorError as exc:
                    return None, str(exc)
        except OperationalError as exc:
            if getattr(exc.__cause__, "sqlstate", None) != LOCK_NOT_AVAILABLE:
                raise
            return None, "another launch of its tenant holds the quota; the next pass tries again"
        with ledger.defrag_state() as (_, state):
            state["moves"][copy.name] = record
            state["spent"].append(record["started_at"])
        return copy, ""


def _bound_lock_wait() -> None:
    """Wait at most ``TENANT_LOCK_WAIT_S`` for the owner's row (PostgreSQL's lock_timeout, this transaction only):
    the endpoint's tick lock lapses after a minute, and a move that waits that long would outlive it."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL lock_timeout = '{int(TENANT_LOCK_WAIT_S * 1000)}ms'")


def copy_view(source: Replica) -> Endpoint:
    """The endpoint as the source replica was launched: its version, its pool's hardware profile and role."""
    endpoint = source.endpoint
    if source.version_id and source.version_id != endpoint.current_version_id:
        endpoint = version_endpoint(endpoint, source.version)
    hardware = source.hardware_profile if source.hardware_profile_id else None
    return services.pool_endpoint(endpoint, hardware, role=source.role)


def _gpus(indices) -> str:
    return ",".join(str(i) for i in indices)


def _record(endpoint: Endpoint, tick: str, reason: str, inputs: dict) -> None:
    """An operator-readable decision on the endpoint's horizontal axis (not applied, current = desired: no cooldown
    or retention reads it as a scale); a spot split's record is carried over, as the next tick reads the newest
    one's."""
    last = (
        AutoscalerDecision.objects.filter(endpoint=endpoint, axis=HORIZONTAL)
        .order_by("-at")
        .values_list("inputs", flat=True)
        .first()
    )
    carried = {"spot": last["spot"]} if isinstance(last, dict) and "spot" in last else {}
    try:
        with transaction.atomic():
            AutoscalerDecision.objects.create(
                endpoint=endpoint,
                axis=HORIZONTAL,
                tick=tick[:64],
                current=endpoint.desired_replicas,
                desired=endpoint.desired_replicas,
                reason=reason[:255],
                inputs={"defrag": inputs, **carried},
                applied=False,
                at=datetime.now(tz=UTC),
            )
    except IntegrityError:
        log.info("defrag: decision %s for endpoint %s already stored", tick, endpoint.pk)
