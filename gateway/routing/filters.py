"""The filter step every policy shares: healthy, not draining, serving the request's adapter, fresh metrics, below the
concurrency limit (pure)."""

from collections.abc import Sequence

from gateway.routing.base import ReplicaView

# llm-d's saturation detector treats metrics older than this as saturated.
METRICS_STALE_AFTER_S = 2.0


def routable(replicas: Sequence[ReplicaView]) -> list[ReplicaView]:
    """Replicas that may receive traffic at all: healthy and not draining."""
    return [r for r in replicas if r.healthy and not r.draining]


def serves_adapters(replica: ReplicaView) -> bool:
    """It was started with LoRA slots (``--enable-lora --max-loras N``); without, an adapter's name is a 404 there."""
    return replica.max_loras > 0


def has_free_slot(replica: ReplicaView) -> bool:
    return replica.in_flight < replica.concurrency_limit


def is_fresh(replica: ReplicaView, stale_after_s: float = METRICS_STALE_AFTER_S) -> bool:
    return replica.metrics_age_s <= stale_after_s


def eligible(
    replicas: Sequence[ReplicaView], stale_after_s: float = METRICS_STALE_AFTER_S, adapter: str | None = None
) -> list[ReplicaView]:
    """Replicas that can take one more request now (for ``adapter``: only those with LoRA slots, docs/lora.md).

    A replica whose metrics are stale counts as saturated, because a replica we cannot see may be the
    one that hung; but when every candidate is stale (the scraper itself is behind) we fail open rather
    than refuse all traffic. The concurrency limit is the router's own count, so it holds even then.
    """
    candidates = [r for r in routable(replicas) if has_free_slot(r) and (adapter is None or serves_adapters(r))]
    fresh = [r for r in candidates if is_fresh(r, stale_after_s)]
    return fresh if fresh else candidates
