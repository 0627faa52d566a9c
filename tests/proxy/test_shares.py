"""Sharing each replica's concurrency limit between proxy processes: the pure targets
(``gateway.admission.shares``) and the atomic grant in the heartbeat script (real Redis)."""

import asyncio
import dataclasses
import itertools
import json
import random
import time

import pytest
import redis
from django.conf import settings

from gateway.admission.shares import (
    Member,
    allocate,
    demand_parts,
    fair_share,
    max_min_fill,
    spread,
    spread_queue,
)
from gateway.proxy.caps import lower_caps
from gateway.proxy.config import ProxyConfig
from gateway.proxy.membership import FULL_BEAT_EVERY, HEARTBEAT, LEAVE, parse_members
from gateway.proxy.runtime import EndpointRuntime
from gateway.proxy.snapshot import ReplicaInfo
from gateway.proxy.state import ProxyState
from gateway.routing.base import RouteRequest
from tests.rollouts.test_traffic_split import info
from tests.waiting import wait_for, wait_for_async

CRIT, STD, SHED = 0, 1, 2


def member(demand=(0, 0, 0), rid="r"):
    """``demand``: running plus queued requests per class (critical, standard, sheddable)."""
    return Member(joined=0.0, seen_at=1.0, **demand_parts({rid: demand}))


def test_fair_shares_sum_to_the_limit_and_differ_by_at_most_one():
    for limit, n in itertools.product(range(1, 20), range(1, 7)):
        ids = [f"p{i}" for i in range(n)]
        start = limit * 7 + n  # any place the remainder starts: still the limit, within one of each other
        shares = [fair_share(limit, ids, i, start) for i in ids]
        assert sum(shares) == limit
        assert max(shares) - min(shares) <= 1


def test_the_remainder_of_an_even_split_goes_to_each_member_on_its_part_of_the_replicas():
    # 3 members, a limit of 4 on 600 replicas (one with a request, the rest idle): the one slot over an even split
    # goes to each member on about a third of them, not to the first id everywhere (which would move that member's
    # allocation at every change of demand and no one else's).
    ids = ["a", "b", "c"]
    limits = {f"r{i}": 4 for i in range(600)}
    members = {
        mid: Member(joined=0.0, seen_at=1.0, **demand_parts({"r0": (1, 0, 0)} if mid == "a" else {})) for mid in ids
    }
    extra = {mid: sum(n - 1 for rid, n in allocate(mid, members, limits).items() if rid != "r0") for mid in ids}
    assert all(170 <= extra[mid] <= 230 for mid in ids), extra
    assert sum(extra.values()) == 599
    # Every member works out the same split: the allocations sum to each limit.
    for rid in limits:
        assert sum(allocate(mid, members, limits)[rid] for mid in ids) == 4


def test_max_min_fill_meets_small_demands_and_splits_the_rest_evenly():
    assert max_min_fill(10, {"a": 2, "b": 20, "c": 20}) == {"a": 2, "b": 4, "c": 4}
    assert max_min_fill(9, {"a": 2, "b": 20, "c": 20}) == {"a": 2, "b": 4, "c": 3}
    assert max_min_fill(50, {"a": 2, "b": 3}) == {"a": 2, "b": 3}  # nobody gets more than it asks
    assert max_min_fill(0, {"a": 5}) == {"a": 0}
    rng = random.Random(3)
    for _ in range(300):
        demands = {f"p{i}": rng.randint(0, 12) for i in range(rng.randint(1, 6))}
        cap = rng.randint(0, 40)
        got = max_min_fill(cap, demands)
        assert sum(got.values()) == min(cap, sum(demands.values()))
        assert all(0 <= got[m] <= demands[m] for m in demands)
        # Max-min fair: anyone short of its demand has at least as much as anyone else, minus one.
        short = [got[m] for m in demands if got[m] < demands[m]]
        if short:
            assert min(short) >= max(got.values()) - 1


def test_spread_queue_counts_every_request_once_in_proportion_to_the_limits():
    spread = spread_queue((3, 10, 0), {"r1": 8, "r2": 8, "r3": 16})
    assert [sum(spread[r][c] for r in spread) for c in range(3)] == [3, 10, 0]
    assert spread["r3"][STD] == 5 and spread["r1"][STD] + spread["r2"][STD] == 5
    assert spread_queue((4, 0, 0), {}) == {}


def test_a_lone_process_gets_the_whole_limit_and_a_non_member_asks_for_everything():
    assert allocate("a", {"a": member()}, {"r": 7}) == {"r": 7}
    assert allocate("new", {"a": member()}, {"r": 7}) == {"r": 7}  # the grant gives what is free


