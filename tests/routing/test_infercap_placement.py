"""infercap's placement: stable home ranks across processes, and spare MU deciding among replicas holding a prefix
(pure: hand-built replica states, no database)."""

import ast
import os
import subprocess
import sys
from pathlib import Path

from gateway.routing import ReplicaView, RouteRequest, make_router
from gateway.routing.bounded_affinity import home_key, home_rank

SYSTEM = "You are a careful assistant. " * 40  # ~1,160 characters: 18 prefix blocks


def request(i: int = 0, prompt: str = "", mu: float = 1.0) -> RouteRequest:
    return RouteRequest(request_id=f"q{i}", prompt_text=prompt or f"question {i} " * 8, mu=mu)


def busy_views(n: int, *, background_mu: float = 20.0) -> list[ReplicaView]:
    return [
        ReplicaView(replica_id=f"r{i}", mu_capacity=100.0, in_flight=4, in_flight_mu=background_mu) for i in range(n)
    ]


def test_home_rank_is_a_pure_function_of_the_prompt_head_and_replica():
    a, b = request(0, prompt=SYSTEM + "one question"), request(1, prompt=SYSTEM + "another question")
    # Same head (first 16 blocks) → same key; a different salt (tenant isolation) → a different key.
    assert home_key(a, 16 * 64) == home_key(b, 16 * 64)
    salted = RouteRequest(request_id="s", prompt_text=a.prompt_text, extra={"cache_salt": "tenant-b"})
    assert home_key(salted, 16 * 64) != home_key(a, 16 * 64)
    ranks = [home_rank(home_key(a, 16 * 64), f"r{i}") for i in range(8)]
    assert all(0.0 <= x < 1.0 for x in ranks) and len(set(ranks)) == 8


def test_infercap_home_placement_is_the_same_in_every_process():
    # Python salts str hashes per process; the home rank must not depend on it, or two proxy processes (and two
    # benchmark runs) would place the same new prefix on different replicas.
    code = (
        "from gateway.routing import make_router, ReplicaView, RouteRequest\n"
        "r = make_router('infercap', seed=0)\n"
        "vs = [ReplicaView(replica_id=f'r{i}', mu_capacity=100.0, in_flight=4, in_flight_mu=20.0) for i in range(8)]\n"
        "print([r.pick(RouteRequest(request_id=str(i), prompt_text=f'tenant {i} ' * 40), vs, 0.0) for i in range(16)])\n"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
            cwd=Path(__file__).resolve().parents[2],
        ).stdout
        for seed in (1, 2)
    }
    assert len(outputs) == 1 and len(set(ast.literal_eval(outputs.pop()))) > 3


def test_infercap_spare_capacity_decides_between_replicas_holding_the_prefix():
    # Both replicas hold the prefix (same match): the one with more spare MU wins, whatever the home rank says.
    prompt = SYSTEM + "same question"
    for light in ("r0", "r1"):
        router = make_router("infercap", seed=0)
        replicas = busy_views(2)
        for r in replicas:
            router.on_routed(request(0, prompt=prompt), r.replica_id, 0.0)
        next(
            r for r in replicas if r.replica_id != light
        ).in_flight_mu = 30.0  # half again as much MU, still within the bound
        assert router.pick(request(1, prompt=prompt), replicas, 0.0) == light


def test_infercap_prefix_still_beats_a_moderately_lighter_replica():
    # A full prefix match saves the whole prefill: it outweighs a replica with a third less load (within the bound).
    router = make_router("infercap", seed=0)
    replicas = busy_views(2)
    prompt = SYSTEM + "cached question"
    router.on_routed(request(0, prompt=prompt), "r1", 0.0)
    replicas[1].in_flight_mu = 30.0
    assert router.pick(request(1, prompt=prompt), replicas, 0.0) == "r1"


