"""The vertical tick reading a fixed sample of each endpoint's replicas (docs/algorithms.md#the-vertical-tick-at-fleet-
scale): which replicas the sample holds and how it moves when the fleet does, the live tick scraping those alone,
a replica that joins the sample giving its gauges but not its counts since it started, and the simulator's vertical
axis reading the same sample."""

import math
from datetime import timedelta

import pytest
from django.utils import timezone

from capacity.autoscaling import store, vertical, vertical_ticks
from capacity.models import AutoscalerDecision
from endpoints.models import Replica, ReplicaRole, ReplicaState
from tests.autoscaling.test_ticks import MetricsServer
from tests.factories import EndpointFactory, ReplicaFactory


def test_the_sample_is_every_replica_until_the_fleet_outgrows_it():
    assert vertical.sample_replicas([5, 3, 9], 0) == [5, 3, 9]
    assert vertical.sample_replicas([5, 3, 9], 3) == [5, 3, 9]
    assert len(vertical.sample_replicas(range(10), 3)) == 3


def test_the_sample_moves_by_one_replica_when_one_leaves_or_joins():
    ids = list(range(100, 140))
    sample = vertical.sample_replicas(ids, 3)
    assert vertical.sample_replicas(list(reversed(ids)), 3) == sample  # the order the rows come in does not matter
    # A non-member leaving, or a new replica ranking after the sample's members, changes nothing
    outsider = next(i for i in ids if i not in sample)
    assert vertical.sample_replicas([i for i in ids if i != outsider], 3) == sample
    newcomers = range(1000, 1100)
    after = {n: vertical.sample_replicas([*ids, n], 3) for n in newcomers}
    assert any(a == sample for a in after.values())
    # One ranking among them takes one member's place, the other two stay
    joined = [a for a in after.values() if a != sample]
    assert joined and all(len(set(a) - set(sample)) == 1 and len(set(a) & set(sample)) == 2 for a in joined)
    # A member leaving is replaced by exactly one other; the two that stay stay
    after = vertical.sample_replicas([i for i in ids if i != sample[0]], 3)
    assert set(sample[1:]) <= set(after) and len(set(after) - set(sample)) == 1
    # The rank is a hash, not the order: over many endpoints' ids the sample is not the lowest three
    lowest = sum(
        sorted(vertical.sample_replicas(range(b, b + 10), 3)) == list(range(b, b + 3)) for b in range(0, 500, 10)
    )
    assert lowest < 10


def endpoint_of(servers, kvs, roles=None) -> tuple:
    """An endpoint with a ready replica per KV usage in ``kvs`` (of ``roles``, mixed by default), each answering from
    its own server: the endpoint and {replica id: server}."""
    endpoint = EndpointFactory(concurrency_limit=64, ttft_slo_ms=2000, tpot_slo_ms=100)
    by_replica = {}
    for kv, role in zip(kvs, roles or [ReplicaRole.MIXED] * len(kvs), strict=True):
        server = servers(kv=kv)
        replica = ReplicaFactory(
            endpoint=endpoint, state=ReplicaState.READY, url=server.url, concurrency_limit=64, role=role
        )
        by_replica[replica.pk] = server
    return endpoint, by_replica


def serving_for_an_hour(endpoint) -> None:
    """Its replicas ready for an hour: a first read of one is not its first cycle."""
    Replica.objects.filter(endpoint=endpoint).update(state_changed_at=timezone.now() - timedelta(hours=1))


@pytest.fixture
def servers():
    made = []

    def make(kv: float) -> MetricsServer:
        server = MetricsServer()
        server.kv, server.running, server.hits = kv, 48, 0
        text = server.text

        def counted():
            server.hits += 1
            return text()

        server.text = counted
        made.append(server)
        return server

    yield make
    for server in made:
        server.close()


@pytest.mark.django_db(transaction=True)
def test_the_live_tick_scrapes_the_sample_alone(clean_store, servers):
    endpoint, by_replica = endpoint_of(servers, [0.1 * (i + 1) for i in range(6)])
    members = vertical.sample_replicas(list(by_replica), 2)
    rows = vertical_ticks.vertical_ticks(endpoint_ids=[endpoint.pk], tick="s-1", sample=2)
    row = rows[endpoint.pk]
    assert {pk for pk, s in by_replica.items() if s.hits} == set(members)
    # The highest KV usage is the sample's: a replica outside it is not seen
    assert row.inputs["kv_usage"] == pytest.approx(max(by_replica[pk].kv for pk in members))
    # Read all (0): every replica answers once more
    vertical_ticks.vertical_ticks(endpoint_ids=[endpoint.pk], tick="s-2", sample=0)
    assert sorted(s.hits for s in by_replica.values()) == [1, 1, 1, 1, 2, 2]


