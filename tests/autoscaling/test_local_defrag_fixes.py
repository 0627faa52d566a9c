# ruff: noqa: F401, F811 - the fixture imported from the other defragmenting tests is a parameter here
"""The defragmenting step's edges on the local actuator's host (capacity/autoscaling/defrag_ticks.py,
docs/placement.md "Defragmenting on this host"): a bad GPU setting fails no tick, moves in flight finish with the
step turned off, a move ends under its endpoint's tick lock and a ready copy is never stopped for its drained
source, a plan whose room changed is skipped, a failure unreserves, and a malformed state file reads."""

import json
import threading
import time
from contextlib import contextmanager

import pytest
from django.db import connection, transaction

from capacity.autoscaling import defrag_ticks, services, store, ticks
from capacity.autoscaling.actuators.local import LocalActuator
from capacity.autoscaling.actuators.local_gpus import GpuLedger, inventory
from capacity.autoscaling.defrag_ticks import RESERVE_S, defrag_pass, progress_moves
from endpoints.models import Replica, ReplicaState, Rollout, RolloutState
from endpoints.rollouts.services import create_version, ensure_current_version
from tenants.quotas import live_usage, lock_tenant
from tests.autoscaling.test_local_defrag import endpoint, fragmented, serving, until
from tests.factories import TenantFactory


def ledger(tmp_path, now=1000.0) -> GpuLedger:
    return GpuLedger(inventory("8/4"), tmp_path, alive=lambda pid, port: True, clock=lambda: now)


def moves_of(small) -> dict[str, str]:
    """Source name → its copy's name, for the moves in flight."""
    with LocalActuator.gpu_ledger().defrag_state() as (_, state):
        return {move["source"]: name for name, move in state["moves"].items()}


def ready_copies(small, copy_of: dict[str, str]) -> None:
    actuator = LocalActuator()
    until(
        lambda: all(small.replicas.get(name=c).state == ReplicaState.READY for c in copy_of.values()),
        every=lambda: actuator.sync(small),
    )


def test_a_bad_gpu_setting_fails_neither_the_tick_nor_the_reconcile(db, host_gpus, clean_store):
    host_gpus("eight")
    ep = endpoint("idle", 1, 0)
    decision = ticks.horizontal_tick(endpoint_id=ep.pk, tick="h-bad", now=time.time())  # the floor's launch fails
    assert decision.current == 0 and ep.replicas.count() == 0
    assert isinstance(services.reconcile(endpoint=ep), list)
    assert LocalActuator().defrag_copies() == {}


def test_moves_in_flight_finish_with_the_step_turned_off(fragmented, settings):
    small, big = fragmented
    assert len(defrag_pass(now=time.time() + 31)) == 2
    copy_of = moves_of(small)
    settings.INFERCAP = {**settings.INFERCAP, "PLACEMENT_DEFRAG": False}
    until(
        lambda: all(small.replicas.get(name=s).state != ReplicaState.READY for s in copy_of),
        every=lambda: defrag_pass(now=time.time() + 31),
    )
    assert moves_of(small) == {} and LocalActuator().defrag_copies() == {}
    assert all(small.replicas.get(name=c).state == ReplicaState.READY for c in copy_of.values())


def test_a_move_older_than_its_reservation_no_longer_counts(tmp_path):
    assert RESERVE_S == LocalActuator.start_timeout_s + services.DRAIN_TIMEOUT_S + 60.0
    move = {"source": "s", "endpoint_id": 7, "group": "g", "size": 4}
    state = {"moves": {"old": {**move, "started_at": 1000.0 - RESERVE_S - 1}, "new": {**move, "started_at": 990.0}}}
    (tmp_path / "local-defrag.json").write_text(json.dumps(state))
    assert ledger(tmp_path).moving(max_age_s=RESERVE_S) == {"new": 7}
    assert ledger(tmp_path).moving() == {"old": 7, "new": 7}


