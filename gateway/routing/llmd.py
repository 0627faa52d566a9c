"""llm-d's default scheduler profile: queue (weight 2), kv-cache utilization (2) and prefix cache (3) scorers,
then the max-score picker (pure).

Scorer formulas as in llm-d's inference scheduler: queue = (maxQ − q) / (maxQ − minQ) over the candidates
(1 for all when equal), kv = 1 − kv_cache_usage, prefix = matched blocks / prompt blocks from the
router-side prefix index. Both queue and kv come from scraped metrics only, so between scrapes every
request sees the same picture; that is llm-d's behaviour and part of what the comparison measures.

The approximate prefix index's LRU per server is sized from the pod's ``vllm:cache_config_info`` (num_gpu_blocks ×
block_size tokens), as llm-d's prefix-cache scorer does with auto-tuning on, else ``lruCapacityPerServer``.
``LlmdPreciseRouter`` is llm-d's precise prefix-cache scorer in the same profile: the prefix score comes from a
``KVBlockIndex`` fed by the engines' KV-cache events instead of from what the router has sent.
"""

from collections.abc import Sequence

from gateway.routing.base import ReplicaView, RouteRequest
from gateway.routing.baselines import RouterBase
from gateway.routing.kv_index import KVBlockIndex, token_block_keys
from gateway.routing.prefix import (
    DEFAULT_INDEX_BLOCKS,
    MAX_PREFIX_BLOCKS,
    PREFIX_BLOCK_CHARS,
    PrefixIndex,
    index_blocks_for,
)

HASHES_KEY = "_prefix_hashes"


def request_hashes(index: PrefixIndex, request: RouteRequest) -> list[int]:
    """The request's chained block hashes, computed once and kept on the request for ``on_routed``."""
    hashes = request.extra.get(HASHES_KEY)
    if hashes is None:
        hashes = request.extra[HASHES_KEY] = index.hashes_for(request.prompt_text, request.extra.get("cache_salt", ""))
    return hashes


KV_HASHES_KEY = "kv_block_hashes"


KV_TOKENS_KEY = "kv_token_ids"  # the prompt's token ids, as the engine tokenizes it (the live proxy sets them)
_KV_KEYS = "_kv_token_keys"  # their chained block keys per block size, computed once per request


def kv_match_fraction(index: KVBlockIndex, replica_id: str, request: RouteRequest) -> float | None:
    """Matched / total engine blocks of the prompt on the replica, from KV events: by the engine's block hashes
    (the simulator) or by the prompt's token ids (the live proxy); None with neither, or before the replica's
    events said its block size, or for a prompt shorter than one block."""
    hashes = request.extra.get(KV_HASHES_KEY)
    if hashes:
        return index.match(replica_id, hashes) / len(hashes)
    tokens = request.extra.get(KV_TOKENS_KEY)
    block_size = index.block_size(replica_id) if tokens else 0
    if block_size <= 0 or len(tokens) < block_size:
        return None
    by_size = request.extra.setdefault(_KV_KEYS, {})
    keys = by_size.get(block_size)
    if keys is None:
        keys = by_size[block_size] = token_block_keys(tokens, block_size)
    return index.match_keys(replica_id, keys) / len(keys)


def queue_scores(replicas: Sequence[ReplicaView]) -> dict[str, float]:
    queues = [r.num_waiting for r in replicas]
    low, high = min(queues), max(queues)
    if high == low:
        return {r.replica_id: 1.0 for r in replicas}
    return {r.replica_id: (high - r.num_waiting) / (high - low) for r in replicas}


def kv_score(replica: ReplicaView) -> float:
    return 1.0 - min(1.0, max(0.0, replica.kv_usage))


class LlmdRouter(RouterBase):
    name = "llmd"

    def __init__(
        self,
        *,
        queue_weight: float = 2.0,
        kv_weight: float = 2.0,
        prefix_weight: float = 3.0,
        block_chars: int = PREFIX_BLOCK_CHARS,
        max_blocks: int = MAX_PREFIX_BLOCKS,
        lru_capacity_per_server: int = DEFAULT_INDEX_BLOCKS,
        auto_tune: bool = True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.queue_weight, self.kv_weight, self.prefix_weight = queue_weight, kv_weight, prefix_weight
        self.prefix_index = PrefixIndex(block_chars, max_blocks)
        # Without auto-tuning llm-d keeps a fixed LRU per server (lruCapacityPerServer, 31,250 blocks), whatever
        # the replica's KV cache holds; with it (the default), the LRU holds what the pod's GPU blocks hold.
        self.lru_capacity_per_server = lru_capacity_per_server
        self.auto_tune = auto_tune
        self._capacity: dict[str, int] = {}

    def pick(self, request: RouteRequest, replicas: Sequence[ReplicaView], now: float) -> str | None:
        candidates = self.candidates(replicas, request)
        if not candidates:
            return None
        hashes = request_hashes(self.prefix_index, request)
        queue = queue_scores(candidates)
        scored = []
        for r in candidates:
            if self.auto_tune and r.num_gpu_blocks > 0:
                self._capacity[r.replica_id] = index_blocks_for(
                    r.num_gpu_blocks, r.block_size, self.prefix_index.block_chars
                )
            score = (
                self.queue_weight * queue[r.replica_id]
                + self.kv_weight * kv_score(r)
                + self.prefix_weight * self.prefix_score(r.replica_id, request, hashes)
            )
            scored.append((score, r))
        return self._random_best(scored)

    def prefix_score(self, replica_id: str, request: RouteRequest, hashes: list[int]) -> float:
        return self.prefix_index.match_fraction(replica_id, hashes)

    def on_routed(self, request: RouteRequest, replica_id: str, now: float) -> None:
        capacity = self._capacity.get(replica_id, self.lru_capacity_per_server)
        self.prefix_index.record_fixed(replica_id, request_hashes(self.prefix_index, request), capacity)


class LlmdPreciseRouter(LlmdRouter):
    """llm-d's profile with the precise prefix-cache scorer: matched blocks from the engines' KV events.

    No fallback: a replica whose events stopped scores what the index last knew (llm-d's behaviour)."""

    name = "llmd_precise"

    def __init__(self, *, kv_index: KVBlockIndex | None = None, **kwargs):
        super().__init__(**kwargs)
        self.kv_index = kv_index if kv_index is not None else KVBlockIndex()

    def prefix_score(self, replica_id: str, request: RouteRequest, hashes: list[int]) -> float:
        fraction = kv_match_fraction(self.kv_index, replica_id, request)
        return 0.0 if fraction is None else fraction

    def on_routed(self, request: RouteRequest, replica_id: str, now: float) -> None:
        return None
