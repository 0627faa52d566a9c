"""LoRA routing: the shared filter, the Gateway API inference extension's baseline and infercap's placement."""

import pytest

from gateway.routing import POLICIES, make_router
from gateway.routing.base import ReplicaView, RouteRequest
from gateway.routing.lora_affinity import LoraAffinityRouter, lowest_range
from gateway.routing.lora_placement import BUSY_SLOTS_COST, AdapterBook
from tests.routing.test_policies import make


def view(rid: str, *, adapters=(), active=(), max_loras=4, waiting=0, kv=0.0, mu=0.0, in_flight=None) -> ReplicaView:
    return ReplicaView(
        replica_id=rid,
        adapters=frozenset(adapters),
        active_adapters=frozenset(active),
        max_loras=max_loras,
        num_waiting=waiting,
        kv_usage=kv,
        in_flight_mu=mu,
        in_flight=round(mu) if in_flight is None else in_flight,  # one MU a request unless told
    )


def ask(adapter: str | None = "ft-a", rid: str = "q") -> RouteRequest:
    return RouteRequest(request_id=rid, prompt_text="hello " * 20, adapter=adapter)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_no_policy_sends_an_adapter_request_to_a_replica_without_lora_slots(policy):
    router = make(policy, seed=3)
    replicas = [view("plain", max_loras=0), view("lora", max_loras=2)]
    picks = {router.pick(ask(rid=f"q{i}"), replicas, now=float(i)) for i in range(20)}
    assert picks == {"lora"}
    # The base model may still go anywhere, and with no LoRA replica an adapter request has nowhere to go.
    assert router.pick(ask(None), [view("plain", max_loras=0)], now=30.0) == "plain"
    assert router.pick(ask(), [view("plain", max_loras=0)], now=31.0) is None


def test_lora_affinity_keeps_pods_running_the_adapter():
    router = LoraAffinityRouter(seed=1)
    replicas = [view("a", active={"ft-a"}), view("b"), view("c", active={"x", "y", "z", "w"})]
    assert {router.pick(ask(rid=str(i)), replicas, 0.0) for i in range(50)} == {"a"}


def test_lora_affinity_threshold_sends_some_to_pods_with_room():
    router = LoraAffinityRouter(seed=1, threshold=0.5)
    replicas = [view("a", active={"ft-a"}), view("b")]
    picks = [router.pick(ask(rid=str(i)), replicas, 0.0) for i in range(200)]
    assert 60 < picks.count("b") < 140


def test_lora_affinity_without_affinity_uses_pods_with_room_and_then_least_queue():
    router = LoraAffinityRouter(seed=1)
    full = view("full", active={"x", "y"}, max_loras=2)
    roomy_busy, roomy_idle = view("busy", waiting=40), view("idle", waiting=1)
    assert {router.pick(ask(rid=str(i)), [full, roomy_busy, roomy_idle], 0.0) for i in range(30)} == {"idle"}
    # Every pod full: the affinity filter leaves none and hands its input on (least queue decides).
    full2 = view("full2", active={"p", "q"}, max_loras=2, waiting=9)
    assert router.pick(ask(), [full, full2], 0.0) == "full"


def test_lora_affinity_reads_running_adapters_not_idle_loaded_ones():
    # The extension sees vllm:lora_requests_info: an adapter loaded but idle is invisible to it.
    loaded_idle = view("loaded", adapters={"ft-a"}, waiting=5)
    other = view("other", waiting=0)
    assert LoraAffinityRouter(seed=1).pick(ask(), [loaded_idle, other], 0.0) == "other"
    assert LoraAffinityRouter(seed=1, use_loaded_adapters=True).pick(ask(), [loaded_idle, other], 0.0) == "loaded"


def test_lora_affinity_queue_branch_puts_least_queue_before_affinity():
    # Every pod over the low-queue threshold: least queue first, then affinity among the least queued.
    router = LoraAffinityRouter(seed=1, queue_threshold=10)
    holder = view("holder", active={"ft-a"}, waiting=200)
    short = view("short", waiting=20)
    assert router.pick(ask(), [holder, short], 0.0) == "short"


def test_lowest_range_keeps_the_first_slice():
    pods = [view(str(q), waiting=q) for q in (0, 3, 4, 10)]
    assert [p.replica_id for p in lowest_range(pods, lambda p: p.num_waiting)] == ["0"]  # (10 − 0) // 4 = 2
    assert len(lowest_range(pods[:2], lambda p: p.num_waiting)) == 1


def test_infercap_prefers_a_replica_holding_the_adapter_within_the_bound():
    router = make_router("infercap", seed=1)
    replicas = [view("cold", mu=0.0), view("holder", adapters={"ft-a"}, mu=1.0), view("other", mu=0.5)]
    assert router.pick(ask(), replicas, 0.0) == "holder"


def test_infercap_replicates_a_hot_adapter_when_its_holder_is_over_the_bound():
    router = make_router("infercap", seed=1, load_slack=0.0)
    # The holder at 4.5x the mean load: over the holders' bound (1.5x).
    others = [view(name, mu=1.0) for name in "bcde"]
    assert router.pick(ask(), [view("holder", adapters={"ft-a"}, mu=40.0), *others], 0.0) in set("bcde")


