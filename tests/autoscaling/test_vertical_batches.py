"""The vertical tick in batches (docs/algorithms.md#the-vertical-tick-at-fleet-scale): a batch decides as its endpoints
ticked one at a time do (the same code, batch size one), one endpoint's failure kept from the others, a fixed number of queries per batch whatever its size,
a replica that does not answer skipped, the streaks kept in Redis (or read back from the last decision), the
in-memory store of the embedded default, the parser reading the same from any subset of the exposition, and a scrape
reading a whole 200 response or nothing."""

import asyncio
import json
import socket
import threading
import time
from unittest import mock

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest

from capacity.autoscaling import replica_metrics, replica_scrapes, store, vertical_ticks
from capacity.models import AutoscalerDecision
from endpoints.models import Endpoint, ReplicaState
from tests.autoscaling.test_ticks import MetricsServer
from tests.factories import EndpointFactory, ReplicaFactory
from workers.tasks import autoscaling as tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def server():
    metrics = MetricsServer()
    metrics.running = 48  # three quarters of a limit of 64: a loaded replica, whose health is evidence
    yield metrics
    metrics.close()


def fleet(count: int, url: str, *, replicas: int = 2, **fields) -> list[Endpoint]:
    endpoints = []
    for _ in range(count):
        endpoint = EndpointFactory(**{"concurrency_limit": 64, "ttft_slo_ms": 2000, "tpot_slo_ms": 100, **fields})
        for _ in range(replicas):
            ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY, url=url, concurrency_limit=64)
        endpoints.append(endpoint)
    return endpoints


def summary(row: AutoscalerDecision) -> tuple:
    return row.current, row.desired, row.reason, row.applied, row.inputs


def test_a_batch_decides_as_each_endpoint_alone_does(clean_store, server):
    # Twins: the same settings, one set ticked as a batch, the other one endpoint at a time. Tight SLOs (overloaded
    # every cycle), loose ones (healthy), and between.
    slos = [{"ttft_slo_ms": 500, "tpot_slo_ms": 5}, {"ttft_slo_ms": 3000}, {"ttft_slo_ms": 20000}]
    batched = [fleet(1, server.url, **slo)[0] for slo in slos]
    alone = [fleet(1, server.url, **slo)[0] for slo in slos]
    server.ttft, server.tpot = [0, 500, 0, 0, 0, 0], [100, 0, 0, 0, 0]
    for cycle in range(5):
        # Each cycle 100 first tokens in (0.5, 1] s and 20 in (1, 2.5] s, and 1,000 fast tokens
        server.ttft = [server.ttft[0], server.ttft[1], server.ttft[2] + 100, server.ttft[3] + 20, 0, 0]
        server.tpot = [server.tpot[0] + 1000, 0, 0, 0, 0]
        tick = f"v-twin-{cycle}"
        rows = vertical_ticks.vertical_ticks(endpoint_ids=[e.pk for e in batched], tick=tick)
        for mine, twin in zip(batched, alone, strict=True):
            single = vertical_ticks.vertical_tick(endpoint_id=twin.pk, tick=tick)
            assert summary(rows[mine.pk]) == summary(single)
    verdicts = [AutoscalerDecision.objects.get(endpoint=e, tick="v-twin-4").inputs["verdict"] for e in batched]
    # The raised limit of 72 is then run at two thirds: healthy, but no evidence for more
    assert verdicts == ["overload", "neutral", "neutral"]
    limits = [e.concurrency_limit for e in Endpoint.objects.filter(pk__in=[e.pk for e in batched]).order_by("pk")]
    assert limits == [45, 64, 72]  # cut after three overloaded cycles; raised after three healthy ones


def test_one_endpoints_failure_leaves_the_batchs_others_decided(clean_store, server):
    endpoints = fleet(3, server.url)
    server.ttft, server.tpot = [10, 0, 0, 0, 0, 0], [10, 0, 0, 0, 0]
    # An SLO of zero (a SQL update skips the model's validators): its decision divides by it and fails
    Endpoint.objects.filter(pk=endpoints[1].pk).update(ttft_slo_ms=0)
    rows = vertical_ticks.vertical_ticks(endpoint_ids=[e.pk for e in endpoints], tick="v-fail")
    assert rows[endpoints[0].pk] is not None and rows[endpoints[2].pk] is not None
    assert endpoints[1].pk not in rows
    assert set(AutoscalerDecision.objects.filter(tick="v-fail").values_list("endpoint_id", flat=True)) == {
        endpoints[0].pk,
        endpoints[2].pk,
    }


