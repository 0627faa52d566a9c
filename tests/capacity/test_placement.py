"""The placement policies and their replay (placement, docs/placement.md): a per-GPU scheduler deadlocks
where gang placement does not, infercap never puts a group across interconnect domains, and its best fit keeps whole
nodes and racks free for the large groups."""

import random

import pytest

from placement.cluster import Cluster, Gpu, Node, hgx_nodes, rack
from placement.policies import gang_first_fit, group_fit, groups_that_fit, infercap_best_fit, visible_devices
from simulator.placement.replay import Request, fluid_allocation, replay


def _cluster(nodes, holds=()):
    cluster = Cluster(nodes)
    for owner, gpus in holds:
        cluster.take(owner, gpus)
    return cluster


def test_naive_deadlocks_on_two_full_node_groups_asked_together_and_gang_does_not():
    # Given one 8-GPU node and two TP-8 replicas asked for at the same moment
    requests = [Request(1, "a", 8, 0.0, 100.0), Request(2, "b", 8, 0.0, 100.0)]
    naive = replay(hgx_nodes(1), requests, "naive")
    # then the per-GPU scheduler gives each half a node and neither ever starts
    assert naive.deadlocks == 1 and naive.started == {} and naive.deadlocked_s == 100.0
    assert naive.figures()["gpu_allocation"] == 0.0
    for policy in ("gang", "infercap"):
        run = replay(hgx_nodes(1), requests, policy)
        assert run.deadlocks == 0 and run.started == {1: 0.0}, policy


def test_a_naive_deadlock_lasts_until_a_holder_is_withdrawn():
    # Given a full node, two TP-4 replicas and then a TP-8 one wait; at t=10 the node frees and the three split it
    requests = [Request(0, "x", 8, 0.0, 10.0), Request(1, "a", 4, 1.0, 60.0), Request(2, "b", 4, 1.0, 60.0)]
    naive = replay(hgx_nodes(1), requests + [Request(3, "c", 8, 2.0, 50.0)], "naive")
    infercap = replay(hgx_nodes(1), requests, "infercap")
    assert infercap.started == {0: 0.0, 1: 10.0, 2: 10.0}
    # then nothing starts until the TP-8 request is withdrawn at t=50 and gives back what it held
    assert naive.deadlocks == 1 and naive.deadlocked_s == 40.0 and naive.started == {0: 0.0, 1: 50.0, 2: 50.0}
    assert naive.held_idle_gpu_s == 8 * 40.0


def test_infercap_keeps_a_whole_node_free_for_a_full_node_group():
    # Given two 8-GPU nodes with node 0 holding 4 GPUs: a TP-4 replica goes beside them (best fit), not to node 1
    cluster = _cluster(hgx_nodes(2), [("r", [Gpu("hgx-00", i) for i in range(4)])])
    gpus = infercap_best_fit(cluster, 4)
    assert {g.node for g in gpus} == {"hgx-00"}
    cluster.take("s", gpus)
    assert {g.node for g in infercap_best_fit(cluster, 8)} == {"hgx-01"}


def test_first_fit_gang_splits_a_group_over_two_nodes_where_infercap_waits_for_one():
    # Given 3 free GPUs on node 0 and 2 on node 1 (5 free, no node with 4)
    holds = [("r", [Gpu("hgx-00", i) for i in range(5)]), ("s", [Gpu("hgx-01", i) for i in range(6)])]
    cluster = _cluster(hgx_nodes(2), holds)
    gpus = gang_first_fit(cluster, 4)
    assert len(cluster.domains_of(gpus)) == 2
    assert infercap_best_fit(cluster, 4) is None


def test_small_groups_stay_off_an_empty_rack_while_a_board_has_room():
    cluster = _cluster(hgx_nodes(1) + rack("nvl", nodes=4, gpus=4))
    assert {g.node for g in infercap_best_fit(cluster, 2)} == {"hgx-00"}
    cluster.take("big", [Gpu("hgx-00", i) for i in range(8)])
    first = infercap_best_fit(cluster, 2)
    cluster.take("a", first)
    # the next small group fills the same rack node rather than opening another
    assert {g.node for g in infercap_best_fit(cluster, 2)} == {g.node for g in first}


