"""llm-d's default scheduler profile: queue (weight 2), kv-cache utilization (2) and prefix cache (3) scorers,
then the max-score picker (pure).

Scorer formulas as in llm-d's inference scheduler: queue = (maxQ − q) / (maxQ − minQ) over the candidates
(1 for all when equal), kv = 1 − kv_cache_usage, prefix = matched blocks / prompt blocks from the
router-side prefix index. Both queue and kv come from scraped metrics only, so between scrapes every
request sees the same picture; that is llm-d's behaviour and part of what the comparison measures.
"""

from collections.abc import Sequence

from endpoints.routing.base import ReplicaView, RouteRequest
from endpoints.routing.baselines import RouterBase
from endpoints.routing.prefix import DEFAULT_INDEX_BLOCKS, MAX_PREFIX_BLOCKS, PREFIX_BLOCK_CHARS, PrefixIndex

HASHES_KEY = "_prefix_hashes"


def request_hashes(index: PrefixIndex, request: RouteRequest) -> list[int]:
    """The request's chained block hashes, computed once and kept on the request for ``on_routed``."""
    hashes = request.extra.get(HASHES_KEY)
    if hashes is None:
        hashes = request.extra[HASHES_KEY] = index.hashes_for(request.prompt_text, request.extra.get("cache_salt", ""))
    return hashes


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
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.queue_weight, self.kv_weight, self.prefix_weight = queue_weight, kv_weight, prefix_weight
        self.prefix_index = PrefixIndex(block_chars, max_blocks)
        # llm-d's approximate prefix scorer keeps a fixed LRU per server (lruCapacityPerServer, 31,250 blocks),
        # whatever the replica's real KV cache holds; sizing it from cache_config_info is infercap's addition.
        self.lru_capacity_per_server = lru_capacity_per_server

    def pick(self, request: RouteRequest, replicas: Sequence[ReplicaView], now: float) -> str | None:
        candidates = self.candidates(replicas)
        if not candidates:
            return None
        hashes = request_hashes(self.prefix_index, request)
        queue = queue_scores(candidates)
        scored = []
        for r in candidates:
            score = (
                self.queue_weight * queue[r.replica_id]
                + self.kv_weight * kv_score(r)
                + self.prefix_weight * self.prefix_index.match_fraction(r.replica_id, hashes)
            )
            scored.append((score, r))
        return self._random_best(scored)

    def on_routed(self, request: RouteRequest, replica_id: str, now: float) -> None:
        self.prefix_index.record_fixed(
            replica_id, request_hashes(self.prefix_index, request), self.lru_capacity_per_server
        )