def test_infercap_keeps_a_nearly_idle_holder_beyond_the_bound():
    # At low traffic the bound is a request or two: a holder with three requests in flight is over it, yet a decode
    # step over three sequences costs about what one does, while a load costs 0.5-2 s and evicts an adapter.
    router = make_router("infercap", seed=1, load_slack=0.0)
    others = [view(name, mu=0.0) for name in "bcde"]
    assert router.pick(ask(), [view("holder", adapters={"ft-a"}, mu=3.0), *others], 0.0) == "holder"
    # Not when its engine queues requests, nor past idle_holder_requests.
    queued = view("holder", adapters={"ft-a"}, mu=3.0, waiting=1)
    assert router.pick(ask(), [queued, *others], 0.0) in set("bcde")
    strict = make_router("infercap", seed=1, load_slack=0.0, idle_holder_requests=3)
    assert strict.pick(ask(), [view("holder", adapters={"ft-a"}, mu=3.0), *others], 0.0) in set("bcde")


def test_the_books_history_keeps_a_steady_adapter_over_one_just_used_once():
    # Both idle on a full replica; "steady" had a request a minute ago and gets one every few minutes (the last day
    # says so), "once" was used a second ago and never before. The live rate alone evicts "steady".
    def routed(router):
        for name, at in (("steady", 40.0), ("once", 99.0)):
            router.on_routed(ask(name, name), "r1", at)
            router.on_finished(ask(name, name), "r1", at)
        return router

    full = view("r1", adapters={"steady", "once"}, max_loras=2)
    live_only = routed(make_router("infercap", seed=1))
    assert live_only.adapter_book.victim(full, 100.0) == "steady"
    with_history = routed(make_router("infercap", seed=1, adapter_history={"steady": 1 / 300}))
    assert with_history.adapter_book.victim(full, 100.0) == "once"
    # The proxy replaces the history with each snapshot.
    with_history.set_adapter_history({})
    assert with_history.adapter_book.victim(full, 100.0) == "steady"


def test_infercap_loads_a_new_adapter_where_the_evicted_one_is_least_popular():
    router = make_router("infercap", seed=1)
    now = 100.0
    # "hot" is requested often and lives on r1; "rare" once on r2; both replicas are full (2 slots).
    for i in range(30):
        router.on_routed(ask("hot", f"h{i}"), "r1", now - 30 + i)
        router.on_finished(ask("hot", f"h{i}"), "r1", now - 30 + i)
    for name, rid in (("rare", "r2"), ("old1", "r1"), ("old2", "r2")):
        router.on_routed(ask(name, name), rid, now - 50)
        router.on_finished(ask(name, name), rid, now - 50)
    r1 = view("r1", adapters={"hot", "old1"}, max_loras=2)
    r2 = view("r2", adapters={"rare", "old2"}, max_loras=2)
    assert (
        router.pick(ask("new"), [r1, r2], now) == "r2"
    )  # r1's least popular idle adapter is old1, r2's rare or old2 …
    book = router.adapter_book
    assert book.victim(r1, now) == "old1" and book.victim(r2, now) in {"rare", "old2"}


def test_adapter_book_costs_free_idle_and_busy_slots():
    book = AdapterBook()
    free = view("free", adapters={"a"}, max_loras=2)
    assert book.load_cost(free, "new", 0.0) == 0.0
    book.on_routed("a", "busy", 0.0)
    book.on_routed("b", "busy", 0.0)
    busy = view("busy", adapters={"a", "b"}, max_loras=2)
    assert book.load_cost(busy, "new", 1.0) == BUSY_SLOTS_COST
    book.on_finished("b", "busy", 1.0)
    assert 0.0 < book.load_cost(busy, "new", 1.0) <= 1.0 and book.victim(busy, 1.0) == "b"
    assert book.pending_on("busy", "a") and not book.pending_on("busy", "b")


def test_infercap_keeps_an_adapter_where_its_requests_are_on_their_way():
    # A load under way is not in the replica's adapter list yet; the router's own in-flight count says where.
    router = make_router("infercap", seed=1)
    replicas = [view("r1"), view("r2"), view("r3")]
    first = router.pick(ask(rid="1"), replicas, 0.0)
    router.on_routed(ask(rid="1"), first, 0.0)
    assert all(router.pick(ask(rid=str(i)), replicas, 0.1) == first for i in range(2, 6))


def test_infercap_rejects_an_adapter_bound_below_the_load_bound():
    with pytest.raises(ValueError, match="adapter_load_bound"):
        make_router("infercap", load_bound=1.5, adapter_load_bound=1.2)


@pytest.mark.parametrize("adapter", ["ft-a", None])
def test_adapter_requests_weigh_load_by_their_own_weight(adapter):
    """A request naming an adapter weighs relative load by ``adapter_load_weight``, any other by ``load_weight``:
    between a replica holding its prompt and a less loaded one, whichever weight is large decides."""
    replicas = [view("holder", adapters={"ft-a"}, mu=10.0), view("idle", adapters={"ft-a"}, mu=9.0)]
    picks = {}
    for name, weights in {"adapter_heavy": (0.0, 50.0), "plain_heavy": (50.0, 0.0)}.items():
        router = make_router("infercap", seed=1, load_weight=weights[0], adapter_load_weight=weights[1])
        warm = RouteRequest(request_id="w", prompt_text="hello " * 200, adapter=adapter, mu=1.0)
        router.on_routed(warm, "holder", 0.0)
        request = RouteRequest(request_id="r", prompt_text="hello " * 200, adapter=adapter, mu=1.0)
        picks[name] = router.pick(request, replicas, 1.0)
    heavy = "adapter_heavy" if adapter else "plain_heavy"
    light = "plain_heavy" if adapter else "adapter_heavy"
    assert picks[heavy] == "idle" and picks[light] == "holder"