def test_a_move_ends_under_the_tick_lock(fragmented, monkeypatch):
    small, big = fragmented
    defrag_pass(now=time.time() + 31)
    copy_of = moves_of(small)
    ready_copies(small, copy_of)
    seen = []

    class Watched(store.TickLock):
        def __exit__(self, *exc):
            # As the lock goes, a tick must not see a draining source whose copy it still leaves out
            moving = LocalActuator().defrag_copies()
            drained = [s for s in copy_of if small.replicas.get(name=s).state != ReplicaState.READY]
            seen.append([s for s in drained if copy_of[s] in moving])
            return super().__exit__(*exc)

    monkeypatch.setattr(defrag_ticks.store, "TickLock", Watched)
    actions = progress_moves(LocalActuator.gpu_ledger())
    assert sorted(a.split("draining ")[1].split(" ")[0] for a in actions) == sorted(copy_of)
    assert seen and seen[-1] == [] and not any(seen)


def test_a_ready_copy_of_a_drained_source_is_the_replica_not_an_orphan(fragmented):
    small, big = fragmented
    defrag_pass(now=time.time() + 31)
    copy_of = moves_of(small)
    ready_copies(small, copy_of)
    actuator = LocalActuator()
    for source in copy_of:  # a pass drained the sources and stopped before ending the moves
        actuator.move(small.replicas.get(name=source), ReplicaState.DRAINING, "test")
    actions = progress_moves(LocalActuator.gpu_ledger())
    assert not any("stopped copy" in a for a in actions) and len(actions) == 2
    assert all(small.replicas.get(name=c).state == ReplicaState.READY for c in copy_of.values())
    assert moves_of(small) == {}


def test_a_reservation_is_refused_where_its_room_changed_hands(tmp_path):
    gpus = ledger(tmp_path)
    gpus.allot_at("a", [0], port=1)
    gpus.allot_at("x", [2], port=2)  # taken after the plan (moving "a" out of GPUs 0..3) was made
    assert not gpus.reserve("g", [0, 1, 2, 3], for_s=60, owners={"a"})
    assert gpus.held() == {"a": [0], "x": [2]}
    gpus.release("x")
    assert gpus.reserve("g", [0, 1, 2, 3], for_s=60, owners={"a"})
    assert gpus.held()["reserved:g"] == [1, 2, 3]


def test_a_plan_whose_room_was_taken_meanwhile_is_skipped(fragmented, monkeypatch):
    small, big = fragmented
    sources = {r.name for r in serving(small)}
    real = defrag_ticks.propose

    def stale(cluster, *args, **kwargs):
        for plan in real(cluster, *args, **kwargs):
            free = [g.index for g in plan.gpus if g not in cluster.owner]
            LocalActuator.gpu_ledger().allot_at("intruder", free[:1], port=1)  # taken after the snapshot
            yield plan

    monkeypatch.setattr(defrag_ticks, "propose", stale)
    assert defrag_pass(now=time.time() + 31) == []
    assert {r.name for r in serving(small)} == sources and moves_of(small) == {}
    assert not any(n.startswith("reserved:") for n in LocalActuator.gpu_ledger().held())


def test_a_failure_while_carrying_out_a_plan_releases_its_reservation(fragmented, monkeypatch):
    small, big = fragmented

    def broken(self, endpoint, gpus):
        raise RuntimeError("the database went away")

    monkeypatch.setattr(LocalActuator, "launch_at", broken)
    with pytest.raises(RuntimeError):
        defrag_pass(now=time.time() + 31)
    assert not any(n.startswith("reserved:") for n in LocalActuator.gpu_ledger().held())


def test_a_malformed_state_file_drops_its_bad_entries(tmp_path):
    good = {"source": "s", "endpoint_id": 7, "group": "g", "size": 4, "started_at": 999.0}
    state = {
        "waiting": {
            "bad": "x",
            "times": {"size": 4, "since": "soon", "last": 999.0},
            "ok": {"size": 4, "since": 990.0, "last": 999.0},
        },
        "moves": {"bad": [1], "noend": {**good, "endpoint_id": None}, "copy": good},
        "spent": [998.0, "x", None],
    }
    (tmp_path / "local-defrag.json").write_text(json.dumps(state))
    gpus = ledger(tmp_path)
    with gpus.defrag_state() as (_, read):
        assert read == {
            "waiting": {"ok": {"size": 4, "since": 990.0, "last": 999.0}},
            "moves": {"copy": good},
            "spent": [998.0],
        }
    assert gpus.allot("r", 1, port=1, group="h")  # a launch goes through the state: it reads
    assert gpus.moving() == {"copy": 7}