def test_an_idle_process_lends_its_share_to_a_busy_one_and_keeps_headroom_when_both_idle():
    busy = {"a": member(demand=(0, 8, 0)), "b": member()}  # 2 running, 6 queued
    assert allocate("a", busy, {"r": 8}) == {"r": 8}
    assert allocate("b", busy, {"r": 8}) == {"r": 0}
    idle = {"a": member(), "b": member()}
    assert allocate("a", idle, {"r": 8}) == {"r": 4}
    assert allocate("b", idle, {"r": 8}) == {"r": 4}
    both = {"a": member(demand=(0, 20, 0)), "b": member(demand=(0, 3, 0))}
    assert allocate("a", both, {"r": 8}) == {"r": 5}  # max-min: b's 3 in full, a the rest
    assert allocate("b", both, {"r": 8}) == {"r": 3}


def test_critical_demand_in_one_process_comes_before_sheddable_demand_in_another():
    members = {
        "a": member(demand=(0, 0, 14)),  # 4 sheddable running, 10 queued
        "b": member(demand=(3, 4, 0)),  # 4 standard running, 3 critical queued
    }
    # b's critical, then b's standard, then a's sheddable: a may run 1 (it admits nothing new until its
    # streams end, and gives each slot back at its next heartbeat), b may run 7.
    assert allocate("a", members, {"r": 8}) == {"r": 1}
    assert allocate("b", members, {"r": 8}) == {"r": 7}
    # The other way round: sheddable work never pushes critical work out.
    swapped = {"a": member(demand=(6, 0, 0)), "b": member(demand=(0, 0, 20))}
    assert allocate("a", swapped, {"r": 8}) == {"r": 6}
    assert allocate("b", swapped, {"r": 8}) == {"r": 2}


def test_allocations_sum_to_the_limit_and_meet_all_demand_that_fits():
    rng = random.Random(7)
    for _ in range(400):
        n, limit = rng.randint(1, 5), rng.randint(1, 16)
        rows = {f"p{i}": tuple(rng.randint(0, 6) for _ in range(3)) for i in range(n)}
        members = {mid: member(demand=row) for mid, row in rows.items()}
        got = {mid: allocate(mid, members, {"r": limit})["r"] for mid in members}
        assert sum(got.values()) == limit
        total = {mid: sum(row) for mid, row in rows.items()}
        if sum(total.values()) <= limit:
            assert all(got[mid] >= total[mid] for mid in members)
        # Critical demand is served before any other class, wherever it is.
        critical = {mid: row[CRIT] for mid, row in rows.items()}
        if sum(critical.values()) <= limit:
            assert all(got[mid] >= critical[mid] for mid in members)


def reference_allocate(me, members, limits):
    """The split as the module docstring states it, worked out for every member from its demand rows (``members``:
    member → replica → counts per class): each class max-min filled in turn, the rest split evenly; ``me``'s part."""
    if me not in members:
        return dict(limits)
    out = {}
    for rid, limit in limits.items():
        alloc, left = dict.fromkeys(members, 0), limit
        for c in range(3):
            if left <= 0:
                break
            demand = {mid: max(0, int(m.get(rid, ())[c])) if c < len(m.get(rid, ())) else 0
                      for mid, m in members.items()}  # fmt: skip
            got = max_min_fill(left, demand)
            for mid, count in got.items():
                alloc[mid] += count
            left -= sum(got.values())
        if left > 0:
            for mid in members:
                alloc[mid] += fair_share(left, list(members), mid, spread(rid))
        out[rid] = alloc[me]
    return out


def test_each_process_works_out_its_own_part_of_the_split_as_the_whole_split_gives_it():
    rng = random.Random(29)
    for _ in range(400):
        ids = rng.sample(["p0", "p1", "p2", "p3", "p4", "zz"], rng.randint(1, 6))
        rids = [f"r{i}" for i in range(rng.randint(1, 5))]
        rows = {
            mid: {
                rid: tuple(rng.choice([0, 0, 1, 2, 5, 9]) for _ in range(rng.choice([0, 1, 3])))
                for rid in rids
                if rng.random() < 0.7
            }
            for mid in ids
        }
        members = {mid: Member(joined=0.0, seen_at=1.0, **demand_parts(rows[mid])) for mid in ids}
        limits = {rid: rng.randint(0, 12) for rid in rids}
        for me in ids:
            assert allocate(me, members, limits) == reference_allocate(me, rows, limits)
        # Every process's part together is the whole limit.
        for rid in rids:
            assert sum(allocate(me, members, limits)[rid] for me in ids) == limits[rid]


