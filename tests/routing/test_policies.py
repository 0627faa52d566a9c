"""Each policy's choice on hand-built replica states (pure: no database)."""

import pytest

from gateway.routing import POLICIES, ReplicaView, RouteRequest, UnknownPolicy, make_router
from gateway.routing.cost_aware import plan_figures
from gateway.routing.session import prompt_text_of, session_id_of

SYSTEM = "You are a careful assistant. " * 40  # ~1,160 characters: 18 prefix blocks


def views(n: int = 4, **overrides) -> list[ReplicaView]:
    return [ReplicaView(replica_id=f"r{i}", **overrides) for i in range(n)]


def request(i: int = 0, prompt: str = "", mu: float = 1.0, session: str | None = None) -> RouteRequest:
    return RouteRequest(request_id=f"q{i}", prompt_text=prompt or f"question {i} " * 8, mu=mu, session_id=session)


def route(router, req, replicas, now=0.0):
    chosen = router.pick(req, replicas, now)
    if chosen is not None:
        router.on_routed(req, chosen, now)
        for r in replicas:
            if r.replica_id == chosen:
                r.in_flight += 1
                r.in_flight_mu += req.mu
    return chosen


def test_make_router_knows_every_endpoint_policy():
    from endpoints.models import RoutingPolicy

    assert set(POLICIES) == set(RoutingPolicy.values)
    for name in POLICIES:
        assert make(name, seed=0).name == name


# One GPU type whose replicas each hold 32 chats within the SLO: the cost-aware policy's plan (it routes by one).
PLAN = {
    "buckets": [{"name": "chat", "prompt_tokens": 256, "output_tokens": 128}],
    "types": {"a100": {"usd_per_hour": 5.12, "batch": {"chat": 32}, "rate_rps": {"chat": 4.0}}},
}


def make(policy: str, seed: int):
    if policy == "cost_aware":
        return make_router(policy, seed=seed, default_type="a100", **plan_figures(PLAN))
    return make_router(policy, seed=seed)


def test_make_router_rejects_unknown_names_and_options():
    with pytest.raises(UnknownPolicy, match="round_robin"):
        make_router("fastest")
    with pytest.raises(TypeError, match="infercap"):
        make_router("infercap", load_bund=1.2)
    with pytest.raises(ValueError):
        make_router("infercap", load_bound=0.9)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_policy_skips_unhealthy_draining_and_full_replicas(policy):
    router = make(policy, seed=3)
    replicas = views(4)
    replicas[0].healthy = False
    replicas[1].draining = True
    replicas[2].in_flight = replicas[2].concurrency_limit = 8
    for i in range(20):
        assert router.pick(request(i), replicas, 0.0) == "r3"


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_policy_returns_none_when_nothing_can_take_the_request(policy):
    router = make(policy, seed=3)
    replicas = views(2, concurrency_limit=1, in_flight=1)
    assert router.pick(request(), replicas, 0.0) is None
    assert router.pick(request(), [], 0.0) is None


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_stale_metrics_count_as_saturated_but_all_stale_fails_open(policy):
    router = make(policy, seed=5)
    replicas = views(3)
    replicas[0].metrics_age_s = replicas[1].metrics_age_s = 2.5
    assert {router.pick(request(i), replicas, 0.0) for i in range(20)} == {"r2"}
    replicas[2].metrics_age_s = 9.0
    assert {router.pick(request(i), replicas, 0.0) for i in range(40)} <= {"r0", "r1", "r2"}
    assert router.pick(request(), replicas, 0.0) is not None


def test_round_robin_cycles_in_id_order_and_survives_a_replica_leaving():
    router = make_router("round_robin")
    replicas = views(3)
    assert [router.pick(request(i), replicas, 0.0) for i in range(4)] == ["r0", "r1", "r2", "r0"]
    replicas[1].healthy = False
    assert [router.pick(request(i), replicas, 0.0) for i in range(3)] == ["r2", "r0", "r2"]


def test_least_request_takes_the_replica_with_fewest_in_flight():
    router = make_router("least_request", seed=1)
    replicas = views(3)
    replicas[0].in_flight, replicas[1].in_flight, replicas[2].in_flight = 5, 2, 7
    assert router.pick(request(), replicas, 0.0) == "r1"