def test_a_decision_another_worker_stored_meanwhile_leaves_the_batchs_others_stored(clean_store, server, monkeypatch):
    endpoints = fleet(3, server.url)
    server.ttft, server.tpot = [10, 0, 0, 0, 0, 0], [10, 0, 0, 0, 0]
    read_streaks = vertical_ticks._streaks

    def racing(ids):  # another worker stores the second endpoint's decision after this one read what was decided
        AutoscalerDecision.objects.create(
            endpoint=endpoints[1], axis="vertical", tick="v-race", current=64, desired=64, reason="theirs"
        )
        return read_streaks(ids)

    monkeypatch.setattr(vertical_ticks, "_streaks", racing)
    rows = vertical_ticks.vertical_ticks(endpoint_ids=[e.pk for e in endpoints], tick="v-race")
    assert rows[endpoints[1].pk] is None
    stored = {row.endpoint_id: row for row in AutoscalerDecision.objects.filter(tick="v-race")}
    assert stored[endpoints[1].pk].reason == "theirs"
    for endpoint in (endpoints[0], endpoints[2]):
        # The returned rows are the stored ones, ids and all
        assert (
            summary(rows[endpoint.pk]) == summary(stored[endpoint.pk])
            and rows[endpoint.pk].pk == stored[endpoint.pk].pk
        )


def test_the_returned_decisions_carry_their_stored_ids(clean_store, server):
    endpoints = fleet(4, server.url)
    server.ttft, server.tpot = [10, 0, 0, 0, 0, 0], [10, 0, 0, 0, 0]
    rows = vertical_ticks.vertical_ticks(endpoint_ids=[e.pk for e in endpoints], tick="v-ids")
    for endpoint in endpoints:
        stored = AutoscalerDecision.objects.get(pk=rows[endpoint.pk].pk)
        assert stored.endpoint_id == endpoint.pk and summary(stored) == summary(rows[endpoint.pk])
        assert stored.at == rows[endpoint.pk].at


def tick_queries(ids: list[int], tick: str) -> int:
    with CaptureQueriesContext(connection) as queries:
        decided = vertical_ticks.vertical_ticks(endpoint_ids=ids, tick=tick)
    assert sorted(k for k, v in decided.items() if v is not None) == sorted(ids)
    return len(queries)


def test_a_batch_costs_the_same_queries_whatever_its_size(clean_store, server):
    small, large = fleet(2, server.url), fleet(8, server.url, replicas=3)
    server.ttft, server.tpot = [10, 0, 0, 0, 0, 0], [10, 0, 0, 0, 0]
    small_ids, large_ids = [e.pk for e in small], [e.pk for e in large]
    # The first tick reads the streaks from the last decisions (none in Redis yet); the next ones from Redis.
    assert tick_queries(small_ids, "v-q1") == tick_queries(large_ids, "v-q1")
    steady = tick_queries(small_ids, "v-q2")
    # Already decided, the endpoints, their ready replicas; the ids drawn for the rows (copied in, in a savepoint)
    assert steady == tick_queries(large_ids, "v-q2") and steady <= 6
    assert AutoscalerDecision.objects.filter(tick="v-q2", applied=True).count() == 10


def test_a_replica_that_does_not_answer_is_skipped(clean_store, server):
    endpoint = fleet(1, server.url)[0]
    # One replica refuses connections (nothing listens), one accepts and never answers (past the 1-s timeout)
    closed, silent = socket.socket(), socket.socket()
    closed.bind(("127.0.0.1", 0))
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        for sock in (closed, silent):
            ReplicaFactory(
                endpoint=endpoint, state=ReplicaState.READY, url=f"http://127.0.0.1:{sock.getsockname()[1]}"
            )
        server.ttft, server.tpot, server.running = [10, 0, 0, 0, 0, 0], [10, 0, 0, 0, 0], 32
        started = time.monotonic()
        # Every replica read (0: the sample would otherwise hold three of the four)
        row = vertical_ticks.vertical_ticks(endpoint_ids=[endpoint.pk], tick="v-skip", sample=0)[endpoint.pk]
        assert time.monotonic() - started < 5
    finally:
        closed.close()
        silent.close()
    # The two that answered: 32 running each of a limit of 64
    assert row is not None and row.inputs["busy_fraction"] == 0.5 and row.inputs["ttft_p95_ms"] is not None


