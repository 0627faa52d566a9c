"""The LoRA-affinity baseline given infercap's popularity history: the same filter tree, LFU evictions
(docs/lora.md#bench-lora)."""

from gateway.routing.adapter_eviction import victim_chooser
from gateway.routing.base import ReplicaView, RouteRequest
from gateway.routing.lora_affinity import LoraAffinityLfuRouter, LoraAffinityRouter


def test_given_the_history_a_full_replica_unloads_the_least_popular_idle_adapter_not_the_least_recent():
    router = LoraAffinityLfuRouter(seed=0, adapter_history={"hot": 2.0, "rare": 0.001})
    chooser = victim_chooser(router, "r0")
    last_used = {"hot": 1.0, "rare": 9.0}  # vLLM's LRU would unload 'hot'
    assert chooser(last_used, set(), 10.0) == "rare"
    assert chooser(last_used, {"rare"}, 10.0) == "hot"  # never one in use
    assert victim_chooser(LoraAffinityRouter(seed=0), "r0") is None  # the plain filter leaves vLLM's LRU


def test_without_history_the_live_rates_decide_and_the_routing_is_the_plain_filters():
    router, plain = LoraAffinityLfuRouter(seed=3), LoraAffinityRouter(seed=3)
    for i in range(5):
        router.on_routed(RouteRequest(f"q{i}", "", adapter="busy"), "r0", now=float(i))
        router.on_finished(RouteRequest(f"q{i}", "", adapter="busy"), "r0", now=float(i) + 0.5)
    router.on_routed(RouteRequest("q9", "", adapter="once"), "r0", now=6.0)
    router.on_finished(RouteRequest("q9", "", adapter="once"), "r0", now=6.5)
    assert router.adapter_victim("r0", {"busy": 4.5, "once": 6.5}, set(), 7.0) == "once"
    pods = [
        ReplicaView(replica_id="a", adapters=frozenset({"x"}), active_adapters=frozenset({"x"}), max_loras=2),
        ReplicaView(replica_id="b", max_loras=2),
    ]
    request = RouteRequest("q", "", adapter="x")
    assert router.pick(request, pods, 0.0) == plain.pick(request, pods, 0.0) == "a"