def owned(ep, **tenant):
    ep.owner_tenant = TenantFactory(**tenant)
    ep.save(update_fields=["owner_tenant"])
    return ep


def test_replicas_of_a_tenant_at_its_quota_are_not_moved(fragmented):
    small, big = fragmented
    owned(small, quota_max_replicas=4)  # its four serving replicas: no room for a copy
    assert defrag_pass(now=time.time() + 31) == []
    assert len(serving(small)) == 4 and moves_of(small) == {}


def test_a_plan_stops_where_the_quota_runs_out_between_its_moves(fragmented):
    small, big = fragmented
    owned(small, quota_max_replicas=5)  # room for one copy; the plan moves two
    actions = defrag_pass(now=time.time() + 31)
    assert len(serving(small)) == 5 and len(moves_of(small)) == 1
    assert "no room for the copy" in actions[-1] and "GPUs held for a TP-4 replica of big released" in actions[-1]
    assert not any(n.startswith("reserved:") for n in LocalActuator.gpu_ledger().held())


def test_replicas_of_a_suspended_tenant_are_not_moved(fragmented):
    small, big = fragmented
    owned(small, is_active=False)
    assert defrag_pass(now=time.time() + 31) == []
    assert len(serving(small)) == 4


def test_replicas_of_an_endpoint_under_a_rollout_are_not_moved(fragmented):
    small, big = fragmented
    current = ensure_current_version(small)
    target = create_version(endpoint=small, launch_options={**small.launch_options, "speed": 2})
    Rollout.objects.create(endpoint=small, from_version=current, to_version=target, state=RolloutState.PAUSED)
    assert defrag_pass(now=time.time() + 31) == []
    assert len(serving(small)) == 4


@contextmanager
def tenant_row_held(tenant_id: int, *, release: threading.Event, then=None):
    """Another launch of the tenant, on its own connection: it locks the owner's row (as ``services.launch_capped``
    does), runs ``then`` once ``release`` is set or 1 s has passed, and commits; the block runs while it holds."""
    locked = threading.Event()

    def launch():
        try:
            with transaction.atomic():
                lock_tenant(tenant_id)
                locked.set()
                release.wait(1.0 if then else 10)
                if then:
                    then()
        finally:
            connection.close()

    thread = threading.Thread(target=launch)
    thread.start()
    try:
        assert locked.wait(10)
        yield
    finally:
        release.set()
        thread.join(10)
    assert not thread.is_alive()


@pytest.mark.django_db(transaction=True)
def test_a_copy_waits_for_a_launch_holding_the_tenants_quota_and_then_sees_it(fragmented):
    """Another launch of the tenant holds its row and registers a replica that takes the quota's last slot; the
    copy's quota check waits for it and finds no room, where reading without the lock would have found the slot free
    and gone past the quota."""
    small, big = fragmented
    owned(small, quota_max_replicas=5)  # room for one copy

    def register():
        Replica.objects.create(endpoint=small, name="racer", url="http://127.0.0.1:9", actuator="static")

    with tenant_row_held(small.owner_tenant_id, release=threading.Event(), then=register):
        actions = defrag_pass(now=time.time() + 31)
    assert moves_of(small) == {}
    assert "its tenant's quota has no room for the copy" in actions[-1]
    assert live_usage(small.owner_tenant_id).serving_replicas == 5  # four replicas and the racer: at the quota


@pytest.mark.django_db(transaction=True)
def test_a_copy_waits_a_bounded_time_for_the_tenants_row_and_then_gives_up(fragmented, monkeypatch):
    """A launch holding the owner's row longer than the bound: the copy gives up with a reason and the next pass
    tries again, rather than wait past its endpoint's tick lock."""
    small, big = fragmented
    owned(small, quota_max_replicas=50)
    monkeypatch.setattr(defrag_ticks, "TENANT_LOCK_WAIT_S", 0.3)
    with tenant_row_held(small.owner_tenant_id, release=threading.Event()):
        actions = defrag_pass(now=time.time() + 31)
    assert moves_of(small) == {} and "another launch of its tenant holds the quota" in actions[-1]
    assert defrag_pass(now=time.time() + 32) and moves_of(small), "the next pass moves"
