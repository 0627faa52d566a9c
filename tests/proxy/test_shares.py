"""Splitting each replica's concurrency limit between proxy processes (pure policy)."""

import itertools

import pytest

from endpoints.admission.shares import Member, fair_share, replica_caps, settled


def test_fair_shares_sum_to_the_limit_and_differ_by_at_most_one():
    for limit, n in itertools.product(range(1, 20), range(1, 7)):
        ids = [f"p{i}" for i in range(n)]
        shares = [fair_share(limit, ids, i) for i in ids]
        assert sum(shares) == limit
        assert max(shares) - min(shares) <= 1


def test_a_lone_process_has_the_whole_limit():
    members = {"a": Member(joined=1.0, seen_at=5.0)}
    assert replica_caps("a", members, {"r1": 7, "r2": 3}) == {"r1": 7, "r2": 3}


def test_a_joiner_takes_nothing_until_every_other_member_has_seen_it():
    before = {"a": Member(joined=1.0, seen_at=9.9), "b": Member(joined=10.0, seen_at=10.0)}
    assert not settled("b", before)
    assert replica_caps("b", before, {"r": 8}) == {"r": 0}
    after = {"a": Member(joined=1.0, seen_at=10.2), "b": Member(joined=10.0, seen_at=10.0)}
    assert settled("b", after)
    assert replica_caps("b", after, {"r": 8}) == {"r": 4}
    assert replica_caps("a", after, {"r": 8}) == {"r": 4}
    assert replica_caps("c", after, {"r": 8}) == {"r": 0}  # not a member (its heartbeat has not landed)


def test_a_member_over_its_new_share_holds_back_the_others_until_it_drains():
    # "a" ran 8 of 8 alone; "b" joined: "b" may only use what "a" does not hold.
    members = {"a": Member(joined=1.0, seen_at=10.2, in_flight={"r": 7}), "b": Member(joined=10.0, seen_at=10.1)}
    assert replica_caps("b", members, {"r": 8}) == {"r": 1}
    assert replica_caps("a", members, {"r": 8}) == {"r": 4}
    drained = {"a": Member(joined=1.0, seen_at=11.0, in_flight={"r": 2}), "b": Member(joined=10.0, seen_at=10.9)}
    assert replica_caps("b", drained, {"r": 8}) == {"r": 4}


@pytest.mark.parametrize("n", [2, 3, 5])
def test_caps_never_sum_above_the_limit_whatever_the_reported_in_flight(n):
    ids = [f"p{i}" for i in range(n)]
    for limit in (1, 2, 5, 16) if n < 5 else (1, 2, 5):
        for flights in itertools.product(range(limit + 1), repeat=n):
            members = {
                mid: Member(joined=0.0, seen_at=1.0, in_flight={"r": f}) for mid, f in zip(ids, flights, strict=True)
            }
            caps = [replica_caps(mid, members, {"r": limit})["r"] for mid in ids]
            # Each process admits up to its cap, or keeps what it already runs above it.
            assert sum(max(c, f) for c, f in zip(caps, flights, strict=True)) <= max(limit, sum(flights))
            if sum(flights) <= limit and all(
                f <= fair_share(limit, ids, mid) for mid, f in zip(ids, flights, strict=True)
            ):
                assert sum(caps) == limit  # at rest the whole limit is handed out