@pytest.mark.django_db(transaction=True)
def test_a_replica_joining_the_sample_gives_its_gauges_and_not_its_counts_since_it_started(clean_store, servers):
    endpoint, by_replica = endpoint_of(servers, [0.3] * 4)
    serving_for_an_hour(endpoint)
    first, second = vertical.sample_replicas(list(by_replica), 2)
    for server in by_replica.values():
        server.ttft, server.tpot = [100, 0, 0, 0, 0, 0], [100, 0, 0, 0, 0]  # fast so far
    vertical_ticks.vertical_ticks(endpoint_ids=[endpoint.pk], tick="j-1", sample=2)  # snapshots of the two
    # A cycle: the members serve fast first tokens; the replica about to join had served slow ones all along
    by_replica[second].ttft = [200, 0, 0, 0, 0, 0]
    [joining] = [pk for pk in vertical.sample_replicas([pk for pk in by_replica if pk != first], 2) if pk != second]
    by_replica[joining].ttft, by_replica[joining].kv = [0, 0, 0, 0, 500, 0], 0.9
    Replica.objects.filter(pk=first).update(state=ReplicaState.STOPPED)
    row = vertical_ticks.vertical_ticks(endpoint_ids=[endpoint.pk], tick="j-2", sample=2)[endpoint.pk]
    assert row.inputs["ttft_p95_ms"] <= 100  # the 500 slow first tokens since it started are not this cycle's
    assert row.inputs["kv_usage"] == pytest.approx(0.9)  # its gauge counts at once
    # From its second read on its counts are diffed like any member's
    by_replica[joining].ttft = [0, 0, 0, 0, 1000, 0]
    row = vertical_ticks.vertical_ticks(endpoint_ids=[endpoint.pk], tick="j-3", sample=2)[endpoint.pk]
    assert row.inputs["ttft_p95_ms"] > 2500
    assert AutoscalerDecision.objects.filter(endpoint=endpoint).count() == 3
    assert store.client().get(store.HIST_KEY.format(replica_id=joining)) is not None


def test_a_snapshot_reads_back_as_written_and_anything_else_as_none():
    ttft, tpot = {0.1: 3.0, 0.5: 7.0, math.inf: 9.0}, {0.01: 100.0, math.inf: 120.0}
    raw = vertical_ticks._pack(1234.5, ttft, tpot)
    assert vertical_ticks._unpack(raw) == (1234.5, ttft, tpot)
    assert vertical_ticks._unpack(vertical_ticks._pack(1.0, {}, {})) == (1.0, {}, {})
    # Nothing stored, a cut value, an earlier release's JSON: no snapshot
    for other in (None, raw[:-1], raw + b"x", b'{"ttft": [["0.1", 3]], "tpot": []}'):
        assert vertical_ticks._unpack(other) == (None, None, None)


@pytest.mark.django_db(transaction=True)
def test_a_member_whose_snapshot_is_older_than_a_cycle_gives_its_gauges_only(clean_store, servers, monkeypatch):
    # Left the sample and joined it again within the snapshot's hour: its counts span the time it was out
    endpoint, replicas = endpoint_of(servers, [0.3] * 3)
    serving_for_an_hour(endpoint)
    vertical_ticks.vertical_ticks(endpoint_ids=[endpoint.pk], tick="o-1", sample=1)
    for server in replicas.values():
        server.ttft = [0, 0, 0, 0, 50, 0]
    clock = vertical_ticks.time.time() + vertical_ticks.SNAPSHOT_FRESH_S + 1
    monkeypatch.setattr(vertical_ticks.time, "time", lambda: clock)
    row = vertical_ticks.vertical_ticks(endpoint_ids=[endpoint.pk], tick="o-2", sample=1)[endpoint.pk]
    assert row.inputs["ttft_p95_ms"] is None and row.inputs["kv_usage"] == pytest.approx(0.3)
    for server in replicas.values():
        server.ttft = [0, 0, 0, 0, 100, 0]
    row = vertical_ticks.vertical_ticks(endpoint_ids=[endpoint.pk], tick="o-3", sample=1)[endpoint.pk]
    assert row.inputs["ttft_p95_ms"] > 2500  # fresh again: diffed


