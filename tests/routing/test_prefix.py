"""Chained prefix hashes and the per-replica LRU index (pure)."""

from gateway.routing.prefix import (
    DEFAULT_INDEX_BLOCKS,
    PrefixHeads,
    PrefixIndex,
    ReplicaPrefixIndex,
    index_blocks_for,
    prefix_hashes,
)


def test_hashes_are_chained_over_full_64_char_blocks_capped_at_256():
    a = prefix_hashes("x" * 64 * 3 + "tail")
    assert len(a) == 3
    # Same block text at a different position hashes differently (the chain includes the parent).
    assert len(set(a)) == 3
    b = prefix_hashes("x" * 64 * 2 + "y" * 64)
    assert a[:2] == b[:2] and a[2] != b[2]
    assert len(prefix_hashes("z" * 64 * 1000)) == 256
    assert prefix_hashes("short") == []
    assert prefix_hashes("x" * 64, salt="t1") != prefix_hashes("x" * 64, salt="t2")


def test_match_counts_leading_blocks_only():
    index = ReplicaPrefixIndex(100)
    stored = prefix_hashes("a" * 64 * 5)
    index.add(stored)
    assert index.match_blocks(stored) == 5
    assert index.match_blocks(prefix_hashes("a" * 64 * 3 + "b" * 64 * 2)) == 3
    assert index.match_blocks(prefix_hashes("b" * 64 * 5)) == 0


def test_lru_evicts_least_recent_and_tail_blocks_first():
    index = ReplicaPrefixIndex(6)
    old = prefix_hashes("o" * 64 * 4)
    new = prefix_hashes("n" * 64 * 4)
    index.add(old)
    index.add(new)
    assert len(index) == 6
    assert index.match_blocks(new) == 4
    # The old prompt lost its tail blocks, keeping its head: like vLLM freeing a request's blocks tail first.
    assert index.match_blocks(old) == 2


def test_index_size_comes_from_cache_config():
    # 1,000 GPU blocks × 16 tokens × 4 chars/token / 64 chars per block = 1,000 text blocks.
    assert index_blocks_for(1000, 16) == 1000
    assert index_blocks_for(0, 16) == DEFAULT_INDEX_BLOCKS
    index = PrefixIndex()
    hashes = index.hashes_for("p" * 64 * 50)
    index.record("r0", hashes, num_gpu_blocks=10, block_size=16)
    assert index.size("r0") == 10
    assert index.match_fraction("r0", hashes) == 0.2  # only the head fits; the tail was evicted first
    index.record("r1", hashes, num_gpu_blocks=100, block_size=16)
    assert index.match_fraction("r1", hashes) == 1.0
    index.forget("r1")
    assert index.match_fraction("r1", hashes) == 0.0


def test_prefix_heads_count_distinct_heads_and_forget_the_evicted_ones():
    index, heads = PrefixIndex(), PrefixHeads()
    group = [prefix_hashes(f"{g}" * 64 * 20) for g in range(3)]
    for g, hashes in enumerate(group):
        index.record_fixed("r0", hashes, 64)  # room for 3 × 20 blocks, with 4 to spare
        heads.record("r0", g, hashes[15], index)
        heads.record("r0", g, hashes[15], index)  # the same head again is still one head
    assert heads.count("r0", index) == 3 and heads.has("r0", 1, index)
    # A fourth prompt evicts the oldest head's blocks from the LRU index: that head stops counting.
    fourth = prefix_hashes("z" * 64 * 20)
    index.record_fixed("r0", fourth, 64)
    heads.record("r0", 3, fourth[15], index)
    assert not heads.has("r0", 0, index)
    assert heads.count("r0", index) == 3 and heads.count("r1", index) == 0
    heads.forget("r0")
    assert heads.count("r0", index) == 0
