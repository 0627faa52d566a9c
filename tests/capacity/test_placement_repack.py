"""The repack ceiling (simulator/placement/repack.py, docs/placement.md "The bench"): free migration, but every group
whole inside one domain, no node past its GPUs, and never more admitted than the pooled bound could hold."""

import random

import pytest

from placement.cluster import Cluster, hgx_nodes, rack
from simulator.placement import repack as repack_module
from simulator.placement.repack import pack, repack_replay
from simulator.placement.replay import Request, replay
from tests.capacity.test_placement import random_stream

BENCH_NODES = hgx_nodes(8) + rack("nvl72-a", nodes=18, gpus=4)  # the bench's cluster: 136 GPUs


class CheckedCluster(Cluster):
    """A cluster that fails the test on a group taken across domains or past a node's GPUs."""

    def take(self, owner, gpus):
        gpus = list(gpus)
        assert len(self.domains_of(gpus)) == 1, (owner, gpus)
        assert all(g.index < self.node[g.node].gpus for g in gpus)
        super().take(owner, gpus)


@pytest.fixture
def checked(monkeypatch):
    monkeypatch.setattr(repack_module, "Cluster", CheckedCluster)


def test_a_group_waits_where_free_gpus_are_split_across_domains_even_with_free_migration(checked):
    # Given two 4-GPU nodes, each its own domain, each holding a 3-GPU group: 2 GPUs free, one per domain
    nodes = hgx_nodes(2, gpus=4)
    requests = [Request(0, "a", 3, 0.0, 100.0), Request(1, "b", 3, 0.0, 100.0), Request(2, "c", 2, 10.0, 200.0)]
    # When a 2-GPU group arrives, the pooled bound starts it at once; repack cannot, however it re-places the others
    assert replay(nodes, requests, "bound").started[2] == 10.0
    result = repack_replay(nodes, requests)
    # Then it waits for a release, and no group ever spans the two nodes
    assert result.started[2] == 100.0 and result.groups_across_domains == 0


def test_repack_moves_a_small_group_to_open_a_board_that_infercap_waits_for(checked):
    # Given two 8-GPU boards holding two TP-4 replicas each, and one replica leaving each board at 50 s
    nodes = hgx_nodes(2)
    requests = [Request(i, f"tp4-{i}", 4, 0.0, 50.0 if i in (0, 2) else 500.0) for i in range(4)]
    requests.append(Request(4, "tp8", 8, 60.0, 600.0))
    infercap, result = replay(nodes, requests, "infercap"), repack_replay(nodes, requests)
    # When a TP-8 arrives with 4 GPUs free on each board: infercap waits for a board, repack moves one TP-4
    assert infercap.started[4] == 500.0
    assert result.started[4] == 60.0 and (result.repacks, result.moved) == (1, 1)


def test_a_packing_exists_exactly_when_the_pool_and_the_rack_hold_it(checked):
    # The bench's cluster, groups of its sizes: room for a set exactly when its GPUs fit the 136 and its 16-GPU
    # groups (rack only, 4 whole trays each) fit the rack's 18 trays; a pooled packing would take a fifth one
    rng = random.Random(7)
    for _ in range(300):
        sizes = [rng.choice([1, 2, 4, 8, 16]) for _ in range(rng.randint(1, 40))]
        placement = pack(BENCH_NODES, list(enumerate(sizes)))
        assert (placement is not None) == (sum(sizes) <= 136 and sizes.count(16) <= 4), sizes
        if placement:
            assert {i: len(gpus) for i, gpus in placement.items()} == dict(enumerate(sizes))
            assert len({g for gpus in placement.values() for g in gpus}) == sum(sizes)
    assert pack(BENCH_NODES, list(enumerate([16] * 5))) is None


@pytest.mark.parametrize("seed", [1, 2])
def test_on_a_random_stream_repack_admits_only_sets_that_pack_and_the_pool_holds(checked, seed):
    nodes, requests = random_stream(seed)
    result = repack_replay(nodes, requests)
    assert result.groups_across_domains == 0 and result.repacks > 0
    for time_s in set(result.started.values()):
        running = [r for r in requests if r.id in result.started and result.started[r.id] <= time_s < r.release_s]
        assert sum(r.size for r in running) <= 40
        assert pack(nodes, [(r.id, r.size) for r in running]) is not None