@pytest.fixture
def members_redis():
    client = redis.Redis.from_url(settings.REDIS_URL)
    doomed = lambda: ["test:members", *client.keys("test:members:*")]  # noqa: E731
    client.delete(*doomed())
    yield client
    client.delete(*doomed())
    client.close()


def _beat(client, pid, want, limits, ttl=5.0):
    """One heartbeat of ``pid`` asking to hold ``want`` (replica → slots, the changes only): (members, grants,
    whether it was not a live member)."""
    entries, grants, reset = client.register_script(HEARTBEAT)(
        keys=["test:members"],
        args=[pid, json.dumps(want), "{}", "{}", "{}", repr(ttl), json.dumps({rid: limits[rid] for rid in want})],
    )
    return parse_members(entries), json.loads(grants), bool(reset)


def _held(client, pid) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in client.hgetall(f"test:members:h:{pid}").items()}


def test_the_heartbeat_grants_only_what_the_other_live_members_leave_free(members_redis):
    def grant(pid, want, limits):
        return _beat(members_redis, pid, want, limits)[1]

    assert _beat(members_redis, "a", {"r": 8}, {"r": 8})[1:] == ({"r": 8}, True)  # a new member
    members, grants, reset = _beat(members_redis, "b", {"r": 4}, {"r": 8})
    assert grants == {"r": 0} and set(members) == {"a", "b"}  # a holds everything
    assert _held(members_redis, "a") == {"r": 8} and _held(members_redis, "b") == {}
    assert grant("a", {"r": 3}, {"r": 8}) == {"r": 3}  # a release is immediate
    assert grant("b", {"r": 9}, {"r": 8}) == {"r": 5}  # b gets what a left, no more
    assert grant("a", {"r": 8}, {"r": 8}) == {"r": 3}  # a cannot take b's back
    assert grant("a", {}, {}) == {} and _held(members_redis, "a") == {"r": 3}  # no change asked: holdings stay
    # Whatever the order and the asks, the live holdings never sum above the limit.
    rng = random.Random(11)
    limits = {"r": 8, "s": 2}
    for _ in range(200):
        pid = rng.choice("abc")
        want = {rid: rng.randint(0, 10) for rid in limits if rng.random() < 0.7}
        grants = grant(pid, want, limits)
        assert all(0 <= grants[rid] <= want[rid] for rid in want)
        held = [_held(members_redis, p) for p in "abc"]
        assert grants.items() <= {**dict.fromkeys(want, 0), **held["abc".index(pid)]}.items()
        for rid, limit in limits.items():
            assert sum(h.get(rid, 0) for h in held) <= limit


def test_holdings_totals_lost_in_redis_are_summed_again_before_anything_is_granted(members_redis):
    # "a" holds 6 of 8; the totals the grants read are lost (evicted, or written by a version that kept none).
    assert _beat(members_redis, "a", {"r": 6}, {"r": 8})[1] == {"r": 6}
    members_redis.delete("test:members:held")
    # "b" asks for all 8: it gets what "a" does not hold, not the whole limit.
    assert _beat(members_redis, "b", {"r": 8}, {"r": 8})[1] == {"r": 2}
    assert {k.decode(): int(v) for k, v in members_redis.hgetall("test:members:held").items()} == {"r": 8}


def _sum_held(client, rid: str) -> int:
    return sum(int(client.hget(key, rid) or 0) for key in client.keys("test:members:h:*"))


def test_beside_a_member_that_keeps_no_totals_grants_read_every_holding(members_redis):
    # "old" runs the version before (unmarked): it holds 4 in the totals, then its script grants it 6 more in its
    # holdings hash alone, as that version's does.
    _beat(members_redis, "old", {"r": 4}, {"r": 10})
    members_redis.srem("test:members:v2", "old")
    members_redis.hset("test:members:h:old", "r", 10)
    assert _beat(members_redis, "new", {"r": 10}, {"r": 10})[1] == {"r": 0}
    assert _sum_held(members_redis, "r") == 10
    # "old" goes; the totals are summed afresh from the hashes and the slots it held can be granted again.
    members_redis.eval(LEAVE, 1, "test:members", "old")
    assert _beat(members_redis, "new", {"r": 10}, {"r": 10})[1] == {"r": 10}
    assert {k.decode(): int(v) for k, v in members_redis.hgetall("test:members:held").items()} == {"r": 10}