def test_the_streaks_live_in_redis_and_fall_back_to_the_last_decision(clean_store, server):
    endpoint = fleet(1, server.url, tpot_slo_ms=10)[0]  # every token slower than the SLO: overloaded
    for cycle in range(2):
        server.tpot = [0, 100 * (cycle + 1), 0, 0, 0]
        vertical_ticks.vertical_tick(endpoint_id=endpoint.pk, tick=f"v-s{cycle}")
    raw = clean_store.get(vertical_ticks.STREAK_KEY.format(endpoint_id=endpoint.pk))
    assert json.loads(raw) == {"overload_streak": 2, "healthy_streak": 0}
    clean_store.delete(vertical_ticks.STREAK_KEY.format(endpoint_id=endpoint.pk))  # Redis emptied
    server.tpot = [0, 300, 0, 0, 0]
    third = vertical_ticks.vertical_tick(endpoint_id=endpoint.pk, tick="v-s2")
    assert third.desired == 45 and third.reason.startswith("decrease")  # the third overloaded cycle, still counted


def test_streaks_that_cannot_be_saved_leave_the_decision_applied(clean_store, server, monkeypatch):
    endpoint = fleet(1, server.url, tpot_slo_ms=10)[0]  # overloaded every cycle: the third cuts the limit
    for cycle in range(3):
        server.tpot = [0, 100 * (cycle + 1), 0, 0, 0]
        if cycle == 2:

            def redis_gone(states):
                raise store.RedisError("connection refused")

            monkeypatch.setattr(vertical_ticks, "_save_streaks", redis_gone)
        row = vertical_ticks.vertical_tick(endpoint_id=endpoint.pk, tick=f"v-r{cycle}")
    assert row.desired == 45 and row.reason.startswith("decrease")
    row.refresh_from_db()
    endpoint.refresh_from_db()
    assert row.applied and endpoint.concurrency_limit == 45


def test_the_embedded_default_ticks_on_the_in_memory_store(clean_store, server, settings):
    settings.REDIS_URL = ""
    store.reset_client()
    try:
        endpoints = fleet(2, server.url)
        server.ttft, server.tpot = [10, 0, 0, 0, 0, 0], [10, 0, 0, 0, 0]
        rows = vertical_ticks.vertical_ticks(endpoint_ids=[e.pk for e in endpoints], tick="v-memory")
        assert all(rows[e.pk] is not None for e in endpoints)
        assert isinstance(store.client(), store._MemoryStore)
        assert store.client().get(vertical_ticks.STREAK_KEY.format(endpoint_id=endpoints[0].pk)) is not None
    finally:
        store.reset_client()


def test_the_beat_fans_the_vertical_tick_out_in_batches(clean_store, server, settings):
    settings.INFERCAP = {**settings.INFERCAP, "AUTOSCALE_VERTICAL_BATCH": 2}
    endpoints = fleet(5, server.url)
    sent = []
    real = tasks.vertical_batch.apply_async
    with mock.patch.object(
        tasks.vertical_batch, "apply_async", lambda args, **kw: sent.append(args[0]) or real(args, **kw)
    ):
        assert tasks.vertical_all() >= 5  # eager in the tests: the batch tasks ran
    mine = [[i for i in batch if i in {e.pk for e in endpoints}] for batch in sent]
    assert sorted(len(batch) for batch in sent) == [1, 2, 2] and sorted(sum(mine, [])) == [e.pk for e in endpoints]
    assert AutoscalerDecision.objects.filter(endpoint__in=endpoints, axis="vertical").count() == 5