def test_a_group_larger_than_a_node_takes_whole_nodes_of_one_rack_domain():
    nodes = hgx_nodes(2) + rack("nvl-a", nodes=4, gpus=4) + rack("nvl-b", nodes=6, gpus=4)
    cluster = _cluster(nodes, [("r", [Gpu("nvl-b-00", 0)])])
    gpus = infercap_best_fit(cluster, 16)
    # best fit: rack a has exactly four free nodes; rack b has five, one of them partly held
    assert cluster.domains_of(gpus) == {"nvl-a"} and len({g.node for g in gpus}) == 4
    assert infercap_best_fit(cluster, 12) and infercap_best_fit(cluster, 24) is None
    assert group_fit(cluster, 16).nodes == 4 and not group_fit(cluster, 32).fits
    assert not group_fit(Cluster(hgx_nodes(4)), 16).fits  # boards alone never hold a 16-GPU group


def test_islands_inside_a_node_are_domains():
    # A PCIe node with NVLink pairs: a TP-2 group stays inside one pair, a TP-4 group has no domain
    cluster = _cluster([Node("pcie", 8, island=2)], [("r", [Gpu("pcie", 0), Gpu("pcie", 2)])])
    gpus = infercap_best_fit(cluster, 2)
    assert len(cluster.domains_of(gpus)) == 1 and gpus == (Gpu("pcie", 4), Gpu("pcie", 5))
    assert infercap_best_fit(cluster, 4) is None and not group_fit(cluster, 4).fits
    with pytest.raises(ValueError, match="divide"):
        Node("bad", 8, island=3)


def random_stream(seed: int) -> tuple[list, list[Request]]:
    """Three HGX boards and a 16-GPU rack, and 300 replicas of 1-16 GPUs arriving over 1,000 s."""
    rng = random.Random(seed)
    nodes = hgx_nodes(3) + rack("nvl", nodes=4, gpus=4)
    requests = []
    for i in range(300):
        arrive = rng.uniform(0, 1000)
        requests.append(Request(i, f"e{i % 7}", rng.choice([1, 2, 4, 8, 16]), arrive, arrive + rng.uniform(5, 120)))
    return nodes, requests


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_infercap_never_crosses_a_domain_nor_deadlocks_on_a_random_stream(seed):
    nodes, requests = random_stream(seed)
    infercap = replay(nodes, requests, "infercap")
    gang = replay(nodes, requests, "gang")
    assert infercap.groups_across_domains == 0 and infercap.deadlocks == 0
    assert gang.groups_across_domains > 0  # the stream does stress topology
    assert infercap.multi_node_groups > 0  # and the 16-GPU groups ran on the rack
    assert replay(nodes, requests, "bound").allocated_gpu_s <= fluid_allocation(requests, 40) * infercap.demanded_gpu_s


def test_inside_a_rack_a_group_takes_equal_shares_of_partly_used_nodes():
    # Given a rack of four 4-GPU nodes, each with 2 GPUs held: no node is free, 8 GPUs are
    cluster = _cluster(
        rack("nvl", nodes=4, gpus=4), [(f"r{i}", [Gpu(f"nvl-{i:02d}", 0), Gpu(f"nvl-{i:02d}", 1)]) for i in range(4)]
    )
    gpus = infercap_best_fit(cluster, 8)
    # then a TP-8 group runs as 2 GPUs on each node, inside the one NVLink domain
    assert len(gpus) == 8 and len({g.node for g in gpus}) == 4 and cluster.domains_of(gpus) == {"nvl"}
    # and where a whole node is free it takes whole nodes first (fewest pods)
    cluster.release("r0")
    cluster.release("r1")
    assert {g.node for g in infercap_best_fit(cluster, 8)} == {"nvl-00", "nvl-01"}


def test_capacity_in_whole_groups():
    # Given two boards with 3 and 5 free GPUs (8 free in all): room for one TP-4 replica, not two, and no TP-8
    holds = [("r", [Gpu("hgx-00", i) for i in range(5)]), ("s", [Gpu("hgx-01", i) for i in range(3)])]
    cluster = _cluster(hgx_nodes(2), holds)
    assert (groups_that_fit(cluster, 4), groups_that_fit(cluster, 8), groups_that_fit(cluster, 1)) == (1, 0, 8)
    assert cluster.free_count() == 8  # the count leaves the cluster as it was
    assert visible_devices(infercap_best_fit(cluster, 4)) == {"hgx-01": "3,4,5,6"}