def test_a_holdings_hash_expired_before_its_member_was_counted_out_leaves_no_phantom(members_redis):
    _beat(members_redis, "a", {"r": 5}, {"r": 10}, ttl=0.2)  # its hash expires 2 s after this beat
    time.sleep(0.1)
    _beat(members_redis, "b", {"r": 5}, {"r": 10}, ttl=0.2)  # the totals and b's hash 0.1 s later
    time.sleep(1.95)  # a's hash has expired, a itself is not yet counted out
    assert _beat(members_redis, "c", {"r": 10}, {"r": 10}, ttl=0.2)[1] == {"r": 10}  # a and b are gone


def test_a_dead_members_holdings_go_back_after_its_ttl(members_redis):
    before_a_beat = time.monotonic()
    _beat(members_redis, "a", {"r": 8}, {"r": 8}, ttl=0.2)
    assert _beat(members_redis, "b", {"r": 8}, {"r": 8}, ttl=0.2)[1] == {"r": 0}

    def b_beats_alone():
        members, grants, _ = _beat(members_redis, "b", {"r": 8}, {"r": 8}, ttl=0.2)
        return grants if set(members) == {"b"} else None

    # "a" stops beating; "b" goes on asking until "a" is counted out, and its holdings with it.
    assert wait_for(b_beats_alone, timeout=5, interval=0.02, message='"a" counted out') == {"r": 8}
    assert time.monotonic() - before_a_beat >= 0.2, "counted out before its TTL"
    assert _held(members_redis, "a") == {}
    # "a" comes back: it was counted out, so it is told so, holds nothing, and gets nothing "b" holds.
    members, grants, reset = _beat(members_redis, "a", {"r": 8}, {"r": 8}, ttl=0.2)
    assert reset and grants == {"r": 0} and set(members) == {"a", "b"}


def test_a_runtime_reports_running_and_queued_requests_per_class_and_stops_admitting_at_its_allocation():
    async def scenario():
        one = [ReplicaInfo(id=10, name="r", url="http://r", concurrency_limit=4, version_id=1)]
        rt = EndpointRuntime(info(replicas=one), config=ProxyConfig(), clock=lambda: 0.0)
        (rid,) = rt.replica_limits()
        rt.apply_caps({rid: 2})  # this process holds 2 of the replica's 4 slots
        routes = [RouteRequest(request_id=f"r{i}", prompt_text="hi") for i in range(4)]
        running = [await rt.acquire(routes[i], tenant="t", priority="critical", mu=1.0) for i in range(2)]
        waiting = asyncio.ensure_future(rt.acquire(routes[2], tenant="t", priority="sheddable", mu=1.0))
        await wait_for_async(lambda: rt.demand_by_replica()[rid][SHED], timeout=5, message="the third request queued")
        assert rt.demand_by_replica() == {rid: (2, 0, 1)}  # 2 critical running, 1 sheddable queued
        lower_caps(rt, {rid: 1})  # the allocation shrank: nothing new is admitted, nothing running is cut
        rt.release(running[0][0], routes[0], 1.0, 1.0)
        await asyncio.sleep(0.05)  # on purpose: loop turns in which a wrong admission would happen
        assert not waiting.done() and rt.demand_by_replica() == {rid: (1, 0, 1)}
        rt.apply_caps({rid: 2})
        slot, _ = await asyncio.wait_for(waiting, timeout=5)
        assert rt.demand_by_replica() == {rid: (1, 0, 1)}  # now running, no longer queued
        rt.release(slot, routes[2], 1.0, 1.0)
        assert rt.demand_by_replica() == {rid: (1, 0, 0)}

    asyncio.run(scenario())


def test_caps_follow_holdings_and_allocation_and_fall_back_to_an_even_share_while_redis_is_unreachable():
    state = ProxyState(ProxyConfig())
    replicas = [
        ReplicaInfo(id=10, name="a", url="http://a", concurrency_limit=4, version_id=1),
        ReplicaInfo(id=11, name="b", url="http://b", concurrency_limit=4, version_id=1),
    ]
    rt = state.runtimes[1] = EndpointRuntime(info(replicas=replicas), config=ProxyConfig(), clock=lambda: 0.0)
    me = state.process_id
    state.members = {
        me: Member(joined=0.0, seen_at=1.0, holdings={"10": 3}),
        "other": Member(joined=0.0, seen_at=1.0, holdings={"10": 1}),
    }
    state._book.allocation = {"10": 2}
    state._apply_caps()
    assert rt.caps == {"10": 2, "11": 0}  # min(holding, allocation); "11" waits for the next beat's grant
    state._beat_failing = True  # Redis unreachable: no beat can grant "11", which nobody holds
    state._apply_caps()
    assert rt.caps == {"10": 2, "11": 2}  # an even share of its 4 over the 2 members every process knows


