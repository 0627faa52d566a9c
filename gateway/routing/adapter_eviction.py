"""Which LoRA adapter leaves a replica's slots when another must load (pure; docs/lora.md).

vLLM holds at most ``--max-loras`` adapters on a replica's GPU; loading one more at the limit needs a slot freed
first. Only an adapter no request on the replica is using may leave: unloading one in use would fail its requests.
Two rules pick among the idle ones:

* ``adapter_to_evict``: the least recently used (vLLM's own LRU, which the Gateway API inference extension relies
  on; the rule for every router that names none).
* ``least_popular_to_evict``: the one with the lowest popularity (infercap's, an exponentially decayed request rate
  over the whole fleet: LFU with aging), ties and adapters never seen by LRU. A popular adapter between two of its
  requests outlives a rare one that happened to be used last; LRU evicts it and pays a load for it again.

A router may name its rule with ``adapter_victim(replica_id, last_used, in_use, now)`` (``EvictionRule``); the
simulator's slots and the live proxy's load manager both ask ``choose_victim``, so they evict alike.
"""

from collections.abc import Callable, Collection, Mapping
from typing import Protocol

# (last_used, in_use, now) → the idle adapter to unload on a full replica; LookupError when every one is in use.
VictimChooser = Callable[[Mapping[str, float], Collection[str], float], str]


class EvictionRule(Protocol):
    def adapter_victim(
        self, replica_id: str, last_used: Mapping[str, float], in_use: Collection[str], now: float
    ) -> str: ...


def adapter_to_evict(last_used: Mapping[str, float], in_use: Collection[str], max_loras: int) -> str | None:
    """The adapter to unload before one more can load on a replica holding ``last_used`` (adapter → last request
    time), or None when a slot is free. Raises ``LookupError`` when every slot holds an adapter in use (the new
    adapter must wait or go elsewhere)."""
    if len(last_used) < max_loras:
        return None
    return least_recent_to_evict(last_used, in_use)


def least_recent_to_evict(last_used: Mapping[str, float], in_use: Collection[str]) -> str:
    """Among the idle adapters of a full replica, the least recently used. ``LookupError``: every one is in use."""
    idle = [(t, name) for name, t in last_used.items() if name not in in_use]
    if not idle:
        raise LookupError("every adapter slot holds an adapter in use")
    return min(idle)[1]


def least_popular_to_evict(
    last_used: Mapping[str, float], in_use: Collection[str], popularity: Callable[[str], float]
) -> str:
    """Among the idle adapters of a full replica, the one with the lowest ``popularity``, ties (adapters never
    counted: 0) by least recent use. Raises ``LookupError`` when every adapter is in use."""
    idle = [(popularity(name), t, name) for name, t in last_used.items() if name not in in_use]
    if not idle:
        raise LookupError("every adapter slot holds an adapter in use")
    return min(idle)[2]


def choose_victim(
    last_used: Mapping[str, float],
    in_use: Collection[str],
    max_loras: int,
    now: float,
    chooser: VictimChooser | None = None,
) -> str | None:
    """``adapter_to_evict`` with the eviction itself left to ``chooser`` (a router's rule) when there is one."""
    if len(last_used) < max_loras or chooser is None:
        return adapter_to_evict(last_used, in_use, max_loras)
    return chooser(last_used, in_use, now)


def victim_chooser(router: object, replica_id: str) -> VictimChooser | None:
    """The router's eviction rule bound to one replica, or None for a router without one (LRU)."""
    rule = getattr(router, "adapter_victim", None)
    if rule is None:
        return None
    return lambda last_used, in_use, now: rule(replica_id, last_used, in_use, now)
