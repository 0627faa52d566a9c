"""The defragmenting step (placement/defrag.py) and its replay (defrag_replay.py), docs/placement.md
"Defragmenting": a few small replicas moved off one island open room for a waiting group, never across a domain,
within the wait threshold and the move budget, and each move costs a copy's load (make-before-break)."""

import random

from placement.cluster import Cluster, Gpu, hgx_nodes, rack
from placement.defrag import DefragConfig, MoveBudget, Waiting, propose
from placement.policies import infercap_best_fit
from simulator.placement import defrag_replay as defrag_replay_module
from simulator.placement.defrag_replay import defrag_replay
from simulator.placement.replay import Request, replay

CONFIG = DefragConfig(wait_s=60.0, load_s=90.0, max_moves_per_plan=3, max_moves_per_hour=12, max_moved_gpus=2)


def _board(node: str, *indices: int) -> list[Gpu]:
    return [Gpu(node, i) for i in indices]


def _fragmented() -> Cluster:
    """Two boards: hgx-00 holds one TP-1 (7 free), hgx-01 a TP-4 and a TP-1 (3 free): 10 free, no board for a TP-8."""
    cluster = Cluster(hgx_nodes(2))
    cluster.take("x", _board("hgx-00", 0))
    cluster.take("big", _board("hgx-01", 0, 1, 2, 3))
    cluster.take("y", _board("hgx-01", 4))
    return cluster


def test_moving_one_small_replica_opens_a_board_for_a_waiting_tp8():
    cluster = _fragmented()
    assert infercap_best_fit(cluster, 8) is None
    plans = propose(cluster, [Waiting("tp8", 8, 0.0)], now_s=120.0, config=CONFIG, moves_left=12, pinned=set())
    assert len(plans) == 1
    plan = plans[0]
    # the TP-1 on the nearly free board goes to the other board's hole (best fit), and the TP-8 gets the whole board
    assert [(m.owner, m.source, {g.node for g in m.destination}) for m in plan.moves] == [
        ("x", (Gpu("hgx-00", 0),), {"hgx-01"})
    ]
    assert set(plan.gpus) == set(_board("hgx-00", *range(8))) and Gpu("hgx-00", 0) not in plan.reserved
    assert cluster.free_count() == 10 and cluster.held["x"] == [Gpu("hgx-00", 0)]  # proposing changes nothing


def test_nothing_below_the_wait_threshold_nor_past_the_budget():
    cluster = _fragmented()
    waiting = [Waiting("tp8", 8, 0.0)]
    assert propose(cluster, waiting, now_s=59.0, config=CONFIG, moves_left=12, pinned=set()) == []
    assert propose(cluster, waiting, now_s=120.0, config=CONFIG, moves_left=0, pinned=set()) == []
    # a replica that is starting (or already moving) stays where it is
    assert propose(cluster, waiting, now_s=120.0, config=CONFIG, moves_left=12, pinned={"x"}) == []
    # two TP-1 on the board: a budget of one move, per hour or per plan, opens nothing
    cluster.take("x2", _board("hgx-00", 1))
    assert propose(cluster, waiting, now_s=120.0, config=CONFIG, moves_left=1, pinned=set()) == []
    one = DefragConfig(wait_s=60.0, max_moves_per_plan=1)
    assert propose(cluster, waiting, now_s=120.0, config=one, moves_left=12, pinned=set()) == []
    assert len(propose(cluster, waiting, now_s=120.0, config=CONFIG, moves_left=2, pinned=set())[0].moves) == 2
    # a TP-4 is larger than the step moves by default
    bigger = Cluster(hgx_nodes(2))
    bigger.take("four", _board("hgx-00", 0, 1, 2, 3))
    bigger.take("other", _board("hgx-01", 0, 1, 2, 3))
    assert propose(bigger, waiting, now_s=120.0, config=CONFIG, moves_left=12, pinned=set()) == []


def test_a_tp8_gets_two_emptied_rack_nodes_when_no_board_can_be_opened():
    # Given a board with 2 GPUs free and a rack of four 4-GPU nodes with 1, 1, 2 and 2 free: 8 free, but no board,
    # no two free rack nodes and no four with 2 free each (equal shares) for a TP-8
    cluster = Cluster(hgx_nodes(1) + rack("nvl", nodes=4, gpus=4))
    cluster.take("six", _board("hgx-00", *range(6)))
    for i in (0, 1):
        cluster.take(f"r{i}", _board(f"nvl-{i:02d}", 0, 1))
        cluster.take(f"one{i}", _board(f"nvl-{i:02d}", 2))
    cluster.take("r2", _board("nvl-02", 0, 1))
    cluster.take("a3", _board("nvl-03", 0))
    cluster.take("b3", _board("nvl-03", 1))
    assert infercap_best_fit(cluster, 8) is None and cluster.free_count() == 8
    plan = propose(cluster, [Waiting("tp8", 8, 0.0)], now_s=60.0, config=CONFIG, moves_left=12, pinned=set())[0]
    # then the two least-held rack nodes are emptied, their three replicas moved into the holes left elsewhere
    assert set(plan.gpus) == set(_board("nvl-02", *range(4)) + _board("nvl-03", *range(4)))
    assert {m.owner: {g.node for g in m.destination} for m in plan.moves} == {
        "r2": {"hgx-00"},
        "a3": {"nvl-00"},
        "b3": {"nvl-01"},
    }


