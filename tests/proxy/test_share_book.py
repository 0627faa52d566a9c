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
from tests.proxy.snapshots import endpoint
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
    kept = by_moves = read = 0
    for case in range(60):
        rids = [f"r{i}" for i in range(12)]
        limits = {rid: rng.randint(1, 8) for rid in rids}
        others = ["p1", "p2"]
        book, me = ShareBook(), "p0"
        members: dict[str, Member] = {}
        incremental = 0
        writers: dict[str, list] = {}  # member → its book, its next beat, (its last beat, entry, demand)
        previous: dict[str, Member] = {}
        last: dict[str, dict] = {}
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
            # The others' entries as the script returns them, read as the process reads them. Each other member
            # beats (its demand moved or not) or not (its entry comes back as it was: kept by identity), and
            # sometimes twice between two reads (the reader lacks the moves' base beat: decoded whole).
            raw = []
            for mid in others:
                writer = writers.setdefault(mid, [ShareBook(), 0, None])
                for _ in range(rng.choice([0, 1, 1, 1, 2]) if writer[2] else 1):
                    parts = demand_parts(_demand(rng, served)) if rng.random() < 0.6 or not writer[2] else writer[2][2]
                    base, moves = writer[0].sending(writer[1], parts["demand"])
                    writer[1:] = [writer[1] + 1, (writer[1], _entry(writer[1], base, moves, parts), parts)]
                raw += [mid.encode(), writer[2][1].encode()]
            view = parse_members(raw, book.known)
            for mid in others:  # what the writer sent, exactly
                sent = writers[mid][2][2]
                assert (view[mid].demand, dict(view[mid].critical), dict(view[mid].sheddable)) == (
                    sent["demand"],
                    sent["critical"],
                    sent["sheddable"],
                )
            if previous.keys() == set(others) and rng.random() < 0.1:
                view = dict(previous)  # a beat that failed after its read: the members are the read before
            previous = {mid: view[mid] for mid in others}
            kept += sum(view[mid].demand is last.get(mid) for mid in others)
            by_moves += sum(view[mid].moved_since is not None for mid in others)
            last = {mid: view[mid].demand for mid in others}
            read += len(others)
            if me in members:
                parts = demand_parts({rid: [n, 0, 0] for rid, n in in_flight.items()})
                base, moves = book.sending(beat, parts["demand"])
                since = None if moves is None else (base, moves)
                view[me] = Member(joined=0.0, seen_at=1.0, **parts, beat=beat, moved_since=since)
            full = beat % 10 == 9
            before = dict(book.allocation)
            touched, moved = book.allocate(me, view, dict(limits), full=full)
            assert book.allocation == allocate(me, view, limits), (case, beat)
            assert sorted(moved) == sorted(
                r for r in before.keys() | book.allocation.keys() if before.get(r) != book.allocation.get(r)
            )
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
    # Unchanged entries (or ones whose demand did not move) kept their maps, those a beat on were read only in what
    # moved; the rest whole.
    assert 0.1 * read < kept < 0.6 * read and 0.2 * read < by_moves < 0.8 * read


def _entry(beat, base, moves, parts) -> str:
    """A member's entry as the heartbeat script writes it."""
    maps = [json.dumps(parts[k]) for k in ("demand", "critical", "sheddable")]
    moved = json.dumps(moves or {})
    return f'{{"j":0.5,"t":{beat}.25,"s":{beat},"b":{base},"d":{moved},"q":{maps[0]},"c":{maps[1]},"x":{maps[2]}}}'


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


def test_a_class_moving_under_an_unchanged_total_is_worked_out_again_where_it_counts():
    """On a replica over its limit the split looks at the classes, so a member whose critical request became a
    standard one (same total) moves the allocation; under the limit the totals alone decide."""
    book = ShareBook()
    limits = {"over": 4, "under": 8}

    def view(critical_of_p1: int) -> dict:
        p1 = {"over": 4, "under": 2}
        return {
            "p0": Member(joined=0.0, seen_at=1.0, demand={"over": 4, "under": 2}, critical={"over": 2, "under": 2}),
            "p1": Member(
                joined=0.0, seen_at=1.0, demand=p1, critical={"over": critical_of_p1, "under": critical_of_p1}
            ),
        }

    book.allocate("p0", view(2), limits, full=True)
    assert book.allocation == {"over": 2, "under": 4}  # 2 critical each; under: 2 each and 4 left, 2 each
    touched, moved = book.allocate("p0", view(0), limits, full=False)
    assert moved == ["over"] and book.allocation == {"over": 3, "under": 4}  # p0: its 2 critical, then 1 of 2
    assert book.allocation == allocate("p0", view(0), limits)
    touched, moved = book.allocate("p0", view(0), limits, full=False)
    assert touched == {"over"} and moved == []  # still over its limit: looked at; nothing moved


class _GrantSome(_GrantAll):
    """A heartbeat that grants a random part of each ask, the others' demand drawn afresh on some replicas."""

    def __init__(self, state, rng, rids):
        super().__init__(state)
        self.rng, self.rids = rng, rids

    async def __call__(self, keys, args):
        entries, asked, reset = await super().__call__(keys, args)
        grants = {
            rid: w if self.rng.random() < 0.7 else self.rng.randint(0, w) for rid, w in json.loads(asked).items()
        }
        for rid in self.rng.sample(self.rids, 3):
            self.demand[rid] = self.rng.randint(0, 6)
        return entries, json.dumps(grants), reset


def test_caps_moved_replica_by_replica_are_the_caps_worked_out_whole():
    """A beat gives new caps only to the replicas whose allocation or holding moved, in the pools that hold them;
    after every beat each slot admits exactly what working out every pool's caps again gives."""
    rng = random.Random(5)
    state = ProxyState(ProxyConfig())
    runtimes = [
        state.runtimes.setdefault(e.id, EndpointRuntime(e, config=ProxyConfig(), clock=lambda: 0.0))
        for e in (endpoint(id=7 + i, name=f"e{i}", replicas=3, limit=6) for i in range(4))
    ]
    rids = [rid for rt in runtimes for rid in rt.slots]
    beat = _GrantSome(state, rng, rids)
    beat.others = ["p-other"]
    running = []
    for n in range(40):
        for _ in range(rng.randint(0, 3)):  # this process's own streams start and end between beats
            rt = rng.choice(runtimes)
            route = RouteRequest(request_id=f"q{n}-{len(running)}", prompt_text="hi")
            slot = rt.try_take(route, 0.1)
            if slot is not None:
                running.append((rt, slot, route))
        for rt, slot, route in [running.pop(rng.randrange(len(running))) for _ in range(min(len(running), 2))]:
            rt.release(slot, route, 0.1, 0.1)
        asyncio.run(state._beat())
        moved = {rid: rt.slots[rid].view.concurrency_limit for rt in runtimes for rid in rt.slots}
        caps = [dict(rt.caps) for rt in runtimes]
        state._apply_caps()  # every pool, every replica
        assert moved == {rid: rt.slots[rid].view.concurrency_limit for rt in runtimes for rid in rt.slots}, n
        assert caps == [rt.caps for rt in runtimes], n
    assert len(beat.asked) == 40 and sum(map(len, beat.asked[1:])) < 0.5 * 39 * len(rids)  # asked for what moved