def group_prompt(g: int, q: int = 0) -> str:
    """A prompt of prefix group ``g``: a 20-block system prompt (a head) and a question."""
    return f"group {g:02d} system prompt. " * 56 + f"question {q}"


def test_infercap_deals_new_prefix_groups_out_evenly_by_count():
    # 16 groups arrive on 8 equally loaded replicas: every replica gets exactly two, whatever the hashes say.
    # Without the spread term the rendezvous hash alone piles several groups on some replicas.
    def placement(spread_weight: float) -> list[int]:
        router = make_router("infercap", seed=0, spread_weight=spread_weight)
        replicas = busy_views(8)
        for g in range(16):
            router.on_routed(
                request(g, prompt=group_prompt(g)), router.pick(request(g, group_prompt(g)), replicas, 0), 0
            )
        return sorted(router.heads.count(r.replica_id, router.prefix_index) for r in replicas)

    assert placement(2.0) == [2] * 8
    assert placement(0.0) != [2] * 8


def test_infercap_keeps_a_group_on_its_replica_although_that_one_holds_more_groups():
    # The spread term only prices a head a replica does not hold yet: a holder with more groups keeps its group.
    router = make_router("infercap", seed=0)
    replicas = busy_views(2)
    for g in range(3):
        router.on_routed(request(g, prompt=group_prompt(g)), "r0", 0.0)
    assert router.heads.count("r0", router.prefix_index) == 3
    assert router.pick(request(9, prompt=group_prompt(1, q=7)), replicas, 0.0) == "r0"
    # A new group goes to the replica with fewer groups, even where the home rank prefers r0.
    assert {router.pick(request(10 + g, prompt=group_prompt(g)), replicas, 0.0) for g in range(3, 9)} == {"r1"}


def test_infercap_sends_a_group_to_its_oldest_copy_so_spill_overs_go_cold():
    # r0 has held group 1 longest, r1 got a copy when r0 was briefly over the bound: with r1 somewhat lighter the
    # group goes back to r0 (r1's copy can age out of its cache); only a clearly lighter r1 takes it.
    router = make_router("infercap", seed=0)
    replicas = busy_views(2)
    router.on_routed(request(0, prompt=group_prompt(1)), "r0", 0.0)
    router.on_routed(request(1, prompt=group_prompt(1, q=1)), "r1", 0.0)
    assert router.heads.copy_number("r0", home_key(request(0, group_prompt(1)), 16 * 64), router.prefix_index) < (
        router.heads.copy_number("r1", home_key(request(1, group_prompt(1)), 16 * 64), router.prefix_index)
    )
    replicas[0].in_flight_mu, replicas[1].in_flight_mu = 25.0, 20.0
    assert router.pick(request(2, prompt=group_prompt(1, q=2)), replicas, 0.0) == "r0"
    replicas[0].in_flight_mu = 37.0  # nearly twice the load, just within the bound: the spare room wins
    assert router.pick(request(3, prompt=group_prompt(1, q=3)), replicas, 0.0) == "r1"
    no_primary = make_router("infercap", seed=0, primary_weight=0.0)
    no_primary.on_routed(request(0, prompt=group_prompt(1)), "r0", 0.0)
    no_primary.on_routed(request(1, prompt=group_prompt(1, q=1)), "r1", 0.0)
    replicas[0].in_flight_mu = 25.0  # without the preference, a quarter more load already moves the group
    assert no_primary.pick(request(2, prompt=group_prompt(1, q=2)), replicas, 0.0) == "r1"


