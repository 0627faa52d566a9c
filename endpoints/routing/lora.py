"""Which LoRA adapter leaves a replica's slots when another must load (pure; docs/lora.md).

vLLM holds at most ``--max-loras`` adapters on a replica's GPU; loading one more at the limit needs a slot freed
first. The adapter to unload is the least recently used one that no request on the replica is using: unloading an
adapter in use would fail its requests, and LRU keeps the popular adapters resident.
"""

from collections.abc import Collection, Mapping


def adapter_to_evict(last_used: Mapping[str, float], in_use: Collection[str], max_loras: int) -> str | None:
    """The adapter to unload before one more can load on a replica holding ``last_used`` (adapter → last request
    time), or None when a slot is free. Raises ``LookupError`` when every slot holds an adapter in use (the new
    adapter must wait or go elsewhere)."""
    if len(last_used) < max_loras:
        return None
    idle = [(t, name) for name, t in last_used.items() if name not in in_use]
    if not idle:
        raise LookupError("every adapter slot holds an adapter in use")
    return min(idle)[1]
