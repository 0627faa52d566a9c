"""Prefix affinity: chained hashes of prompt text and a per-replica LRU index of the blocks routed there (pure).

This follows llm-d's prefix-cache scorer: the prompt text is cut into 64-character blocks (about 16
tokens), block i's hash covers blocks 0..i (so a match on block i implies a match on all before it),
at most 256 blocks are considered, and each replica's index is an LRU whose size approximates the
replica's KV cache so that the router forgets prefixes the replica has likely evicted.
"""

from collections import OrderedDict
from collections.abc import Sequence

PREFIX_BLOCK_CHARS = 64
MAX_PREFIX_BLOCKS = 256
# llm-d's default LRU capacity per server when the cache size is unknown.
DEFAULT_INDEX_BLOCKS = 31_250
# Rough English/code average; only used to convert the replica's KV size (tokens) into text blocks.
CHARS_PER_TOKEN = 4.0


def prefix_hashes(
    text: str, block_chars: int = PREFIX_BLOCK_CHARS, max_blocks: int = MAX_PREFIX_BLOCKS, salt: str = ""
) -> list[int]:
    """Chained hashes of the full blocks of ``text``; the trailing partial block is ignored like vLLM does."""
    hashes: list[int] = []
    parent = hash(("infercap-prefix", salt))
    full_blocks = min(len(text) // block_chars, max_blocks)
    for i in range(full_blocks):
        parent = hash((parent, text[i * block_chars : (i + 1) * block_chars]))
        hashes.append(parent)
    return hashes


def index_blocks_for(num_gpu_blocks: int, block_size: int, block_chars: int = PREFIX_BLOCK_CHARS) -> int:
    """How many text blocks a replica's KV cache holds, from ``vllm:cache_config_info``."""
    if num_gpu_blocks <= 0 or block_size <= 0:
        return DEFAULT_INDEX_BLOCKS
    tokens = num_gpu_blocks * block_size
    return max(1, int(tokens * CHARS_PER_TOKEN / block_chars))


class ReplicaPrefixIndex:
    """The LRU set of block hashes one replica has been sent."""

    def __init__(self, capacity_blocks: int):
        self.capacity_blocks = max(1, capacity_blocks)
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def resize(self, capacity_blocks: int) -> None:
        self.capacity_blocks = max(1, capacity_blocks)
        self._evict()

    def add(self, hashes: Sequence[int]) -> None:
        """Touch a request's blocks, tail first, so that a shared head stays newest and is evicted last (as vLLM)."""
        blocks = self._blocks
        for h in reversed(hashes):
            if h in blocks:
                blocks.move_to_end(h)
            else:
                blocks[h] = None
        self._evict()

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._blocks

    def match_blocks(self, hashes: Sequence[int]) -> int:
        """Length of the longest run of leading hashes present in the index."""
        blocks = self._blocks
        matched = 0
        for h in hashes:
            if h not in blocks:
                break
            matched += 1
        return matched

    def _evict(self) -> None:
        blocks = self._blocks
        while len(blocks) > self.capacity_blocks:
            blocks.popitem(last=False)


class PrefixIndex:
    """Per-replica prefix indexes for one endpoint, sized from each replica's cache config."""

    def __init__(self, block_chars: int = PREFIX_BLOCK_CHARS, max_blocks: int = MAX_PREFIX_BLOCKS):
        self.block_chars = block_chars
        self.max_blocks = max_blocks
        self._replicas: dict[str, ReplicaPrefixIndex] = {}

    def hashes_for(self, text: str, salt: str = "") -> list[int]:
        return prefix_hashes(text, self.block_chars, self.max_blocks, salt)

    def _index(self, replica_id: str, num_gpu_blocks: int = 0, block_size: int = 16) -> ReplicaPrefixIndex:
        index = self._replicas.get(replica_id)
        capacity = index_blocks_for(num_gpu_blocks, block_size, self.block_chars)
        if index is None:
            index = self._replicas[replica_id] = ReplicaPrefixIndex(capacity)
        elif num_gpu_blocks > 0 and capacity != index.capacity_blocks:
            index.resize(capacity)
        return index

    def match_fraction(self, replica_id: str, hashes: Sequence[int]) -> float:
        if not hashes:
            return 0.0
        index = self._replicas.get(replica_id)
        return index.match_blocks(hashes) / len(hashes) if index else 0.0

    def record(self, replica_id: str, hashes: Sequence[int], num_gpu_blocks: int = 0, block_size: int = 16) -> None:
        self._index(replica_id, num_gpu_blocks, block_size).add(hashes)

    def record_fixed(self, replica_id: str, hashes: Sequence[int], capacity_blocks: int) -> None:
        """Record with a fixed index size, whatever the replica's cache (llm-d's lruCapacityPerServer)."""
        index = self._replicas.get(replica_id)
        if index is None:
            index = self._replicas[replica_id] = ReplicaPrefixIndex(capacity_blocks)
        elif index.capacity_blocks != max(1, capacity_blocks):
            index.resize(capacity_blocks)
        index.add(hashes)

    def forget(self, replica_id: str) -> None:
        """Drop a replica's index (it restarted or left): its cache is empty now."""
        self._replicas.pop(replica_id, None)

    def fill(self, replica_id: str) -> float:
        """How full the replica's index is (0–1): a proxy for how much cached prefix it already carries."""
        index = self._replicas.get(replica_id)
        return len(index) / index.capacity_blocks if index else 0.0

    def holds(self, replica_id: str, block_hash: int) -> bool:
        """Whether the replica's index still holds this block (not evicted from the LRU)."""
        index = self._replicas.get(replica_id)
        return index is not None and block_hash in index

    def size(self, replica_id: str) -> int:
        index = self._replicas.get(replica_id)
        return len(index) if index else 0


class PrefixHeads:
    """The distinct prompt heads (prefix groups) each replica holds, eviction-aware through the prefix index.

    A head is the stable hash of a prompt's first blocks (``infercap.home_key``); it counts on a replica while
    the block that opens it is still in that replica's LRU index, so a head the cache has dropped stops counting.
    Kept per replica in least-recently-routed order and pruned from the old end, O(1) amortized per request.
    Each copy remembers when it was made (a sequence number, not a clock): the oldest copy of a head is its
    *primary*, the replica the group lives on; later copies are spill-overs. ``count`` counts only copies routed
    ``min_requests`` times or more (a group, not a one-off prompt).
    """

    def __init__(self, max_heads: int = 4096, min_requests: int = 1):
        self.max_heads = max(1, max_heads)
        self.min_requests = max(1, min_requests)
        self._heads: dict[str, OrderedDict[int, list]] = {}  # head → [first block, copy number, requests]
        self._counted: dict[str, int] = {}  # per replica: copies with at least min_requests requests
        self._copies = 0

    def record(self, replica_id: str, head: int, first_block: int, index: PrefixIndex) -> None:
        heads = self._heads.setdefault(replica_id, OrderedDict())
        entry = heads.get(head)
        if entry is None or entry[0] != first_block or not index.holds(replica_id, entry[0]):
            if entry is not None:
                self._uncount(replica_id, entry)
            self._copies += 1
            entry = [first_block, self._copies, 0]
        entry[2] += 1
        if entry[2] == self.min_requests:
            self._counted[replica_id] = self._counted.get(replica_id, 0) + 1
        heads[head] = entry
        heads.move_to_end(head)
        self._prune(replica_id, index)

    def _uncount(self, replica_id: str, entry: list) -> None:
        if entry[2] >= self.min_requests:
            self._counted[replica_id] -= 1

    def _prune(self, replica_id: str, index: PrefixIndex) -> None:
        heads = self._heads.get(replica_id)
        while heads and (len(heads) > self.max_heads or not index.holds(replica_id, next(iter(heads.values()))[0])):
            _, entry = heads.popitem(last=False)
            self._uncount(replica_id, entry)

    def copy_number(self, replica_id: str, head: int, index: PrefixIndex) -> int | None:
        """When the replica's copy of ``head`` was made (lower = older), or None when it holds none."""
        heads = self._heads.get(replica_id)
        entry = heads.get(head) if heads else None
        return entry[1] if entry is not None and index.holds(replica_id, entry[0]) else None

    def has(self, replica_id: str, head: int, index: PrefixIndex) -> bool:
        return self.copy_number(replica_id, head, index) is not None

    def count(self, replica_id: str, index: PrefixIndex) -> int:
        self._prune(replica_id, index)
        return self._counted.get(replica_id, 0)

    def forget(self, replica_id: str) -> None:
        self._heads.pop(replica_id, None)
        self._counted.pop(replica_id, None)