def test_a_session_stays_on_its_replica_up_to_the_looser_session_bound():
    # 4 replicas at 20 MU each; the session's replica carries more. The plain bound (1.15 × mean + 2 requests'
    # slack) would move the session at ~28 MU; the session bound (1.5 ×) keeps it there, and above it the session moves.
    def pick_with(home_mu: float, **options) -> str:
        router = make_router("infercap", seed=0, **options)
        replicas = busy_views(4)
        conversation = "hello there, tell me about caches " * 40
        router.on_routed(RouteRequest(request_id="t0", prompt_text=conversation, session_id="s"), "r2", 0.0)
        replicas[2].in_flight_mu = home_mu
        # The next turn's prompt is the conversation so far and one more question, as a chat client sends it.
        turn = RouteRequest(request_id="t1", prompt_text=conversation + "and then? " * 10, mu=1.0, session_id="s")
        return router.pick(turn, replicas, 1.0)

    assert pick_with(31.0) == "r2"
    assert pick_with(31.0, session_load_bound=1.15) != "r2"  # the plain bound alone moves it
    assert pick_with(40.0) != "r2"


def test_a_session_weighs_load_more_than_a_single_request():
    # A session's context grows on its replica every turn, so its requests weigh load by session_load_weight (10):
    # a turn whose cached share is small moves off a replica carrying 55 % more, where at the plain weight it stays.
    def pick_with(**options) -> str:
        router = make_router("infercap", seed=0, **options)
        replicas = busy_views(4)
        router.on_routed(RouteRequest(request_id="t0", prompt_text="hello " * 20, session_id="s"), "r2", 0.0)
        replicas[2].in_flight_mu = 31.0
        turn = RouteRequest(request_id="t1", prompt_text="next turn " * 20, mu=1.0, session_id="s")
        return router.pick(turn, replicas, 1.0)

    assert pick_with() != "r2"
    assert pick_with(session_load_weight=3.0) == "r2"


def test_infercap_queue_and_kv_choose_among_the_holders_of_the_prefix_only():
    # r0 and r1 hold the group (r0 the older copy, its primary) at the same MU load, but r0's KV is saturated: its
    # engine queues. The request goes to r1, the holder with room; r2 is idle with an empty cache and holds nothing,
    # and never gets it: queue and KV choose which holder, they do not pull a request off its holders.
    router = make_router("infercap", seed=0)
    replicas = busy_views(3)
    router.on_routed(request(0, prompt=group_prompt(1)), "r0", 0.0)
    router.on_routed(request(1, prompt=group_prompt(1, q=1)), "r1", 0.0)
    replicas[0].num_waiting, replicas[0].kv_usage = 3, 0.95
    replicas[1].kv_usage = 0.6
    assert router.pick(request(2, prompt=group_prompt(1, q=2)), replicas, 0.0) == "r1"
    # One holder only: however full its queue, the group stays there (the load bound alone moves it).
    single = make_router("infercap", seed=0)
    single.on_routed(request(0, prompt=group_prompt(2)), "r0", 0.0)
    assert single.pick(request(1, prompt=group_prompt(2, q=1)), replicas, 0.0) == "r0"


def fast_share(slow_capacity: float, fast_capacity: float, requests: int = 60) -> float:
    """The share of in-flight MU infercap puts on the faster of two replicas while nothing finishes."""
    router = make_router("infercap", seed=0)
    views = [ReplicaView("slow", mu_capacity=slow_capacity), ReplicaView("fast", mu_capacity=fast_capacity)]
    for i in range(requests):
        q = request(i, mu=2.0)
        chosen = next(v for v in views if v.replica_id == router.pick(q, views, float(i)))
        router.on_routed(q, chosen.replica_id, float(i))
        chosen.in_flight += 1
        chosen.in_flight_mu += q.mu
    return views[1].in_flight_mu / sum(v.in_flight_mu for v in views)


def test_a_replica_twice_as_fast_carries_about_twice_the_in_flight_mu():
    # MU capacity is the replica's speed (the live proxy: ReplicaInfo.speed; the simulator: its profile's decode rate).
    assert 0.6 <= fast_share(50.0, 100.0) <= 0.75  # two thirds, within the bound's slack
    assert 0.4 <= fast_share(100.0, 100.0) <= 0.6  # equal speeds: about half each