def test_least_request_spreads_evenly():
    router = make_router("least_request", seed=1)
    replicas = views(4)
    for i in range(40):
        route(router, request(i), replicas)
    assert [r.in_flight for r in replicas] == [10, 10, 10, 10]


def test_power_of_two_never_picks_the_worse_of_its_two_samples():
    router = make_router("power_of_two", seed=2)
    replicas = views(2)
    replicas[0].in_flight = 9
    assert {router.pick(request(i), replicas, 0.0) for i in range(20)} == {"r1"}
    # With many replicas the most loaded one is never chosen (it loses every pair it is in).
    replicas = views(6)
    replicas[4].in_flight = 50
    assert "r4" not in {router.pick(request(i), replicas, 0.0) for i in range(200)}


def test_llmd_scores_queue_kv_and_prefix_with_its_default_weights():
    router = make_router("llmd", seed=0)
    replicas = views(3)
    # r0: long queue; r1: nearly full KV cache; r2: idle → r2 wins on queue (2) + kv (2).
    replicas[0].num_waiting, replicas[1].kv_usage = 10, 0.95
    assert router.pick(request(), replicas, 0.0) == "r2"
    # Once r0 has the prompt's prefix, the prefix scorer (3) outweighs r0's worse queue score (2).
    shared = request(1, prompt=SYSTEM + "first")
    router.on_routed(shared, "r0", 0.0)
    replicas[0].num_waiting, replicas[1].kv_usage = 3, 0.0
    assert router.pick(request(2, prompt=SYSTEM + "second"), replicas, 0.0) == "r0"
    # A queue so long that r0 scores 0 on queue and kv loses to the idle replicas.
    replicas[0].num_waiting, replicas[0].kv_usage = 30, 1.0
    assert router.pick(request(3, prompt=SYSTEM + "third"), replicas, 0.0) in {"r1", "r2"}


def busy_views(n: int, *, background_mu: float = 20.0, **overrides) -> list[ReplicaView]:
    """Replicas already carrying some traffic, so the load bound has a mean to work with."""
    return views(n, mu_capacity=100.0, in_flight=4, in_flight_mu=background_mu, **overrides)


def test_infercap_prefers_the_replica_holding_the_prefix():
    router = make_router("infercap", seed=0)
    replicas = busy_views(4)
    first = route(router, request(0, prompt=SYSTEM + "a", mu=1), replicas)
    for i in range(1, 5):
        assert route(router, request(i, prompt=SYSTEM + f"q{i}", mu=1), replicas) == first
    assert {route(router, request(9 + i, prompt=f"different {i} " * 30, mu=1), replicas) for i in range(12)} != {first}


def test_infercap_places_new_prefixes_by_rendezvous_hash_not_by_chance():
    # Two proxy processes (different seeds, so different tie-breaks) agree where an unseen prefix belongs.
    prompts = [f"tenant {i} " * 20 + SYSTEM for i in range(20)]
    a, b = make_router("infercap", seed=1), make_router("infercap", seed=2)
    picks_a = [a.pick(request(i, prompt=p), busy_views(8), 0.0) for i, p in enumerate(prompts)]
    picks_b = [b.pick(request(i, prompt=p), busy_views(8), 0.0) for i, p in enumerate(prompts)]
    assert picks_a == picks_b and len(set(picks_a)) > 3


def test_infercap_places_new_prefixes_where_the_cache_has_room():
    router = make_router("infercap", seed=0)
    replicas = busy_views(4, num_gpu_blocks=200)  # each index holds 200 text blocks
    for i, rid in enumerate(["r0", "r1", "r2"]):
        router.on_routed(request(50 + i, prompt=str(i) * 64 * 150), rid, 0.0)
        router._cache_config[rid] = (200, 16)
    for rid in ("r0", "r1", "r2"):
        router.prefix_index.record(rid, [], 200, 16)  # size the index from cache_config_info
        assert router.prefix_index.fill(rid) == 0.75
    assert router.pick(request(1, prompt="fresh " * 200), replicas, 0.0) == "r3"


def test_infercap_measures_load_in_model_units_not_requests():
    router = make_router("infercap", seed=0)
    replicas = views(2, mu_capacity=100.0)
    replicas[0].in_flight, replicas[0].in_flight_mu = 1, 60.0  # one huge request
    replicas[1].in_flight, replicas[1].in_flight_mu = 4, 8.0  # four small ones
    assert router.pick(request(mu=2), replicas, 0.0) == "r1"
    assert make_router("least_request").pick(request(mu=2), replicas, 0.0) == "r0"