def test_the_budget_is_a_sliding_hour():
    budget = MoveBudget(3)
    budget.spend(2, 0.0)
    budget.spend(1, 1800.0)
    assert budget.left(3599.0) == 0 and budget.left(3600.0) == 2 and budget.left(5400.0) == 3


def test_no_move_ever_crosses_a_domain():
    # Given randomly filled clusters of boards and a rack, and waiting groups of 2-8 GPUs
    plans = 0
    for seed in range(40):
        rng = random.Random(seed)
        cluster = Cluster(hgx_nodes(3) + rack("nvl", nodes=6, gpus=4))
        for owner in range(60):
            gpus = infercap_best_fit(cluster, rng.choice([1, 1, 2, 2, 4]))
            if gpus is not None and rng.random() < 0.8:
                cluster.take(owner, gpus)
        for owner in [o for o in list(cluster.held) if rng.random() < 0.4]:
            cluster.release(owner)
        waiting = [Waiting(f"w{i}", rng.choice([2, 4, 8]), 0.0) for i in range(3)]
        config = DefragConfig(wait_s=0.0, max_moved_gpus=4)
        for plan in propose(cluster, waiting, now_s=10.0, config=config, moves_left=12, pinned=set()):
            plans += 1
            assert len(cluster.domains_of(plan.gpus)) == 1 and len(plan.gpus) == len(set(plan.gpus))
            nodes = {g.node for g in plan.gpus}  # one node's island, or whole nodes of the rack
            assert len(nodes) == 1 or all(sum(g.node == n for g in plan.gpus) == 4 for n in nodes)
            for move in plan.moves:
                assert len(cluster.domains_of(move.destination)) == 1
                assert cluster.domains_of(move.source) == cluster.domains_of(plan.gpus)  # off the group's island
                assert not set(move.destination) & set(plan.gpus)  # a copy never lands where the group goes
                assert all(g not in cluster.owner for g in move.destination)
    assert plans > 10  # the clusters were fragmented enough to call for moves


def _two_boards_half_full():
    """Two boards filled with TP-2 replicas, two leaving each board at 200 s: 4 GPUs free on each, then a TP-8 at 300 s
    (the TP-2 started more than a load ago: none is starting)."""
    requests = [Request(i, f"tp2-{i}", 2, 0.0, 200.0 if i in (0, 1, 4, 5) else 1000.0) for i in range(8)]
    return hgx_nodes(2), [*requests, Request(8, "tp8", 8, 300.0, 2000.0)]


class LoggedCluster(Cluster):
    """A cluster that records who takes and frees which GPUs, in order."""

    log: list = []

    def take(self, owner, gpus):
        gpus = list(gpus)
        LoggedCluster.log.append(("take", owner, tuple(gpus)))
        super().take(owner, gpus)

    def release(self, owner):
        gpus = super().release(owner)
        LoggedCluster.log.append(("release", owner, tuple(gpus)))
        return gpus


def test_the_replay_holds_source_and_copy_for_the_load_then_frees_the_source(monkeypatch):
    monkeypatch.setattr(defrag_replay_module, "Cluster", LoggedCluster)
    LoggedCluster.log = []
    nodes, requests = _two_boards_half_full()
    result = defrag_replay(nodes, requests, DefragConfig(wait_s=0.0, load_s=90.0, max_moved_gpus=2))
    # best fit alone waits for a board until 1000 s; the step moves the two TP-2 of one board to the other's hole
    assert replay(nodes, requests, "infercap").started[8] == 1000.0
    assert result.moves == 2 and result.plans == 1
    # the copies start at 300 s; the sources are freed, and the TP-8 starts, only once they have loaded
    assert sorted(result.move_log) in ([(300.0, 390.0, 2), (300.0, 390.0, 3)], [(300.0, 390.0, 6), (300.0, 390.0, 7)])
    assert result.started[8] == 390.0
    moved = [owner for _, _, owner in result.move_log]
    for owner in moved:
        copy_taken = LoggedCluster.log.index(next(e for e in LoggedCluster.log if e[:2] == ("take", ("copy", owner))))
        source_freed = max(i for i, e in enumerate(LoggedCluster.log) if e[:2] == ("release", owner) and e[2])
        assert copy_taken < source_freed
        assert next(e for e in LoggedCluster.log if e[:2] == ("take", ("copy", owner)))[2] != ()
    # the moved replicas kept serving throughout: allocation as if never moved
    assert result.allocated_gpu_s == replay(nodes, requests, "infercap").allocated_gpu_s + 8 * (1000.0 - 390.0)


