"""infercap's router counts each replica's prompts waiting for their first token, and the simulator and the proxy
tell it when that token comes (docs/algorithms.md#pending-prefill)."""

import pytest

from capacity.hardware.profiles import get_profile
from gateway.routing import ReplicaView, RouteRequest, make_router
from gateway.routing.baselines import RouterBase
from gateway.routing.prefill import PendingPrefill
from simulator.des import Simulation
from simulator.workloads import SimRequest

SYSTEM = "You are a careful assistant for the billing team. " * 12


def test_pending_prefill_counts_per_replica_moves_on_resend_and_returns_to_exact_zero():
    pending = PendingPrefill()
    pending.add("r0", "a", 0.1)
    pending.add("r0", "b", 0.2)
    pending.add("r1", "c", 500)
    pending.add("r1", "nothing", 0)  # fully cached: nothing to wait for
    assert pending.tokens("r0") == pytest.approx(0.3) and pending.tokens("r1") == 500 and len(pending) == 3
    pending.add("r1", "a", 40)  # resent elsewhere (a retry): it left r0
    assert pending.tokens("r0") == pytest.approx(0.2) and pending.tokens("r1") == 540
    pending.remove("b")
    assert pending.tokens("r0") == 0.0  # exactly, not a float residue
    pending.remove("b")  # its first token and its end both remove it: the second is a no-op
    pending.forget_replica("r1")
    assert pending.tokens("r1") == 0 and len(pending) == 0
    pending.remove("c")


def replicas(n=2, **fields):
    return [
        ReplicaView(replica_id=f"r{i}", mu_capacity=100.0, in_flight=4, in_flight_mu=20.0, **fields) for i in range(n)
    ]


def ask(i, prompt, tokens=2000, **fields):
    return RouteRequest(f"q{i}", prompt, mu=tokens / 1000 + 1, extra={"prompt_tokens": tokens}, **fields)


def test_a_replica_with_prompts_waiting_for_prefill_counts_as_busier_until_their_first_token():
    router = make_router("infercap", seed=0)
    long = ask(0, "a long unshared document " * 300, tokens=8000)
    chosen = router.pick(long, replicas(), 0.0)
    router.on_routed(long, chosen, 0.0)
    other = "r1" if chosen == "r0" else "r0"
    assert router.pending_prefill.tokens(chosen) == 8000  # nothing of it cached there
    # Same in-flight MU on both (the other's work already has its first token): new prompts avoid the prefill queue.
    fresh = [ask(10 + i, f"unrelated question {i} " * 20, tokens=400) for i in range(12)]
    assert {router.pick(q, replicas(), 0.0) for q in fresh} == {other}
    blind = make_router("infercap", seed=0, prefill_weight=0)  # without the term: the home hash spreads them
    assert {blind.pick(q, replicas(), 0.0) for q in fresh} == {"r0", "r1"}
    router.on_first_token(long, chosen, 0.3)
    assert router.pending_prefill.tokens(chosen) == 0
    assert {router.pick(q, replicas(), 0.0) for q in fresh} == {"r0", "r1"}
    with pytest.raises(ValueError, match="prefill_weight"):
        make_router("infercap", prefill_weight=-1)


def test_only_the_uncached_part_of_a_prompt_waits_and_a_finished_request_leaves():
    router = make_router("infercap", seed=0)
    first = ask(0, SYSTEM + "first question", tokens=1000)
    home = router.pick(first, replicas(), 0.0)
    router.on_routed(first, home, 0.0)
    router.on_finished(first, home, 1.0)  # a non-streamed answer: its end is its first token
    assert router.pending_prefill.tokens(home) == 0
    second = ask(1, SYSTEM + "a second question about invoices " * 4, tokens=1000)
    assert router.pick(second, replicas(), 1.0) == home
    match = second.extra["_prefix_matches"][home]
    assert 0.5 < match < 1
    router.on_routed(second, home, 1.0)
    assert router.pending_prefill.tokens(home) == pytest.approx(1000 * (1 - match))


class Recorder(RouterBase):
    name = "recorder"

    def __init__(self):
        super().__init__(seed=0)
        self.events = []

    def pick(self, request, replicas, now):
        return min(r.replica_id for r in self.candidates(replicas, request))

    def on_first_token(self, request, replica_id, now):
        self.events.append(("first", request.request_id, replica_id, now))

    def on_finished(self, request, replica_id, now):
        self.events.append(("finished", request.request_id, replica_id, now))


def test_the_simulator_tells_the_router_each_first_token_when_its_prefill_ends():
    router = Recorder()
    sim = Simulation(router=router, replica_profiles=[get_profile("tiny")], profile=get_profile("tiny"), seed=0)
    requests = [SimRequest(f"s{i}", 0.01 * i, (f"prompt {i} " * 150,), output_tokens=20) for i in range(5)]
    result = sim.run(requests)
    by_id = {r.request_id: r for r in result.requests}
    firsts = [e for e in router.events if e[0] == "first"]
    assert sorted(e[1] for e in firsts) == sorted(by_id)
    for _, rid, replica, now in firsts:
        assert now == pytest.approx(by_id[rid].first_token_s) and replica == by_id[rid].replica_id
        finished = next(e for e in router.events if e[0] == "finished" and e[1] == rid)
        assert router.events.index(("first", rid, replica, now)) < router.events.index(finished)


def test_requests_naming_an_adapter_avoid_a_prefill_queue_too():
    router = make_router("infercap", seed=0)
    held = replicas(adapters=frozenset({"sql"}), max_loras=4)
    long = ask(0, "a long unshared document " * 300, tokens=8000)
    chosen = router.pick(long, held, 0.0)
    router.on_routed(long, chosen, 0.0)
    other = "r1" if chosen == "r0" else "r0"
    # Both hold the adapter and carry the same in-flight MU: only the pending prompt tells them apart.
    fresh = [ask(10 + i, f"unrelated question {i} " * 20, tokens=400, adapter="sql") for i in range(12)]
    assert {router.pick(q, held, 0.0) for q in fresh} == {other}
    blind = make_router("infercap", seed=0, prefill_weight=0)
    assert {blind.pick(q, held, 0.0) for q in fresh} == {"r0", "r1"}