class _Proxy:
    """A ``ProxyState`` beating on a test hash with one replica of ``limit`` slots (not started: no scraper, no
    snapshot; the heartbeat alone)."""

    def __init__(self, client, limit=10, ttl=0.3):
        self.state = ProxyState(ProxyConfig(member_ttl_s=ttl))
        self.state.members_key = "test:members"
        self.state.redis = client
        self.script = self.state._heartbeat = client.register_script(HEARTBEAT)
        replica = ReplicaInfo(id=10, name="r", url="http://r", concurrency_limit=limit, version_id=1)
        self.runtime = self.state.runtimes[1] = EndpointRuntime(
            info(replicas=[replica]), config=ProxyConfig(), clock=time.monotonic
        )

    def cap(self) -> int:
        return self.runtime.caps["10"]


def _other_beat(client, pid, want, limit=10, ttl=0.3):
    return _beat(client, pid, {"10": want}, {"10": limit}, ttl=ttl)


@pytest.fixture
def async_members_redis(members_redis):
    import redis.asyncio as aioredis  # noqa: PLC0415 - the async client for a ProxyState's own loop

    return aioredis.Redis.from_url(settings.REDIS_URL)


def test_after_an_outage_caps_come_from_what_redis_grants_not_from_an_even_share(members_redis, async_members_redis):
    async def scenario():
        a = _Proxy(async_members_redis)
        _other_beat(members_redis, "b", 5)  # b holds 5 of 10
        await a.state._beat()  # a joins: asks for all, gets the 5 b leaves
        assert _held(members_redis, a.state.process_id) == {"10": 5} and a.cap() == 5

        async def unreachable(**_):
            raise redis.ConnectionError("Redis away")

        a.state._heartbeat = unreachable
        with pytest.raises(redis.ConnectionError):
            await a.state._beat()
        assert a.cap() == 5  # what it held: nobody can take it meanwhile
        await asyncio.sleep(0.4)  # past the TTL: both entries stale
        a.state._heartbeat = a.script
        await a.state._beat()  # back: a was counted out; it must ask again for everything, b still counted
        held_a = _held(members_redis, a.state.process_id).get("10", 0)
        assert a.cap() <= held_a <= 10
        members, grants, _ = _other_beat(members_redis, "b", 5)  # b back too: gets what a left
        assert held_a + grants["10"] <= 10
        await a.state._beat()
        assert a.cap() + grants["10"] <= 10 and a.cap() <= _held(members_redis, a.state.process_id).get("10", 0)

    asyncio.run(scenario())


def test_a_holding_lost_in_redis_is_asked_for_again_and_a_lowered_limit_clips_what_is_held(
    members_redis, async_members_redis
):
    async def scenario():
        a = _Proxy(async_members_redis, ttl=5.0)
        await a.state._beat()
        mine = f"test:members:h:{a.state.process_id}"
        assert _held(members_redis, a.state.process_id) == {"10": 10}
        members_redis.delete(mine)  # evicted, or a reply lost after the script ran: a still believes it holds 10
        members_redis.hset(mine, "99", 3)  # and a lost reply's grant of a replica since gone from a's pools
        await a.state._beat()
        assert _held(members_redis, a.state.process_id) == {"99": 3}  # nothing changed in a's eyes: nothing asked
        # The totals the script grants from still count the 10 lost; they are summed afresh from the hashes every
        # SUM_EVERY_S (10 s, what a full beat's period also is): that time passing, as the marker's expiry.
        members_redis.delete("test:members:summed")
        for _ in range(FULL_BEAT_EVERY):  # within a full beat's period a asks for every replica, and only those
            await a.state._beat()
        assert _held(members_redis, a.state.process_id) == {"10": 10} == {"10": a.cap()}
        # a runs 10 streams, so it wants what it holds; the replica's limit drops to 4: the holding is clipped to it.
        a.runtime.slots["10"].view.in_flight = a.runtime.in_flight = 10
        lowered = ReplicaInfo(id=10, name="r", url="http://r", concurrency_limit=4, version_id=1)
        a.runtime.update(dataclasses.replace(a.runtime.info, replicas=(lowered,)))
        await a.state._beat()
        assert _held(members_redis, a.state.process_id) == {"10": 4} and a.cap() <= 4

    asyncio.run(scenario())
