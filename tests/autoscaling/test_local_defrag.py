"""The defragmenting step on the local actuator's host (capacity/autoscaling/defrag_ticks.py, docs/placement.md
"In the actuators" > "Local"): a TP-4 group capped on a host whose free GPUs are split across two NVLink islands
gets room by moving TP-1 replicas, make-before-break: a copy starts on the planned GPU, its source drains only once
the copy is ready, the group starts on the opened island, and every step is a decision an operator can read."""

import time

import pytest

from capacity.autoscaling import defrag_ticks, services, ticks
from capacity.autoscaling.actuators import free_gpus, local
from capacity.autoscaling.actuators.local import LocalActuator
from capacity.autoscaling.defrag_ticks import defrag_pass
from capacity.models import AutoscalerDecision
from endpoints.models import Endpoint, ReplicaState
from tests.factories import EndpointFactory
from tests.waiting import wait_for


def until(check, *, timeout_s: float = 30.0, every=None):
    """``wait_for`` with ``every`` (a defrag pass, a sync) run before each look."""

    def stepped():
        if every is not None:
            every()
        return check()

    return wait_for(stepped, timeout=timeout_s, interval=0.2)


def endpoint(name: str, size: int, desired: int) -> Endpoint:
    options = {"actuator": "local", "profile": "tiny", "tensor_parallel_size": size}
    return EndpointFactory(name=name, launch_options=options, desired_replicas=desired, min_replicas=desired)


def gpus_of(name: str) -> list[int]:
    return sorted(LocalActuator.gpu_ledger().held()[name])


def serving(ep: Endpoint) -> list:
    return list(ep.replicas.exclude(state=ReplicaState.STOPPED).order_by("created_at"))


@pytest.fixture
def fragmented(db, host_gpus, child_envs, reap_local_replicas, clean_store):
    """Two islands of 4 GPUs; four ready TP-1 replicas of ``small`` on GPUs 0, 1, 4 and 5 (4 GPUs free, no island
    with 4), and ``big``, a TP-4 endpoint whose launch is capped."""
    host_gpus("8/4")
    actuator = LocalActuator()
    small = endpoint("small", 1, 4)
    replicas = actuator.launch(small, 6)  # GPUs 0..5 by best fit
    actuator.terminate([r for r in replicas if gpus_of(r.name) in ([2], [3])], reason="test")
    until(lambda: all(r.state == ReplicaState.READY for r in serving(small)), every=lambda: actuator.sync(small))
    assert sorted(g for r in serving(small) for g in gpus_of(r.name)) == [0, 1, 4, 5]
    big = endpoint("big", 4, 1)
    (action,) = services.launch_capped(endpoint=big, actuator=actuator, wanted=1)
    assert "capped at 0 of 1: no whole TP-4 group free in one domain (4 GPUs free)" in action
    return small, big


def defrag_reasons(ep: Endpoint) -> list[str]:
    rows = AutoscalerDecision.objects.filter(endpoint=ep, reason__startswith="defrag:").order_by("at", "pk")
    return list(rows.values_list("reason", flat=True))


