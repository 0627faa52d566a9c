"""The heartbeat's book of what this process may run, holds and asks for (``gateway.proxy.membership.ShareBook``):
a beat works out only the replicas that can have changed, and must give what working out every replica gives."""

import asyncio
import dataclasses
import json
import random

from gateway.admission.shares import Member, allocate, demand_parts
from gateway.proxy.config import ProxyConfig
from gateway.proxy.disaggregation import prefill_route
from gateway.proxy.membership import ShareBook, parse_members
from gateway.proxy.runtime import EndpointRuntime
from gateway.proxy.state import ProxyState
from gateway.routing.base import RouteRequest
from tests.proxy.test_disaggregation import LONG, PREFILL_COEFFS, pd_endpoint


def _reference_changes(allocation, held, in_flight, before, limits):
    """Every replica looked at: ask where the wanted holding differs from the held one or the limit changed, and 0
    for a replica gone from the limits."""
    changes = {
        rid: w
        for rid, n in allocation.items()
        if (w := max(n, in_flight.get(rid, 0))) != held.get(rid) or before.get(rid) != limits[rid]
    }
    changes.update((rid, 0) for rid in held.keys() - limits.keys())
    return changes


def _demand(rng, rids):
    return {rid: [rng.choice([0, 0, 1, 3]) for _ in range(3)] for rid in rng.sample(rids, rng.randint(0, 4))}


def test_a_beat_that_works_out_only_what_moved_gives_what_working_out_everything_gives():
    rng = random.Random(11)
    for case in range(60):
        rids = [f"r{i}" for i in range(12)]
        limits = {rid: rng.randint(1, 8) for rid in rids}
        others = ["p1", "p2"]
        book, me = ShareBook(), "p0"
        members: dict[str, Member] = {}
        incremental = 0
        for beat in range(40):
            if rng.random() < 0.1:  # a limit changes, a replica comes or goes
                rid = rng.choice(rids)
                if rid in limits and rng.random() < 0.5:
                    del limits[rid]
                else:
                    limits[rid] = rng.randint(1, 8)
            if rng.random() < 0.05:  # a member leaves or joins
                others = ["p1"] if len(others) == 2 else ["p1", "p2"]
            served = sorted(limits)
            in_flight = {rid: rng.randint(1, 4) for rid in rng.sample(served, min(len(served), rng.randint(0, 2)))}
            view = {mid: Member(joined=0.0, seen_at=1.0, **demand_parts(_demand(rng, served))) for mid in others}
            if me in members:
                view[me] = Member(
                    joined=0.0, seen_at=1.0, **demand_parts({rid: [n, 0, 0] for rid, n in in_flight.items()})
                )
            full = beat % 10 == 9
            touched = book.allocate(me, view, dict(limits), full=full)
            assert book.allocation == allocate(me, view, limits), (case, beat)
            expected = _reference_changes(book.allocation, book.holdings, in_flight, book.limits, limits)
            changes = book.changes(in_flight, dict(limits), touched, full)
            incremental += touched is not None and not full
            if full:
                assert changes.keys() >= book.allocation.keys() and changes.items() >= expected.items()
            else:
                assert changes == expected, (case, beat)
            # The script grants what the others leave free: sometimes less than asked.
            grants = {rid: (w if rng.random() < 0.7 else rng.randint(0, w)) for rid, w in changes.items()}
            book.granted(grants, changes, dict(limits), reset=me not in members)
            members = {**view, me: Member(joined=0.0, seen_at=1.0)}
        assert incremental > 20  # most beats took the short way


