"""LoRA adapters on a simulated replica: slots, load time, unload and the per-step overhead (pure; docs/lora.md).

A replica started with ``--max-loras N`` holds at most N adapters. ``AdapterSlots`` is that table, shared by the
discrete-event runner and the HTTP replica:

* ``acquire(name, now)`` before a request naming adapter ``name`` enters the engine. A held adapter is ready at
  once (or when its load, already under way, ends); a missing one loads into a free slot, or into the slot of an
  adapter no request is using: the one the router's rule names (``victim``, e.g. infercap's least popular: the
  discrete-event runner passes ``gateway.routing.adapter_eviction.victim_chooser(router, replica)``, as the live proxy does),
  else the least recently used (``adapter_to_evict``, vLLM's own rule). Loads on one replica run one after another (one loader: the weights come over the same disk and
  PCIe link), so ``ready_at = max(now, loader free) + load time``. The request's TTFT counts that wait.
  ``LookupError`` when every slot holds an adapter in use: the request waits until one is released.
* ``release(name, now)`` when the request leaves; it stamps the adapter's last use (the LRU order, and the ties).

The per-step LoRA overhead (``step_factor``) is what batched LoRA kernels (Punica's SGMV, S-LoRA) add to a step:
a step whose batch holds any adapter request costs ``1 + overhead × max_rank / REFERENCE_RANK`` times the base
model's step (decode and prefill alike; the whole batch runs the LoRA kernels, base-model requests included).
``overhead`` is per profile (default 0.1: +10 % at rank 16); rank enters linearly, as the shrink/expand GEMMs'
FLOPs and bytes do.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gateway.routing.adapter_eviction import VictimChooser, choose_victim

REFERENCE_RANK = 16
DEFAULT_RANK = 8


def step_factor(ranks: Iterable[int], overhead: float) -> float:
    """Multiplier of a step's time for a batch whose sequences carry these LoRA ranks (0: the base model)."""
    top = max(ranks, default=0)
    return 1.0 + overhead * top / REFERENCE_RANK if top > 0 and overhead > 0 else 1.0


@dataclass
class LoraConfig:
    """How a simulated fleet serves adapters: slots per replica, each adapter's load time and rank, overhead."""

    max_loras: int = 8
    load_s: Callable[[str], float] = lambda name: 1.0
    rank: Callable[[str], int] = lambda name: DEFAULT_RANK
    overhead: float = 0.1  # step-time fraction at REFERENCE_RANK

    def __post_init__(self) -> None:
        if self.max_loras < 0:
            raise ValueError("max_loras must be ≥ 0")
        if self.overhead < 0:
            raise ValueError("overhead must be ≥ 0")


def uniform_load_times(names: Iterable[str], low_s: float, high_s: float, seed: int) -> dict[str, float]:
    """A fixed load time per adapter, uniform in [low_s, high_s] (its size on disk, drawn once)."""
    rng = random.Random(f"lora-load-{seed}")
    return {name: rng.uniform(low_s, high_s) for name in names}


@dataclass
class AdapterSlots:
    max_loras: int
    last_used: dict[str, float] = field(default_factory=dict)  # held adapters → last request time (LRU)
    ready_at: dict[str, float] = field(default_factory=dict)  # held adapters → when their load ends
    in_use: dict[str, int] = field(default_factory=dict)  # adapters → requests using them now
    paths: dict[str, str] = field(default_factory=dict)  # held adapters → artifact path (HTTP replica)
    loader_free_s: float = 0.0
    loads: int = 0
    unloads: int = 0
    victim: VictimChooser | None = None  # which idle adapter leaves at the limit (None: the LRU one)
    # Told (name) of every load, unload and request that runs with an adapter (the HTTP replica's admin log).
    on_event: Callable[[str, str], None] | None = None

    def holds(self, name: str) -> bool:
        return name in self.last_used

    def held(self) -> frozenset:
        return frozenset(self.last_used)

    def load(self, name: str, now: float, load_s: float) -> float:
        """Put ``name`` into a slot (evicting an idle adapter at the limit, ``victim``'s or the LRU one); returns
        when it is ready.
        Raises ``LookupError`` when every slot is in use and ``ValueError`` on a replica without slots."""
        if self.max_loras <= 0:
            raise ValueError("this replica serves no LoRA adapters (--max-loras 0)")
        if name in self.last_used:
            return self.ready_at[name]
        victim = choose_victim(self.last_used, self._busy(), self.max_loras, now, self.victim)
        if victim is not None:
            self.unload(victim)
        start = max(now, self.loader_free_s)
        self.loader_free_s = start + max(0.0, load_s)
        self.last_used[name] = now
        self.ready_at[name] = self.loader_free_s
        self.loads += 1
        if self.on_event is not None:
            self.on_event("load", name)
        return self.loader_free_s

    def acquire(self, name: str, now: float, load_s: float) -> float:
        """A request for ``name`` arrives: load it if needed; mark it in use. Returns when it can run."""
        ready = self.load(name, now, load_s)
        if self.on_event is not None:
            self.on_event("serve", name)
        self.in_use[name] = self.in_use.get(name, 0) + 1
        self.last_used[name] = now
        return ready

    def release(self, name: str, now: float) -> None:
        left = self.in_use.get(name, 0) - 1
        if left > 0:
            self.in_use[name] = left
        else:
            self.in_use.pop(name, None)
        if name in self.last_used:
            self.last_used[name] = now

    def unload(self, name: str) -> None:
        """Free ``name``'s slot (``KeyError`` when not held; ``RuntimeError`` while requests use it)."""
        if name not in self.last_used:
            raise KeyError(name)
        if self.in_use.get(name):
            raise RuntimeError(f"adapter {name!r} is in use")
        del self.last_used[name]
        self.ready_at.pop(name, None)
        if self.on_event is not None:
            self.on_event("unload", name)
        self.paths.pop(name, None)
        self.unloads += 1

    def _busy(self) -> set[str]:
        return {name for name, n in self.in_use.items() if n > 0}
