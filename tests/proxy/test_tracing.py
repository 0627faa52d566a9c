"""OpenTelemetry traces (config/tracing.py, gateway/proxy/tracing.py), with the SDK's in-memory exporter: a
proxied request's stage spans under one root, the routing decision's attributes, the ``traceparent`` the replica
receives, a client's own trace continued, nothing recorded while tracing is off; Celery task spans and Django
view spans."""

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from config import tracing
from config.celery_app import app
from tests.proxy.snapshots import bearer
from tests.proxy.test_pipeline import EP, WORLD, Client, Session, State, chat, ok_stream, run

STAGES = [
    "proxy.authenticate",
    "proxy.parse",
    "proxy.price",
    "proxy.limits",
    "proxy.admit",
    "proxy.upstream",
    "proxy.meter",
]


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    tracing.configure(exporter, batch=False, service_name="test")
    yield exporter
    tracing.disable()


async def test_a_proxied_request_is_one_trace_of_its_stages_and_the_replica_gets_its_traceparent(spans, monkeypatch):
    session = Session({"http://replica-0": ok_stream, "http://replica-1": ok_stream})
    state, client = State(WORLD, session), Client(chat())
    await run(state, client, monkeypatch=monkeypatch)
    assert client.status == 200
    by_name = {s.name: s for s in spans.get_finished_spans()}
    root = by_name["proxy.request"]
    assert root.parent is None and root.attributes["infercap.status"] == "ok"
    assert root.attributes["infercap.endpoint"] == EP.name
    children = [
        s for s in spans.get_finished_spans() if s.parent is not None and s.parent.span_id == root.context.span_id
    ]
    assert sorted(s.name for s in children) == sorted(STAGES)
    assert {s.context.trace_id for s in spans.get_finished_spans()} == {root.context.trace_id}
    # The stages follow one another inside the root.
    ordered = sorted(children, key=lambda s: s.start_time)
    assert [s.name for s in ordered] == STAGES
    assert all(a.end_time <= b.start_time + 1000 for a, b in zip(ordered, ordered[1:], strict=False))
    assert root.start_time <= ordered[0].start_time and ordered[-1].end_time <= root.end_time
    upstream = by_name["proxy.upstream"]
    under_upstream = {
        s.name for s in spans.get_finished_spans() if s.parent and s.parent.span_id == upstream.context.span_id
    }
    assert under_upstream == {"proxy.upstream.first_token", "proxy.upstream.stream"}
    admit = by_name["proxy.admit"]
    [(url, _, headers)] = session.posted
    replica = "100" if "replica-0" in url else "101"
    assert admit.attributes["infercap.replica.id"] == replica == upstream.attributes["infercap.replica.id"]
    assert list(admit.attributes["infercap.route.candidates"]) == ["100", "101"]
    version, trace_id, parent_id, flags = headers["traceparent"].split("-")
    assert (version, flags) == ("00", "01")
    assert int(trace_id, 16) == root.context.trace_id and int(parent_id, 16) == upstream.context.span_id


async def test_a_clients_traceparent_is_continued_and_a_refusal_is_traced(spans, monkeypatch):
    session = Session({"http://replica-0": ok_stream, "http://replica-1": ok_stream})
    state = State(WORLD, session)
    incoming = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    await run(state, Client(chat()), headers={**bearer(), b"traceparent": incoming.encode()}, monkeypatch=monkeypatch)
    root = next(s for s in spans.get_finished_spans() if s.name == "proxy.request")
    assert f"{root.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    assert f"{root.parent.span_id:016x}" == "b7ad6b7169203331"
    spans.clear()
    refused = Client(chat())
    await run(state, refused, headers=bearer("ic-wrong"), monkeypatch=monkeypatch)
    names = {s.name: s for s in spans.get_finished_spans()}
    assert refused.status == 401 and set(names) == {"proxy.request", "proxy.meter"}  # no stage got through
    assert names["proxy.request"].attributes["infercap.status"] == "refused"


async def test_with_tracing_off_nothing_is_traced_and_no_traceparent_is_sent(monkeypatch):
    tracing.disable()
    session = Session({"http://replica-0": ok_stream, "http://replica-1": ok_stream})
    state, client = State(WORLD, session), Client(chat())
    await run(state, client, monkeypatch=monkeypatch)
    [(_, _, headers)] = session.posted
    assert client.status == 200 and "traceparent" not in headers


def test_the_environment_turns_tracing_on():
    assert not tracing.wanted({}) and not tracing.wanted({"OTEL_TRACES_EXPORTER": "none"})
    assert tracing.wanted({"INFERCAP_TRACING": "1"}) and tracing.wanted({"OTEL_TRACES_EXPORTER": "otlp"})


@app.task(name="tests.tracing.tick")
def tick(fail: bool) -> str:
    if fail:
        raise RuntimeError("boom")
    return "ok"


def test_a_celery_task_run_is_a_span_with_its_state_and_error(spans):
    # apply() runs the task here through Celery's own tracer, which sends the signals config.celery_app hooks.
    assert tick.apply(args=(False,)).get() == "ok"
    assert tick.apply(args=(True,), throw=False).state == "FAILURE"  # as a worker runs it: not re-raised here
    ok, failed = spans.get_finished_spans()
    assert ok.name == failed.name == "celery.task tests.tracing.tick"
    assert (ok.attributes["celery.state"], ok.status.status_code.name) == ("SUCCESS", "UNSET")
    assert (failed.attributes["celery.state"], failed.status.status_code.name) == ("FAILURE", "ERROR")


@pytest.mark.django_db
def test_a_django_view_is_a_span_named_by_its_route(spans, client):
    # (Not /healthz: the kubelet's probes are answered before any middleware that traces, config/cluster_paths.py.)
    response = client.get("/api/v1/me/")
    [span] = [s for s in spans.get_finished_spans() if s.name.startswith("http GET")]
    assert span.attributes["http.response.status_code"] == response.status_code
    assert span.name == "http GET /api/v1/me/"


def test_the_paired_overhead_measurement_runs_both_ways_and_exports_what_it_traced():
    from benchmarks.serving import tracing_overhead  # deferred: imports the benchmark modules only here

    result = tracing_overhead.run(quick=True, pairs=40, progress=lambda *_: None)
    assert result["tracing_pairs"] == 40 and result["tracing_otlp_batches"] >= 1
    assert 0 < result["tracing_off_proxy_ttft_p50_ms"] < 50 and 0 < result["tracing_on_proxy_ttft_p50_ms"] < 50
    assert tracing.TRACER is None  # the measurement leaves tracing as it found it (off)


def test_a_malformed_or_absent_traceparent_starts_a_new_trace():
    from gateway.proxy.tracing import parse_traceparent  # deferred: the module under test, as the others here

    good = parse_traceparent(b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00")
    assert (good.trace_id, good.parent_span_id, good.sampled) == (
        0x0AF7651916CD43DD8448EB211C80319C,
        0xB7AD6B7169203331,
        False,
    )
    for bad in (None, b"", b"garbage", b"ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                b"00-00000000000000000000000000000000-b7ad6b7169203331-01", b"00-0af7651916cd43dd8448eb211c80319c-xyz-01"):  # fmt: skip
        assert parse_traceparent(bad) is None
