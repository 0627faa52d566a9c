"""The precise prefix index follows the simulated engines' KV events exactly, and routers stop trusting it when
the events stop, lose batches or restart."""

import pytest

from capacity.hardware.profiles import get_profile
from gateway.routing import RouteRequest, make_router
from gateway.routing.kv_events import (
    AllBlocksCleared,
    BadEventBatch,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    batch_from,
)
from gateway.routing.kv_index import KVBlockIndex
from simulator.des import Simulation
from simulator.routing_workloads import prefix_groups
from simulator.workloads import poisson_times


def engine_cached_blocks(rep) -> set:
    """Every block hash the engine's prefix cache holds: in use, or free but still cached."""
    kv = rep.engine.kv
    return set(kv._ref) | {key for key in kv._free if not isinstance(key, tuple)}


def small_run(index: KVBlockIndex, *, router=None, until_s: float = 20.0, checks: list | None = None):
    profile = get_profile("tiny", num_gpu_blocks=120, max_model_len=2048)
    sim = Simulation(
        router=router or make_router("round_robin", seed=1),
        replicas=2,
        profile=profile,
        kv_event_sink=index.apply,
    )
    requests = prefix_groups(
        times=poisson_times(6.0, duration_s=until_s, seed=3),
        groups=12,
        prefix_tokens=128,
        question_tokens=32,
        output_tokens=24,
        seed=3,
    )
    return sim, sim.run(requests)


def test_events_keep_the_index_equal_to_the_engine_cache_through_evictions():
    index = KVBlockIndex()
    sim, result = small_run(index)
    evictions = sum(rep.engine.kv.evictions for rep in sim._all_replicas)
    assert evictions > 100  # 12 groups × 9 blocks each do not fit 120 blocks twice over: the LRU evicts
    for rep in sim._all_replicas:
        cached = engine_cached_blocks(rep)
        assert cached and index.blocks(rep.replica_id) == cached
    assert result.prefix_hit_rate() > 0


def test_all_blocks_cleared_empties_the_replica_and_a_restarted_publisher_starts_afresh():
    index = KVBlockIndex()
    sim, _ = small_run(index, until_s=6.0)
    rep = sim._all_replicas[0]
    rep.engine.kv.reset()  # vLLM's /reset_prefix_cache: nothing runs, every cached block goes
    sim._publish_kv_events(rep)
    assert index.blocks(rep.replica_id) == engine_cached_blocks(rep) == set()

    other = sim._all_replicas[1].replica_id
    assert index.size(other) > 0
    # A restarted engine's publisher counts from 0 again: its old blocks are gone.
    index.apply(other, 0, KVEventBatch(ts=99.0, events=[BlockStored(block_hashes=[7, 8])]))
    assert index.blocks(other) == {7, 8}
    assert index.usable(other, 99.5)


def test_lost_batches_make_a_replica_unusable_until_it_clears():
    index = KVBlockIndex()
    index.apply("a", 0, KVEventBatch(ts=1.0, events=[BlockStored(block_hashes=[1, 2, 3])]))
    index.apply("a", 1, KVEventBatch(ts=1.1, events=[BlockRemoved(block_hashes=[3])]))
    assert index.usable("a", 1.2) and index.match("a", [1, 2, 3]) == 2
    index.apply("a", 5, KVEventBatch(ts=2.0, events=[BlockStored(block_hashes=[9])]))  # 2, 3 and 4 were lost
    assert not index.usable("a", 2.0)
    index.apply("a", 6, KVEventBatch(ts=3.0, events=[AllBlocksCleared(), BlockStored(block_hashes=[4])]))
    assert index.usable("a", 3.0) and index.blocks("a") == {4}
    # A replayed (duplicate) batch changes nothing.
    index.apply("a", 6, KVEventBatch(ts=3.1, events=[BlockStored(block_hashes=[5])]))
    assert index.blocks("a") == {4}


def test_a_sequence_going_back_is_a_restarted_engine_even_when_its_first_batches_were_missed():
    index = KVBlockIndex()
    for seq in range(8):
        index.apply("a", seq, KVEventBatch(ts=1.0 + seq, events=[BlockStored(block_hashes=[seq])]))
    assert index.size("a") == 8
    # The subscriber reconnected after the new engine had published batches 0-2: 3 is its first one seen.
    index.apply("a", 3, KVEventBatch(ts=20.0, events=[BlockStored(block_hashes=[100])]))
    assert index.blocks("a") == {100} and index.usable("a", 20.0)
    # Its next batches follow on; a repeated one is still a duplicate.
    index.apply("a", 4, KVEventBatch(ts=21.0, events=[BlockStored(block_hashes=[101])]))
    index.apply("a", 4, KVEventBatch(ts=21.5, events=[BlockStored(block_hashes=[102])]))
    assert index.blocks("a") == {100, 101}


