"""``lora_affinity``: the Gateway API inference extension's default filter tree for LoRA, as a baseline (pure).

As read in kubernetes-sigs/gateway-api-inference-extension, ``pkg/epp/scheduling/scheduler_test.go`` (commit
db78c67, the default profile it tests) with the filters of ``pkg/epp/scheduling/framework/plugins/filter/``
(``lora_affinity_filter.go``, ``low_queue_filter.go``, ``least_queue_filter.go``, ``least_kvcache_filter.go``,
``decision_tree_filter.go``):

    low queue (waiting ≤ 128) ── pods left ──▶ LoRA affinity ─▶ least queue ─▶ least KV cache ─▶ random pick
                              └─ none ───────▶ least queue ─▶ LoRA affinity ─▶ least KV cache ─▶ random pick

* LoRA affinity: pods whose metrics show the adapter (``ActiveModels`` or ``WaitingModels``, the running and waiting
  adapter lists of ``vllm:lora_requests_info``) form the affinity group; pods without it but with room
  (``len(active) + len(waiting) < max_lora``) the available group. With both groups non-empty the affinity group is
  kept with probability ``threshold`` (0.999), else the available one; otherwise whichever is non-empty.
* least queue / least KV cache: the pods within the lowest ``(max − min) / pods`` of the range of waiting requests
  (of KV-cache usage).
* a filter that leaves no pod hands the pods it was given to the next filter (``NextOnSuccessOrFailure``).

The pods' adapter lists are ``ReplicaView.active_adapters``: adapters with requests running or waiting, not every
adapter loaded, as the extension sees them. ``use_loaded_adapters=True`` gives it the loaded adapters instead
(``ReplicaView.adapters``), a variant the extension cannot run (vLLM's metrics do not list idle adapters).

``LoraAffinityLfuRouter`` is the same tree given what infercap is given (docs/lora.md#bench-lora): the adapters'
request history from the books and its own decayed request rates (``lora_placement.AdapterBook``, infercap's book),
by which a full replica unloads its least popular idle adapter (LFU with aging) instead of vLLM's least recently
used one. A baseline only: it measures what the popularity history is worth without infercap's placement.
"""

from collections.abc import Collection, Mapping, Sequence

from gateway.routing.base import ReplicaView, RouteRequest
from gateway.routing.baselines import RouterBase
from gateway.routing.lora_placement import AdapterBook

QUEUEING_THRESHOLD_LORA = 128  # config.DefaultQueueingThresholdLoRA
LORA_AFFINITY_THRESHOLD = 0.999  # config.DefaultLoraAffinityThreshold


def low_queue(pods: Sequence[ReplicaView], threshold: int = QUEUEING_THRESHOLD_LORA) -> list[ReplicaView]:
    return [p for p in pods if p.num_waiting <= threshold]


def lowest_range(pods: Sequence[ReplicaView], value) -> list[ReplicaView]:
    """Pods whose ``value`` lies in the first of ``len(pods)`` equal slices of [min, max] (least queue/KV filters).
    The queue filter divides integers (Go's int division); the KV one floats."""
    values = [value(p) for p in pods]
    low, high = min(values), max(values)
    width = (high - low) // len(pods) if isinstance(low, int) and isinstance(high, int) else (high - low) / len(pods)
    return [p for p, v in zip(pods, values, strict=True) if low <= v <= low + width]


class LoraAffinityRouter(RouterBase):
    name = "lora_affinity"

    def __init__(
        self,
        *,
        threshold: float = LORA_AFFINITY_THRESHOLD,
        queue_threshold: int = QUEUEING_THRESHOLD_LORA,
        use_loaded_adapters: bool = False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not 0.0 <= threshold <= 1.0:
            raise ValueError("threshold must be in [0, 1]")
        self.threshold, self.queue_threshold = threshold, queue_threshold
        self.use_loaded_adapters = use_loaded_adapters

    def adapters_of(self, pod: ReplicaView) -> frozenset:
        return pod.adapters if self.use_loaded_adapters else pod.active_adapters

    def lora_affinity(self, request: RouteRequest, pods: Sequence[ReplicaView]) -> list[ReplicaView]:
        if request.adapter is None:
            return list(pods)  # a base-model request: every pod "has" the base model
        affinity, available = [], []
        for pod in pods:
            held = self.adapters_of(pod)
            if request.adapter in held:
                affinity.append(pod)
            elif len(held) < pod.max_loras:
                available.append(pod)
        if affinity and available:
            return affinity if self.rng.random() < self.threshold else available
        return affinity or available

    def pick(self, request: RouteRequest, replicas: Sequence[ReplicaView], now: float) -> str | None:
        pods = self.candidates(replicas, request)
        if not pods:
            return None
        low = low_queue(pods, self.queue_threshold)
        if low:
            steps = (lambda p: self.lora_affinity(request, p), self._least_queue, self._least_kv)
            pods = low
        else:
            steps = (self._least_queue, lambda p: self.lora_affinity(request, p), self._least_kv)
        for step in steps:
            pods = step(pods) or pods  # an empty result passes the filter's input on
        return self.rng.choice(pods).replica_id

    @staticmethod
    def _least_queue(pods: Sequence[ReplicaView]) -> list[ReplicaView]:
        return lowest_range(pods, lambda p: p.num_waiting)

    @staticmethod
    def _least_kv(pods: Sequence[ReplicaView]) -> list[ReplicaView]:
        return lowest_range(pods, lambda p: float(p.kv_usage))


class LoraAffinityLfuRouter(LoraAffinityRouter):
    """The LoRA-affinity tree with infercap's popularity book deciding evictions (the module's docstring)."""

    name = "lora_affinity_lfu"

    def __init__(
        self,
        *,
        adapter_history: Mapping[str, float] | None = None,
        popularity_tau_s: float = 60.0,
        history_weight: float = 10.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        # infercap's own defaults (bounded_affinity.InfercapRouter), so the two read the history alike.
        self.adapter_book = AdapterBook(popularity_tau_s, history_rates=adapter_history, history_weight=history_weight)

    def on_routed(self, request: RouteRequest, replica_id: str, now: float) -> None:
        if request.adapter is not None:
            self.adapter_book.on_routed(request.adapter, replica_id, now)

    def on_finished(self, request: RouteRequest, replica_id: str, now: float) -> None:
        if request.adapter is not None:
            self.adapter_book.on_finished(request.adapter, replica_id, now)

    def adapter_victim(
        self, replica_id: str, last_used: Mapping[str, float], in_use: Collection[str], now: float
    ) -> str:
        """The idle adapter a full replica unloads (``adapter_eviction.EvictionRule``): the least popular."""
        return self.adapter_book.victim_among(last_used, in_use, now)