def test_moves_open_an_island_make_before_break_and_the_group_starts_there(fragmented, child_envs):
    small, big = fragmented
    actuator = LocalActuator()
    sources = {r.name: gpus_of(r.name) for r in serving(small)}
    # Below the wait threshold nothing moves
    assert defrag_pass() == [] and len(serving(small)) == 4 and not defrag_reasons(small)
    actions = defrag_pass(now=time.time() + 31)
    copies = [r for r in serving(small) if r.name not in sources]
    assert len(copies) == 2 and len(actions) == 2
    held = LocalActuator.gpu_ledger().held()
    moved = [a.split("moving replica ")[1].split(" ")[0] for a in actions]
    # The copies run on the planned GPUs of the other island; the island they leave is reserved for the group
    island = sorted(g for name in moved for g in sources[name])
    other = [g for g in range(8) if g // 4 != island[0] // 4 and g not in [x for s in sources.values() for x in s]]
    assert sorted(g for c in copies for g in held[c.name]) == other
    assert sorted(e["CUDA_VISIBLE_DEVICES"] for e in child_envs[-2:]) == [str(g) for g in other]
    (reservation,) = [name for name in held if name.startswith("reserved:")]
    room = [g for g in range(8) if g // 4 == island[0] // 4]
    assert held[reservation] == [g for g in room if g not in island]  # the room's free GPUs; the rest as they free
    for name in moved:
        assert f"defrag: moving replica {name} (TP-1) from GPU {sources[name][0]} to GPU " in " ".join(actions)
        assert "to open room for a TP-4 replica of endpoint big" in " ".join(defrag_reasons(small))
    assert "for a TP-4 replica; moving" in defrag_reasons(big)[0]
    # While the copies load, the autoscaler neither counts nor cancels them, and the sources serve on
    actions = services.reconcile(endpoint=Endpoint.objects.get(pk=small.pk))
    assert not any("cancelled" in a or "draining" in a or "launch" in a for a in actions)

    def step():
        defrag_pass(now=time.time() + 31)
        for name in moved:  # never drained before its copy is ready
            source = small.replicas.get(name=name)
            if source.state != ReplicaState.READY:
                copy = small.replicas.get(name=copy_of[name])
                assert copy.state == ReplicaState.READY

    moves = LocalActuator.gpu_ledger()
    with moves.defrag_state() as (_, state):
        copy_of = {move["source"]: name for name, move in state["moves"].items()}
    until(lambda: all(small.replicas.get(name=n).state != ReplicaState.READY for n in moved), every=step)
    assert all(
        f"defrag: draining {n} after its copy {copy_of[n]} became ready" in defrag_reasons(small) for n in moved
    )
    # The drained sources stop (the reconcile's drains) and their GPUs join the reservation
    until(
        lambda: all(small.replicas.get(name=n).state == ReplicaState.STOPPED for n in moved),
        every=lambda: services.finish_drains(endpoint=small, actuator=actuator),
    )
    assert [r.state for r in serving(small)] == [ReplicaState.READY] * 4
    assert LocalActuator.gpu_ledger().held()[reservation] == room
    assert free_gpus.local_free_gpus().free_count() == 0  # the ledger's room: the reserved island is not free
    # The waiting group's next launch takes the opened island
    (action,) = services.launch_capped(endpoint=big, actuator=actuator, wanted=1)
    assert action.startswith("launched 1")
    (group,) = serving(big)
    assert gpus_of(group.name) == room
    assert not any(name.startswith("reserved:") for name in LocalActuator.gpu_ledger().held())


def test_nothing_moves_with_the_setting_off(fragmented, settings):
    small, big = fragmented
    settings.INFERCAP = {**settings.INFERCAP, "PLACEMENT_DEFRAG": False}
    assert defrag_pass(now=time.time() + 31) == []
    assert len(serving(small)) == 4 and not defrag_reasons(small) and not defrag_reasons(big)


def test_nothing_moves_past_the_hours_budget(fragmented):
    small, big = fragmented
    ledger = LocalActuator.gpu_ledger()
    now = time.time() + 31
    with ledger.defrag_state() as (_, state):
        state["spent"] = [now - 600.0] * 11  # one move left of 12; the room needs two
    assert defrag_pass(now=now) == []
    assert len(serving(small)) == 4 and not any(n.startswith("reserved:") for n in ledger.held())
    with ledger.defrag_state() as (_, state):
        state["spent"] = [now - 3601.0] * 12  # spent over an hour ago: free again
    assert len(defrag_pass(now=now)) == 2


def test_a_copy_that_fails_releases_the_reservation_and_the_source_serves_on(fragmented):
    small, big = fragmented
    sources = {r.name for r in serving(small)}
    defrag_pass(now=time.time() + 31)
    copies = [r for r in serving(small) if r.name not in sources]
    assert len(copies) == 2
    local.stop_pid(int(copies[0].actuator_ref), grace_s=1.0)  # the copy's process dies while loading
    ledger = LocalActuator.gpu_ledger()
    until(lambda: not any(n.startswith("reserved:") for n in ledger.held()), every=lambda: defrag_pass())
    assert any(f"defrag: copy {copies[0].name} of " in r and "did not start" in r for r in defrag_reasons(small))
    assert all(small.replicas.get(name=n).state == ReplicaState.READY for n in sources)


def test_a_copy_whose_gpus_were_taken_does_not_start(fragmented, monkeypatch):
    small, big = fragmented
    sources = {r.name for r in serving(small)}
    real = LocalActuator.launch_at

    def taken(self, endpoint, gpus):
        LocalActuator.gpu_ledger().allot_at("intruder", gpus, port=1)  # someone took the destination meanwhile
        return real(self, endpoint, gpus)

    monkeypatch.setattr(LocalActuator, "launch_at", taken)
    (action,) = defrag_pass(now=time.time() + 31)
    assert "could not move" in action and "keeps serving, GPUs held for a TP-4 replica of big released" in action
    assert {r.name for r in serving(small)} == sources
    assert not any(n.startswith("reserved:") for n in LocalActuator.gpu_ledger().held())
    assert defrag_ticks.progress_moves(LocalActuator.gpu_ledger()) == []


def test_the_horizontal_tick_counts_a_move_as_one_replica(fragmented):
    small, big = fragmented
    defrag_pass(now=time.time() + 31)
    assert len(serving(small)) == 6  # four serving, two copies loading
    decision = ticks.horizontal_tick(endpoint_id=small.pk, tick="h-defrag", now=time.time())
    assert decision.current == 4 and decision.desired == 4
    assert not any("launch" in a or "cancelled" in a for a in decision.inputs["actions"])
    assert len(serving(small)) == 6 and Endpoint.objects.get(pk=small.pk).desired_replicas == 4
