"""Whole tensor-parallel groups on the local actuator's host (capacity/autoscaling/actuators/local_gpus.py,
docs/placement.md "In the actuators"): a replica gets its group's GPUs inside one NVLink domain, all or none, by
placement's best fit; a launch that finds no whole group starts nothing and says "capped" and why; a GPU is
held as long as its replica's process runs; a host without GPUs launches as it always did."""

import os
import time

import pytest

from capacity.autoscaling import services, ticks
from capacity.autoscaling.actuators import ActuatorError
from capacity.autoscaling.actuators.local import LocalActuator
from capacity.autoscaling.actuators.local_gpus import STARTING_GRACE_S, GpuLedger, NoWholeGroup, inventory
from endpoints.models import Endpoint, ReplicaState
from placement.cluster import Node


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def ledger(tmp_path, spec="8/4", *, alive=lambda pid, port: True, clock=None):
    return GpuLedger(inventory(spec), tmp_path, alive=alive, clock=clock or Clock())


def test_the_inventory_setting_names_the_gpus_and_their_nvlink_islands():
    assert inventory("") == [] and inventory("0") == [] and inventory(None) == []
    assert inventory("8") == [Node("local", 8)]
    assert inventory("8/2") == [Node("local", 8, island=2)]
    for bad in ("eight", "8/3", "-1", "8/0"):
        with pytest.raises(ActuatorError, match="INFERCAP_LOCAL_GPUS"):
            inventory(bad)


def test_groups_go_whole_inside_one_island_by_best_fit(tmp_path):
    gpus = ledger(tmp_path)  # two NVLink islands of 4
    for n, (name, size) in enumerate([("a", 2), ("b", 4), ("c", 2)]):
        devices = gpus.allot(name, size, port=8000 + n)
        gpus.started(name, 100 + n)
        assert devices == {"a": "0,1", "b": "4,5,6,7", "c": "2,3"}[name]  # b leaves island 0 for c, a tighter fit
    with pytest.raises(NoWholeGroup, match=r"no whole TP-1 group free in one domain \(0 GPUs free\)"):
        gpus.allot("d", 1, port=8010)
    assert gpus.held() == {"a": [0, 1], "b": [4, 5, 6, 7], "c": [2, 3]}


def test_free_gpus_split_across_islands_are_no_group_and_nothing_is_held(tmp_path):
    gpus = ledger(tmp_path)
    assert gpus.allot("a", 3, port=1) == "0,1,2" and gpus.allot("b", 3, port=2) == "4,5,6"
    with pytest.raises(NoWholeGroup, match=r"no whole TP-2 group free in one domain \(2 GPUs free\)"):
        gpus.allot("c", 2, port=3)  # GPUs 3 and 7 are free, on two islands
    assert set(gpus.held()) == {"a", "b"}
    with pytest.raises(NoWholeGroup, match="no interconnect domain on this host holds a TP-8 group"):
        ledger(tmp_path / "other").allot("x", 8, port=4)


def test_a_holding_lasts_as_long_as_its_process(tmp_path):
    running = {101}
    clock = Clock()
    gpus = ledger(tmp_path, "4", alive=lambda pid, port: pid in running, clock=clock)
    gpus.allot("a", 4, port=1)
    gpus.started("a", 101)
    with pytest.raises(NoWholeGroup):
        gpus.allot("b", 4, port=2)
    running.clear()  # the replica's process exited: its GPUs are free, whoever wrote nothing down
    assert gpus.allot("b", 4, port=2) == "0,1,2,3"
    # A holding whose process never started lapses after the grace period
    clock.now += STARTING_GRACE_S - 1
    with pytest.raises(NoWholeGroup):
        gpus.allot("c", 1, port=3)
    clock.now += 2
    assert gpus.allot("c", 1, port=3) == "0"


# -- the local actuator, with real simulated replica processes ------------------------------------------------
def tp(endpoint, size: int | None) -> Endpoint:
    options = {"actuator": "local", "profile": "tiny"} | ({"tensor_parallel_size": size} if size else {})
    Endpoint.objects.filter(pk=endpoint.pk).update(launch_options=options)
    return Endpoint.objects.get(pk=endpoint.pk)