def test_the_simulators_vertical_axis_reads_the_same_sample():
    from types import SimpleNamespace as NS

    from simulator.autoscaling import EngineSimAutoscaler

    class Policy:
        interval_s, vertical_interval_s, vertical_sample = 5.0, 30.0, 2

        def __init__(self):
            self.calls = []

        def adjust_concurrency(self, **signals):
            self.calls.append(signals)
            return 8

    ids = [f"r{i}" for i in range(6)]
    members = vertical.sample_replicas(ids, 2)
    replicas = [
        NS(replica_id=i, state="ready", kv_usage=0.9 if i not in members else 0.2, num_waiting=0, in_flight=4,
           concurrency_limit=8)
        for i in ids
    ]  # fmt: skip
    fleet, actions = NS(replicas=replicas, now=30.0), NS(set_concurrency=lambda limit: None)

    def finished(replica_id, ttft_s):
        return NS(replica_id=replica_id, dispatch_s=0.0, first_token_s=ttft_s, tpot_s=0.02)

    policy = Policy()
    scaler = EngineSimAutoscaler(policy)
    scaler.finished = [finished(i, 1.0 if i in members else 9.0) for i in ids]
    scaler._vertical(fleet, actions)
    # The members' gauges and latencies (all just became ready: their counts since they started are this cycle's)
    assert policy.calls[-1]["kv_usage"] == pytest.approx(0.2)
    assert policy.calls[-1]["ttft_p95_ms"] == pytest.approx(1000.0)
    scaler.finished = [finished(i, 0.1 if i in members else 9.0) for i in ids]
    scaler._vertical(fleet, actions)
    assert policy.calls[-1]["ttft_p95_ms"] == pytest.approx(100.0)  # the members' requests alone
    # A member leaves: the replica taking its place was serving, unread; its gauges count, its latencies not yet
    gone = members[0]
    fleet.replicas = [r for r in replicas if r.replica_id != gone]
    [joined] = set(vertical.sample_replicas([r.replica_id for r in fleet.replicas], 2)) - set(members)
    scaler.finished = [finished(i, 0.1 if i in members else 9.0) for i in ids if i != gone]
    scaler._vertical(fleet, actions)
    assert policy.calls[-1]["kv_usage"] == pytest.approx(0.9) and policy.calls[-1]["ttft_p95_ms"] == pytest.approx(
        100.0
    )
    scaler.finished = [finished(i, 0.1 if i in members else 9.0) for i in ids if i != gone]
    scaler._vertical(fleet, actions)
    assert policy.calls[-1]["ttft_p95_ms"] > 1000  # read twice in a row: counted
    assert joined not in members


@pytest.mark.django_db(transaction=True)
def test_an_endpoint_read_whole_again_counts_no_replica_without_a_fresh_snapshot(clean_store, servers):
    # Four replicas, three sampled; one member leaves and the endpoint is read whole again: the replica that was
    # outside the sample has no snapshot, so its slow first tokens since it started are not this cycle's
    endpoint, by_replica = endpoint_of(servers, [0.3] * 4)
    serving_for_an_hour(endpoint)
    members = vertical.sample_replicas(list(by_replica), 3)
    [outsider] = [pk for pk in by_replica if pk not in members]
    by_replica[outsider].ttft = [0, 0, 0, 0, 5000, 0]
    vertical_ticks.vertical_ticks(endpoint_ids=[endpoint.pk], tick="w-1", sample=3)
    Replica.objects.filter(pk=members[0]).update(state=ReplicaState.STOPPED)
    for pk in members[1:]:
        by_replica[pk].ttft = [100, 0, 0, 0, 0, 0]  # the cycle: fast first tokens
    row = vertical_ticks.vertical_ticks(endpoint_ids=[endpoint.pk], tick="w-2", sample=3)[endpoint.pk]
    assert row.inputs["ttft_p95_ms"] <= 100


@pytest.mark.django_db(transaction=True)
def test_a_disaggregated_endpoint_is_sampled_per_role(clean_store, servers):
    roles = [ReplicaRole.PREFILL] * 3 + [ReplicaRole.DECODE] * 3
    endpoint, by_replica = endpoint_of(servers, [0.3] * 6, roles)
    vertical_ticks.vertical_ticks(endpoint_ids=[endpoint.pk], tick="r-1", sample=2)
    read = [role for role, server in zip(roles, by_replica.values(), strict=True) if server.hits]
    assert sorted(read) == sorted([ReplicaRole.PREFILL] * 2 + [ReplicaRole.DECODE] * 2)
