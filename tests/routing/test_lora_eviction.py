"""Which adapter leaves a full replica: LRU (vLLM's, the baselines') and infercap's least popular (docs/lora.md)."""

import pytest

from gateway.routing import make_router
from gateway.routing.adapter_eviction import adapter_to_evict, choose_victim, least_popular_to_evict, victim_chooser
from gateway.routing.base import ReplicaView, RouteRequest


def test_a_free_slot_needs_no_eviction():
    assert adapter_to_evict({"a": 1.0}, in_use=set(), max_loras=2) is None


def test_the_least_recently_used_idle_adapter_leaves():
    last_used = {"a": 3.0, "b": 1.0, "c": 2.0}
    assert adapter_to_evict(last_used, in_use=set(), max_loras=3) == "b"
    assert adapter_to_evict(last_used, in_use={"b"}, max_loras=3) == "c"


def test_all_slots_busy_is_an_error_not_an_eviction_of_a_running_adapter():
    with pytest.raises(LookupError):
        adapter_to_evict({"a": 1.0, "b": 2.0}, in_use={"a", "b"}, max_loras=2)


# -- infercap's rule: the least popular idle adapter leaves (LFU with aging), the baselines keep LRU ----------------
def test_a_popular_idle_adapter_outlives_a_rare_one_used_more_recently():
    popularity = {"hot": 0.5, "rare": 0.01}.get
    last_used = {"hot": 1.0, "rare": 9.0}  # LRU would evict 'hot'
    assert least_popular_to_evict(last_used, in_use=set(), popularity=popularity) == "rare"


def test_the_popular_rule_never_evicts_an_adapter_in_use_and_breaks_ties_by_lru():
    popularity = {"hot": 0.5, "rare": 0.01}.get
    assert least_popular_to_evict({"hot": 1.0, "rare": 9.0}, in_use={"rare"}, popularity=popularity) == "hot"
    with pytest.raises(LookupError):
        least_popular_to_evict({"hot": 1.0, "rare": 9.0}, in_use={"hot", "rare"}, popularity=popularity)
    unknown = {"x": 5.0, "y": 2.0, "hot": 0.0}  # x and y never counted (loaded behind the router's back): LRU
    assert least_popular_to_evict(unknown, in_use=set(), popularity=lambda n: popularity(n) or 0.0) == "y"


def routed(router, adapter: str, replica_id: str, at: float) -> None:
    request = RouteRequest(request_id=f"{adapter}-{at}", prompt_text="", adapter=adapter)
    router.on_routed(request, replica_id, at)
    router.on_finished(request, replica_id, at + 0.5)


def test_infercaps_victim_is_the_least_popular_and_its_load_cost_counts_that_one():
    router = make_router("infercap")
    for t in range(10):
        routed(router, "hot", "r0", float(t))
    routed(router, "rare", "r0", 30.0)
    last_used = {"hot": 9.5, "rare": 30.5}
    assert router.adapter_victim("r0", last_used, set(), 31.0) == "rare"
    assert router.adapter_victim("r0", last_used, {"rare"}, 31.0) == "hot"
    view = ReplicaView(replica_id="r0", adapters=frozenset(last_used), max_loras=2)
    book = router.adapter_book
    assert book.victim(view, 31.0) == "rare"
    for t in (20.0, 21.0, 22.0):
        routed(router, "new", "r1", t)  # wanted more than 'rare', less than 'hot'
    cost = book.load_cost(view, "new", 31.0)
    assert cost == pytest.approx(book.popularity("rare", 31.0) / book.popularity("new", 31.0)) and cost < 0.5
    lru = make_router("infercap", popularity_eviction=False)
    assert lru.adapter_victim("r0", last_used, set(), 31.0) == "hot"


@pytest.mark.parametrize("policy", ["lora_affinity", "round_robin", "least_request"])
def test_the_baselines_name_no_rule_so_their_replicas_evict_lru(policy):
    chooser = victim_chooser(make_router(policy), "r0")
    assert chooser is None
    assert choose_victim({"hot": 1.0, "rare": 9.0}, set(), 2, 10.0, chooser) == "hot"


def test_choose_victim_asks_the_rule_only_when_the_replica_is_full():
    asked = []

    def rule(last_used, in_use, now):
        asked.append(now)
        return "b"

    assert choose_victim({"a": 1.0}, set(), 2, 5.0, rule) is None and not asked
    assert choose_victim({"a": 1.0, "b": 2.0}, set(), 2, 5.0, rule) == "b" and asked == [5.0]
