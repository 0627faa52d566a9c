"""The simulated KV cache: a fixed pool of blocks with automatic prefix caching (pure).

Blocks holding a prompt's full 16-token blocks are keyed by their chained hash (``tokens.block_hashes``)
and reference-counted; when the last holder finishes, a block stays cached but becomes *free*, at the tail
of an LRU queue (a request's blocks in reverse order, so its tail blocks are evicted first, as vLLM does).
A hit takes the block back out of the queue. A block's hash is forgotten only when the block is reused
(evicted from the LRU head). Decode blocks and partial prompt blocks are anonymous (never shared).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class KVCache:
    def __init__(self, num_blocks: int, block_size: int = 16):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._ref: dict[int, int] = {}  # hashed blocks in use → holders
        self._lru: OrderedDict[int, None] = OrderedDict()  # cached, free (evictable) hashed blocks
        self._anon = 0  # anonymous blocks in use
        self.evictions = 0

    @property
    def used_blocks(self) -> int:
        return len(self._ref) + self._anon

    @property
    def free_blocks(self) -> int:
        """Blocks that can be allocated now (empty ones plus cached free ones, which get evicted)."""
        return self.num_blocks - self.used_blocks

    @property
    def cached_free_blocks(self) -> int:
        return len(self._lru)

    @property
    def usage(self) -> float:
        """vllm:kv_cache_usage_perc: blocks in use / total."""
        return self.used_blocks / self.num_blocks

    def match(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of this chain are cached (in use or free)."""
        n = 0
        for h in hashes:
            if h in self._ref or h in self._lru:
                n += 1
            else:
                break
        return n

    def probe(self, hashes: Sequence[int]) -> tuple[int, int]:
        """(leading blocks cached, blocks already in use by others): a new holder of ``hashes`` takes
        ``total_blocks - in_use`` free blocks and gets ``leading`` blocks without prefill."""
        ref, lru = self._ref, self._lru
        leading, in_use, chain = 0, 0, True
        for h in hashes:
            if h in ref:
                in_use += 1
            elif chain and h not in lru:
                chain = False
            if chain:
                leading += 1
        return leading, in_use

    def acquire(self, hashes: Sequence[int], anon_blocks: int) -> None:
        """Take the hashed blocks (hits reuse cached ones, misses get new blocks) and ``anon_blocks`` more."""
        ref, lru = self._ref, self._lru
        missing = [h for h in hashes if h not in ref and h not in lru]
        self._make_room(len(missing) + anon_blocks)
        for h in hashes:
            holders = ref.get(h)
            if holders is not None:
                ref[h] = holders + 1
            else:
                lru.pop(h, None)
                ref[h] = 1
        self._anon += anon_blocks

    def grow(self, anon_blocks: int) -> None:
        if anon_blocks <= 0:
            return
        self._make_room(anon_blocks)
        self._anon += anon_blocks

    def release(self, hashes: Sequence[int], anon_blocks: int, output_hashes: Sequence[int] = ()) -> None:
        """Free a request's blocks. ``output_hashes`` name full blocks of generated tokens among its anonymous
        ones: they stay cached too (vLLM hashes every full block), tail first in the LRU, unless an equal block
        is cached already (then this copy is simply freed)."""
        for h in reversed(output_hashes):
            if h not in self._ref and h not in self._lru:
                self._lru[h] = None
        for h in reversed(hashes):
            holders = self._ref[h] - 1
            if holders:
                self._ref[h] = holders
            else:
                del self._ref[h]
                self._lru[h] = None
        self._anon -= anon_blocks

    def _make_room(self, n: int) -> None:
        """Evict enough free cached blocks (oldest first) for ``n`` new blocks."""
        lru = self._lru
        short = n - (self.num_blocks - len(self._ref) - self._anon - len(lru))
        if short <= 0:
            return
        if short > len(lru):
            raise RuntimeError("KV cache over-allocated")  # the scheduler checks free_blocks first
        for _ in range(short):
            lru.popitem(last=False)
        self.evictions += short

    def reset(self) -> None:
        """Drop every free cached block (vLLM's /reset_prefix_cache)."""
        self._lru.clear()
