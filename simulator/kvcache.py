"""The simulated KV cache: a fixed pool of blocks with automatic prefix caching, as vLLM's block pool (pure).

Every free block waits in **one LRU free queue**, as in vLLM's ``FreeKVCacheBlockQueue``: allocation takes the
block at its head whether or not that block still holds a cached prefix (a cached block is evicted then), and a
request's blocks go back to its tail in reverse order, so its last blocks are reused first. At start-up the
queue holds every block, empty. Full prompt blocks are keyed by their chained hash (``tokens.block_hashes``) and
reference-counted while held; a hit takes a free cached block back out of the queue. Other blocks (a prompt's
partial last block, decode blocks) are anonymous: the queue keeps runs of them as counts, so a request of
thousands of blocks costs a few dictionary operations.

With ``events`` set to a list, the pool records vLLM's KV-cache events as its ``--kv-events-config`` publisher
emits them (``gateway.routing.kv_events``): ``BlockStored`` when a block is named by its hash, ``BlockRemoved``
when a cached block is evicted for reuse, ``AllBlocksCleared`` on reset. The simulated engine has no token ids,
so its ``BlockStored.token_ids`` is empty; consumers key on the block hashes.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Iterable, Sequence

from gateway.routing.kv_events import AllBlocksCleared, BlockRemoved, BlockStored


class KVCache:
    def __init__(self, num_blocks: int, block_size: int = 16):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._ref: dict[int, int] = {}  # hashed blocks in use → holders
        # The free queue, least recently freed first: a hash (one cached block) or ("run", n) → that many
        # anonymous blocks freed together.
        self._free: OrderedDict[object, int] = OrderedDict()
        self._runs = itertools.count()
        self._free_count = num_blocks
        self._cached_free = 0
        self._free[("run", next(self._runs))] = num_blocks
        self.evictions = 0  # cached blocks reused for something else
        self.events: list | None = None  # KV-cache events since the last drain, when publishing is on

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - self._free_count

    @property
    def free_blocks(self) -> int:
        """Blocks that can be allocated now (empty ones plus cached free ones, which get evicted)."""
        return self._free_count

    @property
    def cached_free_blocks(self) -> int:
        return self._cached_free

    @property
    def usage(self) -> float:
        """vllm:kv_cache_usage_perc: blocks in use / total."""
        return self.used_blocks / self.num_blocks

    def is_cached(self, block_hash: int) -> bool:
        return block_hash in self._ref or block_hash in self._free

    def match(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of this chain are cached (in use or free)."""
        n = 0
        for h in hashes:
            if h in self._ref or h in self._free:
                n += 1
            else:
                break
        return n

    def free_among(self, hashes: Iterable[int]) -> int:
        """How many of these cached blocks sit in the free queue (a hit on them takes a free block)."""
        return sum(1 for h in hashes if h in self._free)

    def touch(self, hashes: Sequence[int]) -> None:
        """Hold cached blocks (prefix hits): in-use ones gain a holder, free ones leave the queue."""
        ref, free = self._ref, self._free
        for h in hashes:
            holders = ref.get(h)
            if holders is not None:
                ref[h] = holders + 1
            else:
                del free[h]
                self._free_count -= 1
                self._cached_free -= 1
                ref[h] = 1

    def register(self, block_hash: int) -> bool:
        """Name one of the caller's held anonymous blocks (now full of prompt) by its hash, so later requests hit
        it; False when that hash is cached already (the caller's block stays a plain duplicate)."""
        if block_hash in self._ref or block_hash in self._free:
            return False
        self._ref[block_hash] = 1
        if self.events is not None:
            self._stored([block_hash])
        return True

    def _stored(self, hashes: list[int], parent: int | None = None) -> None:
        events = self.events
        last = events[-1] if events else None
        # Consecutive registrations of one request's chunk become one event, as vLLM stores a chunk's blocks.
        if type(last) is BlockStored and last.block_hashes and parent is None:
            last.block_hashes.extend(hashes)
        else:
            events.append(BlockStored(block_hashes=list(hashes), parent_block_hash=parent, block_size=self.block_size))

    def acquire(self, hashes: Sequence[int], anon_blocks: int) -> None:
        """Hold a chain of hashed blocks (hits reuse cached ones, misses get new blocks) and ``anon_blocks`` more."""
        cached = [h for h in hashes if h in self._ref or h in self._free]
        missing = [h for h in hashes if h not in self._ref and h not in self._free]
        self.touch(cached)
        self.grow(len(missing) + anon_blocks)
        for h in missing:
            self.register(h)

    def grow(self, anon_blocks: int) -> None:
        if anon_blocks > 0:
            self._take(anon_blocks)

    def release(self, hashes: Sequence[int], anon_blocks: int, output_hashes: Sequence[int] = ()) -> None:
        """Free a request's blocks to the queue's tail, last block first (vLLM frees in reverse order).

        ``output_hashes`` name full blocks of generated tokens among its anonymous ones: they stay cached too
        (vLLM hashes every full block), unless an equal block is cached already (then this copy is plain)."""
        free = self._free
        kept = [h for h in output_hashes if h not in self._ref and h not in free][:anon_blocks]
        plain = anon_blocks - len(kept)
        if plain > 0:
            free[("run", next(self._runs))] = plain
        for h in reversed(kept):
            free[h] = 1
        self._cached_free += len(kept)
        if kept and self.events is not None:
            self.events.append(
                BlockStored(block_hashes=list(kept), parent_block_hash=None, block_size=self.block_size)
            )
        ref = self._ref
        for h in reversed(hashes):
            holders = ref[h] - 1
            if holders:
                ref[h] = holders
            else:
                del ref[h]
                free[h] = 1
                self._cached_free += 1
        self._free_count += anon_blocks + sum(1 for h in hashes if h not in ref)

    def _take(self, n: int) -> None:
        """Pop ``n`` blocks off the queue's head, evicting the cached ones among them."""
        if n > self._free_count:
            raise RuntimeError("KV cache over-allocated")  # the scheduler checks free_blocks first
        free = self._free
        left = n
        while left:
            key, count = next(iter(free.items()))
            if isinstance(key, tuple):
                used = min(count, left)
                if used == count:
                    del free[key]
                else:
                    free[key] = count - used
                left -= used
            else:
                del free[key]
                self._cached_free -= 1
                self.evictions += 1
                left -= 1
                if self.events is not None:
                    self.events.append(BlockRemoved(block_hashes=[key]))
        self._free_count -= n

    def reset(self) -> None:
        """Forget every free cached block (vLLM's /reset_prefix_cache); the blocks stay in the queue, empty."""
        queue = OrderedDict()
        for key, count in self._free.items():
            queue[key if isinstance(key, tuple) else ("run", next(self._runs))] = count
        self._free = queue
        self._cached_free = 0
        if self.events is not None:
            self.events.append(AllBlocksCleared())

    def drain_events(self) -> list:
        """The events recorded since the last drain (empty when publishing is off)."""
        events = self.events
        if not events:
            return []
        self.events = []
        return events
