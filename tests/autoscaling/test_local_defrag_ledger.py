"""The local GPU ledger's parts of the defragmenting step (capacity/autoscaling/actuators/local_gpus.py,
docs/placement.md "Local"): a copy on exactly its planned GPUs, reservations nobody else's best fit takes and the
waiting group's own launch does, waiting groups recorded when capped, and holdings files written before all this."""

import json

import pytest

from capacity.autoscaling.actuators.local_gpus import WAIT_STALE_S, GpuLedger, NoWholeGroup, inventory
from capacity.autoscaling.defrag_ticks import defrag_pass, start_moves
from placement.defrag import DefragConfig


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def ledger(tmp_path, spec="8/4", *, clock=None):
    return GpuLedger(inventory(spec), tmp_path, alive=lambda pid, port: True, clock=clock or Clock())


def test_allot_at_takes_exactly_those_gpus_or_nothing(tmp_path):
    gpus = ledger(tmp_path)
    assert gpus.allot_at("copy", [6], port=1) == "6"
    with pytest.raises(NoWholeGroup, match="GPUs 6 are not free"):
        gpus.allot_at("other", [5, 6], port=2)
    with pytest.raises(NoWholeGroup, match="GPUs 9 are not free"):
        gpus.allot_at("other", [9], port=2)  # not this host's
    assert gpus.held() == {"copy": [6]}


def test_a_reservation_is_kept_from_others_and_taken_by_its_group(tmp_path):
    clock = Clock()
    gpus = ledger(tmp_path, clock=clock)
    gpus.allot_at("small", [1], port=1)
    gpus.started("small", 101)
    assert gpus.reserve("7/mixed/-/-/4", [0, 1, 2, 3], for_s=60, owners={"small"})  # GPU 1: the moved one
    # Nobody else's best fit takes a reserved GPU: a TP-2 goes to the other island, though island 0 fits tighter
    assert gpus.allot("x", 2, port=2) == "4,5"
    with pytest.raises(NoWholeGroup, match=r"no whole TP-4 group free in one domain"):
        gpus.allot("y", 4, port=3, group="7/mixed/-/-/4")  # GPU 1 not free yet: the group waits
    gpus.release("small")  # the moved replica's source stops: its GPU joins the reservation, not the free pool
    assert gpus.allot("z", 1, port=4) == "6"  # not GPU 1, though it is free of replicas now
    assert gpus.allot("y", 4, port=3, group="7/mixed/-/-/4") == "0,1,2,3"
    assert not any(name.startswith("reserved:") for name in gpus.held())
    with gpus.defrag_state() as (_, state):
        assert state["waiting"] == {}  # the group started: it no longer waits


def test_a_reservation_expires(tmp_path):
    clock = Clock()
    gpus = ledger(tmp_path, "4", clock=clock)
    gpus.reserve("g", [0, 1, 2, 3], for_s=30)
    with pytest.raises(NoWholeGroup):
        gpus.allot("a", 1, port=1)
    clock.now += 31
    assert gpus.allot("a", 1, port=1) == "0"


def test_a_capped_group_waits_from_its_first_cap_until_it_starts_or_stops_asking(tmp_path):
    clock = Clock()
    gpus = ledger(tmp_path, "4", clock=clock)
    gpus.allot("a", 1, port=1)
    for _ in range(3):
        with pytest.raises(NoWholeGroup):
            gpus.allot("b", 4, port=2, group="g")
        clock.now += 5
    with gpus.defrag_state() as (_, state):
        assert state["waiting"]["g"] == {"size": 4, "since": 1000.0, "last": 1010.0}
    clock.now += WAIT_STALE_S  # no launch asked since: it no longer waits
    with gpus.defrag_state() as (_, state):
        assert state["waiting"] == {}
    with pytest.raises(NoWholeGroup):
        gpus.allot("b", 4, port=2, group="g")  # asked again: it waits from now
    with gpus.defrag_state() as (_, state):
        assert state["waiting"]["g"]["since"] == clock.now
    gpus.release("a")
    assert gpus.allot("b", 4, port=2, group="g") == "0,1,2,3"  # started: no longer waiting
    with gpus.defrag_state() as (_, state):
        assert state["waiting"] == {}


def test_a_holdings_file_from_before_reservations_reads(tmp_path):
    old = {
        "r1": {"gpus": [0, 1], "pid": 55, "port": 8000, "at": 900.0},
        "r2": {"gpus": [4], "pid": None, "port": 8001, "at": 999.0},
    }
    (tmp_path / "local-gpus.json").write_text(json.dumps(old))
    gpus = ledger(tmp_path)
    assert gpus.held() == {"r1": [0, 1], "r2": [4]}
    assert gpus.allot("c", 2, port=3) == "2,3"
    assert gpus.moving() == {}


def test_the_pass_does_nothing_without_gpus_or_with_a_bad_setting(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    for spec in ("", "0", "eight"):
        settings.INFERCAP = {**settings.INFERCAP, "LOCAL_GPUS": spec}
        assert defrag_pass(now=1e12) == []
    assert not (tmp_path / "local-defrag.json").exists()


def test_a_reservation_goes_once_its_group_no_longer_waits(tmp_path):
    clock = Clock()
    gpus = ledger(tmp_path, clock=clock)
    gpus.allot_at("a", [0], port=1)
    gpus.allot_at("c", [4, 5, 6, 7], port=3)
    assert gpus.reserve("g", [0, 1, 2, 3], for_s=600, owners={"a"})
    with pytest.raises(NoWholeGroup):
        gpus.allot("b", 4, port=2, group="g")  # GPU 0 not free yet: the group waits, its reservation stays
    assert start_moves(gpus, now=clock.now, config=DefragConfig()) == []
    assert gpus.held()["reserved:g"] == [1, 2, 3]
    clock.now += WAIT_STALE_S  # the endpoint stopped asking (scaled in, fell back)
    (action,) = start_moves(gpus, now=clock.now, config=DefragConfig())
    assert action == "defrag: released GPUs 0,1,2,3 held for g: no longer waiting"
    assert gpus.held() == {"a": [0], "c": [4, 5, 6, 7]}
