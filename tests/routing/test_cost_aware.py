"""Routing across a mixed fleet by cost under the SLO (``gateway.routing.cost_aware``, pure)."""

import pytest

from gateway.routing.base import ReplicaView, RouteRequest
from gateway.routing.cost_aware import CostAwareRouter, SizeBucket, TypeFigures

BUCKETS = [SizeBucket("chat", 256, 128), SizeBucket("doc", 6144, 256)]
# The cheap type decodes 4 chats at once within the SLO and cannot prefill a document in time; the fast one
# decodes 8 chats or 2 documents, at four times the price.
FIGURES = {
    "cheap": TypeFigures(usd_per_hour=2.0, batch={"chat": 4, "doc": 0}, rate_rps={"chat": 4.0, "doc": 0.0}),
    "fast": TypeFigures(usd_per_hour=8.0, batch={"chat": 8, "doc": 2}, rate_rps={"chat": 10.0, "doc": 1.0}),
}
TYPES = {"c0": "cheap", "c1": "cheap", "f0": "fast"}
VIEWS = [ReplicaView(replica_id=r) for r in TYPES]


def request(i: int, prompt: int, output: int = 128) -> RouteRequest:
    return RouteRequest(request_id=f"q{i}", prompt_text="", extra={"prompt_tokens": prompt, "max_tokens": output})


def route(router, req, views=VIEWS):
    chosen = router.pick(req, views, 0.0)
    if chosen is not None:
        router.on_routed(req, chosen, 0.0)
    return chosen


def test_requests_are_sized_to_the_nearest_bucket():
    router = CostAwareRouter(TYPES, FIGURES, BUCKETS)
    assert router.bucket_of(request(0, 300, 100)) == "chat"
    assert router.bucket_of(request(0, 5000, 300)) == "doc"
    with pytest.raises(ValueError):
        CostAwareRouter({"x0": "unknown"}, FIGURES, BUCKETS)


def test_small_requests_fill_the_cheap_gpus_first_and_spill_to_the_fast_one_and_documents_go_where_they_fit():
    router = CostAwareRouter(TYPES, FIGURES, BUCKETS)
    chats = [route(router, request(i, 256)) for i in range(10)]
    # Two cheap replicas hold 4 chats each within the SLO, balanced; the 9th and 10th go to the fast one.
    assert sorted(chats[:8]) == ["c0"] * 4 + ["c1"] * 4 and chats[8:] == ["f0", "f0"]
    # A document never goes to a type whose prefill misses the TTFT SLO, even with room there.
    assert route(router, request(99, 6144, 256)) == "f0"
    # Full everywhere: the replica left least loaded after it (it queues there).
    assert router.load["f0"] == pytest.approx(2 / 8 + 1 / 2)
    assert route(router, request(100, 256)) == "f0"  # 0.875 after it, the cheap ones 1.25
    # A finished request gives its share back.
    router.on_finished(request(0, 256), chats[0], 1.0)
    assert route(router, request(101, 256)) == chats[0]
    assert router.pick(request(102, 6144, 256), [ReplicaView(replica_id="c0")], 0.0) is None


def test_the_plan_s_shares_are_dealt_in_proportion_while_there_is_room():
    router = CostAwareRouter(TYPES, FIGURES, BUCKETS, shares={"chat": {"cheap": 0.75, "fast": 0.25}})
    chosen = [route(router, request(i, 256)) for i in range(8)]
    assert sum(TYPES[c] == "fast" for c in chosen) == 2 and sum(TYPES[c] == "cheap" for c in chosen) == 6
    # The type the shares name is full: the cheapest one with room takes it.
    busy = CostAwareRouter(TYPES, FIGURES, BUCKETS, shares={"chat": {"fast": 1.0}})
    assert [TYPES[route(busy, request(i, 256))] for i in range(10)] == ["fast"] * 8 + ["cheap"] * 2