def test_a_member_entry_of_another_format_counts_as_no_demand():
    """Per-class lists (the format before), negative counts or text: read as no demand, not a failed beat."""
    raw = [
        b"new", b'{"j":1.0,"t":2.0,"q":{"10":3},"c":{"10":1},"x":{}}',
        b"old", b'{"j":1.0,"t":2.0,"f":{"10":1},"q":{"10":[1,2,0]}}',
        b"bad", b'{"j":1.0,"t":2.0,"q":{"10":-4},"c":{"10":"x"}}',
    ]  # fmt: skip
    members = parse_members(raw)
    assert (members["new"].demand, members["new"].critical, members["new"].sheddable) == ({"10": 3}, {"10": 1}, {})
    assert members["old"].demand == {} and members["bad"].demand == members["bad"].critical == {}
    # On a replica of 8, "new" runs its 3 and the 5 left split evenly, the first two in id order one more.
    assert [allocate(mid, members, {"10": 8})["10"] for mid in ("bad", "new", "old")] == [2, 3 + 2, 1]


class _GrantAll:
    """A heartbeat that grants what is asked, with ``others`` as the other members (their demand: ``demand``)."""

    def __init__(self, state):
        self.others: list[str] = []
        self.demand: dict[str, int] = {}
        self.asked: list[dict] = []
        state._heartbeat, state.redis = self, object()

    async def __call__(self, keys, args):
        self.asked.append(json.loads(args[1]))
        mine = {"j": 1.0, "t": 2.0, **{k: json.loads(v) for k, v in zip("qcx", args[2:5], strict=True)}}
        entries = [args[0].encode(), json.dumps(mine).encode()]
        for other in self.others:
            entries += [other.encode(), json.dumps({"j": 1.0, "t": 2.0, "q": self.demand, "c": {}, "x": {}}).encode()]
        return entries, args[1], 1 if len(self.asked) == 1 else 0


def _pd_turning_aggregated(prefills: int, others: list[str]):
    """A process with a prefill/decode endpoint (prefill replica 200, decode 300, 4 slots each) beside ``others``
    that turns aggregated while ``prefills`` prefills run on 200: 200 admits in the runtime while its prefill pool
    retires."""
    state = ProxyState(ProxyConfig())
    ep = pd_endpoint(name="pd-turning")
    rt = state.runtimes[ep.id] = EndpointRuntime(ep, config=ProxyConfig(), clock=lambda: 0.0)
    beat = _GrantAll(state)
    beat.others = others
    asyncio.run(state._beat())
    asyncio.run(state._beat())
    routes = [
        prefill_route(RouteRequest(request_id=f"p{i}", prompt_text=LONG, extra={"prompt_tokens": 300}), PREFILL_COEFFS)
        for i in range(prefills)
    ]
    running = [(rt.prefill_pool.take(route), route) for route in routes]
    pool = rt.prefill_pool
    rt.update(dataclasses.replace(ep, serving_mode="aggregated"))
    state._apply_caps()
    assert rt.prefill_pool is pool and "200" in rt.slots and "200" in pool.slots
    return state, rt, pool, beat, running


def test_a_replica_moving_between_pools_is_capped_in_the_one_that_admits_on_it():
    state, rt, pool, beat, running = _pd_turning_aggregated(prefills=1, others=["other"])
    for slot, route in running:
        pool.release(slot, route)
    assert "200" not in pool.slots
    asyncio.run(state._beat())
    assert rt.slots["200"].view.concurrency_limit == 2  # half of 4
    beat.demand = {"200": 4}  # the other process needs all of 200 (and nothing on 300: its split stays)
    asyncio.run(state._beat())  # its demand is in the view from the next beat on
    asyncio.run(state._beat())
    assert state._book.allocation["200"] == 0 == state._book.holdings["200"]
    assert rt.slots["200"].view.concurrency_limit == 0  # the runtime's cap follows, not the retired pool's


def test_slots_held_for_prefills_that_ended_are_given_back_at_the_next_beat():
    state, rt, pool, beat, running = _pd_turning_aggregated(prefills=2, others=[])
    beat.others = ["!a", "!b"]  # three members from now on: the even third of 4 this process gets is 1
    asyncio.run(state._beat())
    asyncio.run(state._beat())
    assert state._book.allocation["200"] == 1 and state._book.holdings["200"] == 2  # what runs is never revoked
    for slot, route in running:
        pool.release(slot, route)
    asyncio.run(state._beat())
    assert state._book.holdings["200"] == 1
