"""The vertical tick reading a fixed sample of each endpoint's replicas (docs/algorithms.md#the-vertical-tick-at-fleet-
scale): which replicas the sample holds and how it moves when the fleet does, the live tick scraping those alone,
a replica that joins the sample giving its gauges but not its counts since it started, and the simulator's vertical
axis reading the same sample."""

import math

import pytest

from capacity.autoscaling import store, vertical, vertical_ticks
from capacity.models import AutoscalerDecision
from endpoints.models import Replica, ReplicaState
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
    # A non-member leaving, or a new replica that ranks below the sample, changes nothing
    outsider = next(i for i in ids if i not in sample)
    assert vertical.sample_replicas([i for i in ids if i != outsider], 3) == sample
    # A member leaving is replaced by exactly one other; the two that stay stay
    after = vertical.sample_replicas([i for i in ids if i != sample[0]], 3)
    assert set(sample[1:]) <= set(after) and len(set(after) - set(sample)) == 1
    # Samples of different endpoints are not all "the lowest ids": the rank is a hash, not the order
    assert sorted(sample) != ids[:3] or sorted(vertical.sample_replicas(ids[3:], 3)) != ids[3:6]


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
    endpoint = EndpointFactory(concurrency_limit=64, ttft_slo_ms=2000, tpot_slo_ms=100)
    by_replica = {}
    for i in range(6):
        server = servers(kv=0.1 * (i + 1))
        replica = ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY, url=server.url, concurrency_limit=64)
        by_replica[replica.pk] = server
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
    endpoint = EndpointFactory(concurrency_limit=64, ttft_slo_ms=2000, tpot_slo_ms=100)
    by_replica = {}
    for _ in range(4):
        server = servers(kv=0.3)
        replica = ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY, url=server.url, concurrency_limit=64)
        by_replica[replica.pk] = server
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
    endpoint = EndpointFactory(concurrency_limit=64, ttft_slo_ms=2000, tpot_slo_ms=100)
    replicas = {}
    for _ in range(3):
        server = servers(kv=0.3)
        replicas[ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY, url=server.url).pk] = server
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
    scaler.finished = [finished(i, 1.0) for i in ids]
    scaler._vertical(fleet, actions)
    # First read: the members' gauges, nobody's latencies (no previous cycle to diff against)
    assert policy.calls[-1]["kv_usage"] == pytest.approx(0.2) and policy.calls[-1]["ttft_p95_ms"] is None
    scaler.finished = [finished(i, 0.1 if i in members else 9.0) for i in ids]
    scaler._vertical(fleet, actions)
    assert policy.calls[-1]["ttft_p95_ms"] == pytest.approx(100.0)  # the members' requests alone
    policy.vertical_sample = 0
    scaler.finished = [finished(i, 0.1 if i in members else 9.0) for i in ids]
    scaler._vertical(fleet, actions)
    assert policy.calls[-1]["kv_usage"] == pytest.approx(0.9) and policy.calls[-1]["ttft_p95_ms"] > 1000