def test_a_dropped_publisher_is_not_trusted_until_its_next_batch_says_what_it_is():
    index = KVBlockIndex()
    index.apply("a", 0, KVEventBatch(ts=1.0, events=[BlockStored(block_hashes=[1, 2])]))
    index.disconnected("a")
    assert not index.usable("a", 1.0) and index.match("a", [1, 2]) == 2  # nothing forgotten yet
    # The same engine again (the link dropped, no batch lost): its blocks stand.
    index.apply("a", 1, KVEventBatch(ts=2.0, events=[]))
    assert index.usable("a", 2.0) and index.blocks("a") == {1, 2}
    # An engine that had published one batch restarts: the same sequence number, but after a drop.
    index.apply("b", 0, KVEventBatch(ts=1.0, events=[BlockStored(block_hashes=[5])]))
    index.disconnected("b")
    index.apply("b", 0, KVEventBatch(ts=9.0, events=[BlockStored(block_hashes=[6])]))
    assert index.blocks("b") == {6} and index.usable("b", 9.0)
    # Without a drop the same sequence number is a duplicate.
    index.apply("b", 0, KVEventBatch(ts=9.5, events=[BlockStored(block_hashes=[7])]))
    assert index.blocks("b") == {6}


def test_stopped_events_make_infercap_fall_back_to_its_approximate_index():
    index = KVBlockIndex(stale_after_s=1.0)
    router = make_router("infercap", seed=1, kv_index=index)
    sim, _ = small_run(index, router=router, until_s=4.0)
    replica = sim._all_replicas[0].replica_id
    hashes = sorted(index.blocks(replica))[:1]
    request = RouteRequest("probe", "x" * 64, extra={"kv_block_hashes": hashes})
    now = sim.clock.now()
    assert index.usable(replica, now)
    assert router.prefix_match(replica, request, [], now) == 1.0  # the events say the block is there
    # Events stop: a request is routed there and no batch follows within stale_after_s.
    sim.set_kv_events(replica, False)
    index.on_routed(replica, now)
    assert index.usable(replica, now + 0.5)
    assert not index.usable(replica, now + 1.5)
    assert router.prefix_match(replica, request, [], now + 1.5) == 0.0  # the approximate index (empty chain)


def test_stopped_delivery_shows_up_as_a_gap_when_it_resumes():
    index = KVBlockIndex()
    router = make_router("round_robin", seed=1)
    sim, _ = small_run(index, router=router, until_s=3.0)
    replica = sim._all_replicas[0]
    sim.set_kv_events(replica.replica_id, False)
    replica.engine.kv.events.append(BlockStored(block_hashes=[123]))
    sim._publish_kv_events(replica)  # dropped, but counted
    sim.set_kv_events(replica.replica_id, True)
    replica.engine.kv.events.append(BlockStored(block_hashes=[124]))
    sim._publish_kv_events(replica)
    assert 123 not in index.blocks(replica.replica_id) and 124 in index.blocks(replica.replica_id)
    assert not index.usable(replica.replica_id, sim.clock.now())


def test_vllm_payloads_decode_and_token_keyed_blocks_match_by_tokens():
    # The msgpack-decoded shape of vLLM 0.32's KVEventBatch: [ts, [tagged maps], dp_rank].
    payload = [
        5.0,
        [
            {
                "type": "BlockStored",
                "block_hashes": [b"h1", b"h2"],
                "parent_block_hash": None,
                "token_ids": list(range(32)),
                "block_size": 16,
                "lora_id": None,
                "medium": "GPU",
                "lora_name": None,
            },
            {
                "type": "BlockStored",
                "block_hashes": [b"h3"],
                "parent_block_hash": b"h2",
                "token_ids": list(range(32, 48)),
                "block_size": 16,
                "lora_id": None,
                "medium": "GPU",
            },
            {"type": "SomethingNewer", "x": 1},
        ],
        None,
    ]
    batch = batch_from(payload)
    assert [type(e).__name__ for e in batch.events] == ["BlockStored", "BlockStored"]
    index = KVBlockIndex()
    index.apply("r", 0, batch)
    assert index.match_tokens("r", list(range(60)), 16) == 3
    assert index.match_tokens("r", [99] + list(range(1, 60)), 16) == 0
    index.apply("r", 1, batch_from([6.0, [{"type": "BlockRemoved", "block_hashes": [b"h2"], "medium": "GPU"}], None]))
    assert index.match_tokens("r", list(range(60)), 16) == 1
    with pytest.raises(BadEventBatch):
        batch_from({"ts": 1})