def test_moves_are_not_free():
    nodes, requests = _two_boards_half_full()
    result = defrag_replay(nodes, requests, DefragConfig(wait_s=0.0, load_s=90.0, max_moved_gpus=2))
    # two TP-2 copies loading 90 s each, and the TP-8's 4 GPUs free already held for it meanwhile
    assert result.copy_gpu_s == 2 * 2 * 90.0 and result.reserved_gpu_s == 4 * 90.0
    assert result.started[8] == 300.0 + 90.0 and max(result.pending_s) == 90.0
    figures = result.figures()
    assert figures["moves"] == 2 and figures["copy_gpu_h"] == 0.1 and figures["reserved_gpu_h"] == 0.1


def test_a_replica_leaving_mid_copy_hands_its_gpus_to_the_waiting_group():
    nodes, requests = _two_boards_half_full()
    first = defrag_replay(nodes, requests, DefragConfig(wait_s=0.0, max_moved_gpus=2))
    leaving = first.move_log[0][2]
    requests = [r if r.id != leaving else Request(r.id, r.endpoint, 2, 0.0, 330.0) for r in requests]
    result = defrag_replay(nodes, requests, DefragConfig(wait_s=0.0, max_moved_gpus=2))
    # its copy is dropped at 330 s; its source is held for the TP-8, which starts with the other copy's load
    assert result.started[8] == 390.0 and (300.0, None, leaving) in result.move_log
    assert result.copy_gpu_s == 2 * 30.0 + 2 * 90.0 and result.reserved_gpu_s == 4 * 90.0 + 2 * 60.0


def test_on_a_random_stream_the_step_keeps_every_group_in_one_domain():
    from tests.capacity.test_placement import random_stream

    nodes, requests = random_stream(3)
    result = defrag_replay(nodes, requests, DefragConfig(wait_s=0.0, max_moved_gpus=4))
    assert result.groups_across_domains == 0 and result.moves > 0
    assert len(result.started) == len(replay(nodes, requests, "infercap").started)


def test_the_bench_ships_infercap_with_the_step_and_can_switch_it_off():
    from benchmarks.capacity import placement

    on = placement.run(quick=True, hours=4, seeds="1", progress=lambda _: None)
    off = placement.run(quick=True, hours=4, seeds="1", defrag="0", progress=lambda _: None)
    assert (
        on["placement.setup"]["defrag"]["wait_s"] == DefragConfig().wait_s and off["placement.setup"]["defrag"] is None
    )
    assert on["placement.infercap.moves"] > 0 and on["placement.infercap.copy_gpu_h"] > 0
    assert off["placement.infercap.moves"] == 0 and off["placement.infercap.copy_gpu_h"] == 0
    assert on["placement.infercap.groups_across_domains"] == 0 and on["placement.infercap.deadlocks"] == 0
    assert on["placement.infercap.moves_per_hour"] == round(on["placement.infercap.moves"] / 4, 2)
    # the bound, repack and the others replay the same stream either way
    assert on["placement.bound.pending_p99_s"] == off["placement.bound.pending_p99_s"]


def test_break_before_make_starts_the_group_at_once_and_counts_the_serving_lost():
    nodes, requests = _two_boards_half_full()
    config = DefragConfig(wait_s=0.0, load_s=90.0, max_moved_gpus=2, make_before_break=False)
    result = defrag_replay(nodes, requests, config)
    made = defrag_replay(nodes, requests, DefragConfig(wait_s=0.0, load_s=90.0, max_moved_gpus=2))
    # the sources are freed at once: the TP-8 starts when the plan is made, nothing is held for it
    assert result.started[8] == 300.0 and result.reserved_gpu_s == 0.0 and result.copy_gpu_s == 2 * 2 * 90.0
    # and the two moved TP-2 serve nothing while their copies load: 360 GPU-seconds off the allocation
    assert result.lost_serving_gpu_s == 2 * 2 * 90.0
    assert result.allocated_gpu_s == made.allocated_gpu_s + 8 * 90.0 - 2 * 2 * 90.0
    assert sorted(result.move_log)[0][:2] == (300.0, 390.0)