def test_the_local_actuator_starts_whole_groups_or_nothing(db, tenant_a, host_gpus, child_envs, reap_local_replicas):
    host_gpus("8/4")
    actuator = LocalActuator()
    endpoint = tp(tenant_a.endpoint, 4)
    first, second = actuator.launch(endpoint, 2)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in child_envs] == ["0,1,2,3", "4,5,6,7"]
    assert "GPUs 0,1,2,3" in first.transitions.order_by("at", "pk").last().reason
    with pytest.raises(ActuatorError, match=r"capped at 0 of 1: no whole TP-4 group free in one domain \(0 GPUs"):
        actuator.launch(endpoint, 1)
    assert endpoint.replicas.count() == 2 and len(child_envs) == 2  # no row, no process
    # A stopped replica's GPUs are free again
    actuator.terminate([first], reason="scale-in")
    (third,) = actuator.launch(endpoint, 1)
    assert child_envs[-1]["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert {r.state for r in (second, third)} == {ReplicaState.STARTING}


def test_a_launch_short_of_a_group_is_capped_in_the_autoscalers_actions(
    db, tenant_a, host_gpus, child_envs, reap_local_replicas, clean_store
):
    host_gpus("4")
    actuator = LocalActuator()
    actuator.launch(tp(tenant_a.endpoint, None), 1)  # one GPU for a replica without TP
    assert child_envs[-1]["CUDA_VISIBLE_DEVICES"] == "0"
    endpoint = tp(tenant_a.endpoint, 4)
    actions = services.launch_capped(endpoint=endpoint, actuator=actuator, wanted=2)
    (action,) = actions
    assert "capped" in action and "no whole TP-4 group free in one domain (3 GPUs free)" in action
    assert endpoint.replicas.count() == 1 and len(child_envs) == 1
    # Two TP-2 replicas asked where one fits: one starts, the launch says why the other did not
    host_gpus("3")
    actions = services.launch_capped(endpoint=tp(tenant_a.endpoint, 2), actuator=actuator, wanted=2)
    assert "capped at 1 of 2: no whole TP-2 group free in one domain (0 GPUs free)" in actions[-1]
    assert child_envs[-1]["CUDA_VISIBLE_DEVICES"] == "1,2" and endpoint.replicas.count() == 2


def test_a_host_without_gpus_launches_as_it_always_did(
    db, tenant_a, host_gpus, child_envs, reap_local_replicas, tmp_path
):
    host_gpus("")
    (replica,) = LocalActuator().launch(tp(tenant_a.endpoint, 2), 1)  # TP-2 on CPU: two ranks, no GPU
    assert child_envs[-1].get("CUDA_VISIBLE_DEVICES") == os.environ.get("CUDA_VISIBLE_DEVICES")
    assert "GPUs" not in replica.transitions.order_by("at", "pk").last().reason
    assert not (tmp_path / "local-gpus.json").exists()


@pytest.mark.django_db(transaction=True)
def test_the_horizontal_decision_says_why_no_group_started(
    tenant_a, host_gpus, child_envs, reap_local_replicas, clean_store, monkeypatch
):
    host_gpus("3")  # three GPUs: no TP-4 group, ever
    monkeypatch.setattr(services, "get_actuator", lambda endpoint: LocalActuator())
    endpoint = tp(tenant_a.endpoint, 4)
    Endpoint.objects.filter(pk=endpoint.pk).update(min_replicas=1, max_replicas=2, desired_replicas=1)
    decision = ticks.horizontal_tick(endpoint_id=endpoint.pk, tick="h-tp4", now=time.time())
    assert "capped at 0 of 1" in decision.reason
    assert "no interconnect domain on this host holds a TP-4 group (the largest has 3 GPUs)" in decision.reason
    assert not endpoint.replicas.exists() and not child_envs