def test_infercap_bounded_load_keeps_every_replica_within_the_bound():
    router = make_router("infercap", seed=0, load_bound=1.25, load_slack=0.0)
    replicas = views(4, mu_capacity=100.0, concurrency_limit=1000)
    hot = SYSTEM + "the one prompt everyone sends"
    for i in range(400):
        route(router, request(i, prompt=hot, mu=1.0), replicas)
        loads = [r.in_flight_mu for r in replicas]
        mean = sum(loads) / len(loads)
        # Within the bound, up to one request's MU of granularity (CH-BL's ceil: every replica may take one more
        # when all are level).
        assert max(loads) <= 1.25 * mean + 1.0 + 1e-9, loads
    assert min(r.in_flight for r in replicas) > 0


def test_infercap_bound_yields_to_prefix_when_within_bound():
    router = make_router("infercap", seed=0, load_bound=1.25, load_slack=0.0)
    replicas = views(2, mu_capacity=100.0)
    route(router, request(0, prompt=SYSTEM + "x", mu=10), replicas)
    holder = next(r for r in replicas if r.in_flight)
    other = next(r for r in replicas if not r.in_flight)
    other.in_flight, other.in_flight_mu = 1, 9.0  # loads 10 vs 9: adding 10 to the holder exceeds 1.25 × mean
    assert router.pick(request(1, prompt=SYSTEM + "y", mu=10), replicas, 0.0) == other.replica_id
    other.in_flight_mu = 30.0  # holder at 20 after, mean 20 → within the bound → affinity wins
    assert router.pick(request(2, prompt=SYSTEM + "z", mu=10), replicas, 0.0) == holder.replica_id


def test_infercap_load_slack_keeps_affinity_near_idle():
    # Near idle the mean is ~0, so without slack the second request of a prefix would already leave its replica.
    hot = SYSTEM + "the same prompt"
    for slack, expect_spread in ((2.0, False), (0.0, True)):
        router = make_router("infercap", seed=0, load_slack=slack)
        replicas = views(4, mu_capacity=100.0)
        chosen = {route(router, request(i, prompt=hot, mu=4), replicas) for i in range(2)}
        assert (len(chosen) > 1) is expect_spread


def test_session_stickiness_is_a_preference_that_yields_to_overload():
    router = make_router("infercap", seed=0)
    replicas = busy_views(3, concurrency_limit=20)
    home = route(router, request(0, session="s-1", mu=2), replicas)
    for i in range(1, 5):  # unrelated prompts, same session → same replica
        assert route(router, request(i, session="s-1", mu=2), replicas) == home
    # The home replica fills up: at its concurrency limit the session moves, and then sticks to the new home.
    home_view = next(r for r in replicas if r.replica_id == home)
    home_view.in_flight = home_view.concurrency_limit
    moved = route(router, request(10, session="s-1", mu=2), replicas)
    assert moved != home
    home_view.in_flight, home_view.in_flight_mu = 4, 20.0
    assert router.pick(request(11, session="s-1", mu=2), replicas, 1.0) == moved
    # Over the bounded load (not only the hard limit) also moves it.
    moved_view = next(r for r in replicas if r.replica_id == moved)
    moved_view.in_flight, moved_view.in_flight_mu = 9, 60.0
    assert router.pick(request(12, session="s-1", mu=2), replicas, 1.0) != moved


def test_session_table_expires_and_is_bounded():
    router = make_router("infercap", seed=0, session_ttl_s=10.0, max_sessions=3)
    replicas = views(2, mu_capacity=100.0)
    for s in range(5):
        route(router, request(s, session=f"s{s}"), replicas, now=0.0)
    assert len(router.sessions) == 3
    assert router.sessions.get("s4", 5.0) is not None
    assert router.sessions.get("s4", 11.0) is None


def test_prompt_text_and_session_helpers():
    body = {
        "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    }
    assert prompt_text_of(body) == "<|system|>S<|user|>hi"
    assert prompt_text_of({"prompt": "abc"}) == "abc"
    assert prompt_text_of({"messages": "nonsense"}) == ""
    assert session_id_of({"X-Session-Id": "abc"}, {"user": "u"}) == "abc"
    assert session_id_of({}, {"user": "u"}) == "u"
    assert session_id_of({}, {}) is None