def test_the_parser_reads_its_series_from_any_subset_of_the_exposition():
    registry = CollectorRegistry()
    labels = {"engine": "0", "model_name": "m"}
    Gauge("vllm:num_requests_waiting", "", list(labels), registry=registry).labels(**labels).set(3)
    by_reason = Gauge("vllm:num_requests_waiting_by_reason", "", [*labels, "reason"], registry=registry)
    by_reason.labels(**labels, reason="capacity").set(7)  # not the queue: a name that only starts like it
    Gauge("vllm:kv_cache_usage_perc", "", list(labels), registry=registry).labels(**labels).set(0.5)
    ttft = Histogram("vllm:time_to_first_token_seconds", "", list(labels), buckets=(0.1, 1), registry=registry)
    for seconds in (0.05, 0.5, 5):
        ttft.labels(**labels).observe(seconds)
    whole = replica_metrics.parse(generate_latest(registry).decode())
    restricted = replica_metrics.parse(generate_latest(registry.restricted_registry(replica_metrics.SERIES)).decode())
    assert whole == restricted
    assert whole.waiting == 3 and whole.kv_usage == 0.5
    assert whole.buckets(replica_metrics.TTFT) == {0.1: 1.0, 1.0: 2.0, float("inf"): 3.0}
    # The first line of a body counts too
    assert replica_metrics.parse('vllm:num_requests_running{engine="0"} 2\n').running == 2


class CannedServer:
    """Answers every connection with the same raw bytes, then closes it (an HTTP/1.0 exchange)."""

    def __init__(self, raw: bytes):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.requests: list[bytes] = []
        threading.Thread(target=self._serve, args=(raw,), daemon=True).start()

    def _serve(self, raw: bytes) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                self.requests.append(conn.recv(65536))
                conn.sendall(raw)


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", "hello"),
        (b"HTTP/1.0 200 OK\r\n\r\nto the end", "to the end"),  # no length: the body runs to the close
        (b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\ncut short", None),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", None),
        (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n\r\n\x1f\x8b", None),
        (b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nnot found", None),
        (b"garbage", None),
    ],
)
def test_a_scrape_reads_a_whole_200_or_nothing(raw, text):
    server = CannedServer(raw)
    try:
        assert replica_scrapes.fetch_many([server.url]) == [text]
        request = server.requests[0].decode()
        # HTTP/1.0 and unencoded
        assert request.startswith("GET /metrics HTTP/1.0\r\n")
        assert "Accept-Encoding: identity" in request
    finally:
        server.sock.close()


class SilentServer:
    """Accepts connections and never answers (a replica that hangs)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"


def test_a_batch_past_its_deadline_keeps_the_scrapes_that_answered(monkeypatch):
    answers, hangs = CannedServer(b"HTTP/1.0 200 OK\r\n\r\nup"), SilentServer()
    monkeypatch.setattr(replica_scrapes, "BATCH_DEADLINE_S", 0.5)
    try:
        started = time.monotonic()
        assert replica_scrapes.fetch_many([answers.url, hangs.url, answers.url], timeout_s=10) == ["up", None, "up"]
        assert time.monotonic() - started < 5
    finally:
        answers.sock.close()
        hangs.sock.close()


def test_a_scrape_larger_than_the_limit_is_no_answer(monkeypatch):
    monkeypatch.setattr(replica_scrapes, "MAX_BYTES", 1000)
    big = CannedServer(b"HTTP/1.0 200 OK\r\n\r\n" + b"x" * 5000)
    try:
        assert replica_scrapes.fetch_many([big.url]) == [None]
        assert client_get(big.url) is None  # the client path for https replicas reads no more either
    finally:
        big.sock.close()


def test_the_client_path_follows_no_redirect():
    moved = CannedServer(b"HTTP/1.0 302 Found\r\nLocation: http://169.254.169.254/\r\nContent-Length: 0\r\n\r\n")
    fine = CannedServer(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok")
    try:
        assert client_get(moved.url) is None and len(moved.requests) == 1
        assert client_get(fine.url) == b"ok"
    finally:
        moved.sock.close()
        fine.sock.close()


def client_get(url: str) -> bytes | None:
    """``_get_client`` (the path for https replicas), run on the scrapes' own loop against a plain server."""
    state = replica_scrapes._current()
    future = asyncio.run_coroutine_threadsafe(replica_scrapes._get_client(state, url, 2.0), state.loop)
    return future.result(timeout=5)
