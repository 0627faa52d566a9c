"""The whole request path in process: ``pipeline.completion`` over an in-memory snapshot and scripted replica
responses (no sockets, no database). What the client gets, what the replica is sent and what is metered, for an
answered request, refusals before and after the endpoint is known, a retry on another replica, a replica that
never answers and a client that leaves."""

import asyncio
import json
import logging
import re

from config.request_log import RequestIdFilter
from gateway.proxy import pipeline
from gateway.proxy.budgets import Budgets
from gateway.proxy.config import ProxyConfig
from gateway.proxy.isolation import CacheSalts
from gateway.proxy.limits import RateLimiter
from gateway.proxy.runtime import EndpointRuntime
from tests.proxy.snapshots import TENANT_A, bearer, endpoint, reservation, snapshot
from tests.proxy.test_relay import DONE, TOKEN, USAGE, Content, Response


class Stalled(Content):
    """Sends its chunks, then nothing, never ending."""

    async def readany(self):
        if self.chunks:
            return self.chunks.pop(0)
        await asyncio.Event().wait()


class Session:
    """Answers by replica URL, one scripted response per attempt."""

    def __init__(self, by_url):
        self.by_url, self.posted = by_url, []

    async def post(self, url, *, data, headers, timeout):
        url = str(url)  # the proxy hands aiohttp a parsed yarl.URL
        self.posted.append((url, json.loads(data), headers))
        return self.by_url[url.split("/v1/")[0]]()


class Usage:
    def __init__(self):
        self.records = []

    def submit(self, record):
        self.records.append(record)


class State:
    """What the stages use of ``ProxyState``."""

    def __init__(self, snap, session, **config):
        self.config = ProxyConfig(**config)
        self.snapshot, self.session = snap, session
        self.limiter = RateLimiter(None)
        self.budgets = Budgets(None, usd_per_mu=0.00005, spawn=self.spawn)
        self.cache_salts = CacheSalts("test-secret")
        self.redis = None
        self.usage = Usage()
        self.runtimes = {}
        self.background = set()

    def runtime_for(self, info):
        if info.id not in self.runtimes:
            self.runtimes[info.id] = EndpointRuntime(info, config=self.config)
        return self.runtimes[info.id]

    def spawn(self, coro):
        task = asyncio.get_running_loop().create_task(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)


class Client:
    """One ASGI request: its body, then a disconnect when ``leave`` is called."""

    def __init__(self, body: dict):
        self.body = json.dumps(body).encode()
        self.sent, self.left, self._read = [], asyncio.Event(), False

    async def receive(self):
        if not self._read:
            self._read = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self.left.wait()
        return {"type": "http.disconnect"}

    async def send(self, message):
        self.sent.append(message)

    @property
    def status(self) -> int:
        return self.sent[0]["status"]

    def body_bytes(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")

    def error(self) -> dict:
        return json.loads(self.body_bytes())["error"]


def ok_stream():
    return Response(chunks=[TOKEN, USAGE + DONE])


EP = endpoint(replicas=2, limit=2)
WORLD = snapshot(endpoints=[EP], reservations={(TENANT_A, EP.id): reservation(priority="standard")})


async def run(state, client, headers=None, monkeypatch=None):
    async def get_state():
        return state

    monkeypatch.setattr(pipeline, "get_state", get_state)
    scope = {"type": "http", "headers": list((headers if headers is not None else bearer()).items())}
    await pipeline.completion(scope, client.receive, client.send, "chat")


def chat(**fields):
    return {"model": EP.name, "messages": [{"role": "user", "content": "hello"}], "stream": True, **fields}


async def test_an_answered_request_reaches_one_replica_with_the_tenants_salt_and_is_metered_once(monkeypatch):
    session = Session({"http://replica-0": ok_stream, "http://replica-1": ok_stream})
    state, client = State(WORLD, session), Client(chat(priority=-5, cache_salt="someone-elses"))
    await run(state, client, monkeypatch=monkeypatch)
    assert client.status == 200 and client.body_bytes() == TOKEN + DONE
    [(url, sent, headers)] = session.posted
    assert url.endswith("/v1/chat/completions")
    assert sent["cache_salt"] == state.cache_salts.for_tenant(TENANT_A) and sent["priority"] == 1  # standard
    rid = dict(client.sent[0]["headers"])[b"x-request-id"].decode()
    assert headers["x-request-id"] == rid
    # How long it queued and how long the proxy took until the replica had it (Server-Timing, milliseconds).
    [timing] = [v.decode() for k, v in client.sent[0]["headers"] if k == b"server-timing"]
    queued, own = re.fullmatch(r"queue;dur=(\d+\.\d{3}), proxy;dur=(\d+\.\d{3})", timing).groups()
    assert float(queued) == 0.0 and 0.0 < float(own) < 1000.0
    [record] = state.usage.records
    assert (record["request_id"], record["status"], record["priority"]) == (rid, "ok", "standard")
    assert (record["input_tokens"], record["output_tokens"], record["queue_ms"]) == (3, 2, 0.0)
    assert record["replica_id"] in (100, 101) and record["ttft_ms"] > 0
    assert state.runtimes[EP.id].in_flight == 0


async def test_refusals_are_openai_errors_metered_only_once_the_endpoint_is_known(monkeypatch):
    other = endpoint(id=9, name="other")  # no reservation: best effort, under a cap of one request's worth
    world = snapshot(endpoints=[EP, other], reservations={(TENANT_A, EP.id): reservation()})
    session = Session({"http://replica-0": ok_stream, "http://replica-1": ok_stream})
    state = State(world, session, best_effort_mu_per_min=0.001)
    bad_key = Client(chat())
    await run(state, bad_key, headers=bearer("ic-wrong"), monkeypatch=monkeypatch)
    assert bad_key.status == 401 and bad_key.error()["code"] == "invalid_api_key"
    unknown_model = Client(chat(model="nope"))
    await run(state, unknown_model, monkeypatch=monkeypatch)
    assert unknown_model.status == 404 and state.usage.records == []
    for expected in (200, 429):  # a full bucket admits one request however large; then it is in debt
        limited = Client(chat(model="other"))
        await run(state, limited, monkeypatch=monkeypatch)
        assert limited.status == expected
    assert (
        limited.error()["code"] == "rate_limit_exceeded" and int(dict(limited.sent[0]["headers"])[b"retry-after"]) >= 1
    )
    assert [(r["endpoint_id"], r["status"], r["priority"]) for r in state.usage.records] == [
        (9, "ok", "sheddable"),
        (9, "rate_limited", "sheddable"),
    ]


async def test_a_replica_failing_before_the_first_byte_is_retried_once_on_another(monkeypatch):
    session = Session(
        {"http://replica-0": lambda: Response(status=503), "http://replica-1": lambda: Response(status=503)}
    )
    state, client = State(WORLD, session), Client(chat())
    await run(state, client, monkeypatch=monkeypatch)
    assert client.status == 502 and client.error()["code"] == "upstream_error"  # a bad gateway, whatever the 5xx
    assert sorted(url.split("/v1/")[0] for url, _, _ in session.posted) == ["http://replica-0", "http://replica-1"]
    [record] = state.usage.records
    assert (record["status"], record["replica_id"]) == ("upstream_error", None)
    session.by_url["http://replica-1"] = ok_stream
    session.by_url["http://replica-0"] = lambda: Response(status=503)
    # replica-0 first (a router picks among the replicas it is shown: the retry excludes replica-0)
    state.runtime_for(EP).router.pick = lambda route, views, now: min(v.replica_id for v in views)
    session.posted.clear()
    retried = Client(chat())
    await run(state, retried, monkeypatch=monkeypatch)
    assert retried.status == 200 and retried.body_bytes() == TOKEN + DONE
    assert [url.split("/v1/")[0] for url, _, _ in session.posted] == ["http://replica-0", "http://replica-1"]
    assert state.usage.records[-1]["replica_id"] == 101
    assert state.runtimes[EP.id].in_flight == 0


def silent_after(*chunks):
    """A replica that accepted the request, sends ``chunks`` and then nothing more."""

    def respond():
        answer = Response()
        answer.content = Stalled(chunks)
        return answer

    return respond


async def test_a_replica_that_never_answers_gets_a_504_and_is_metered_as_a_timeout(monkeypatch):
    session = Session({"http://replica-0": silent_after(), "http://replica-1": silent_after()})
    state, client = State(WORLD, session, ttft_timeout_s=0.2, idle_timeout_s=1.0), Client(chat())
    await asyncio.wait_for(run(state, client, monkeypatch=monkeypatch), 10)
    assert client.status == 504 and client.error()["code"] == "ttft"
    [record] = state.usage.records
    assert record["status"] == "timeout" and record["ttft_ms"] is None
    assert state.runtimes[EP.id].in_flight == 0


async def test_a_client_that_leaves_mid_stream_frees_its_slot_and_is_metered_as_cancelled(monkeypatch):
    session = Session({"http://replica-0": silent_after(TOKEN), "http://replica-1": silent_after(TOKEN)})
    state, client = State(WORLD, session), Client(chat())
    request = asyncio.ensure_future(run(state, client, monkeypatch=monkeypatch))
    await asyncio.wait_for(wait_until(lambda: client.body_bytes() == TOKEN), 10)
    client.left.set()
    await asyncio.wait_for(request, 10)
    assert client.status == 200 and client.body_bytes() == TOKEN
    [record] = state.usage.records
    assert record["status"] == "client_cancelled" and record["output_tokens"] == 1
    assert state.runtimes[EP.id].in_flight == 0


async def wait_until(condition) -> None:
    while not condition():
        await asyncio.sleep(0.005)


async def test_the_router_hears_a_streams_first_token_from_the_replica_that_sent_it(monkeypatch):
    # replica-0 fails before its first byte (the retry goes to replica-1): only replica-1's first token is heard,
    # before the request's end there. The router's pending prefill (routing/prefill.py) depends on it.
    session = Session({"http://replica-0": lambda: Response(status=503), "http://replica-1": ok_stream})
    state, client = State(WORLD, session), Client(chat())
    runtime = state.runtime_for(EP)
    router = runtime.router
    router.pick = lambda route, views, now: min(v.replica_id for v in views)
    heard = []
    first_token, finished = router.on_first_token, router.on_finished
    router.on_first_token = lambda route, rid, now: (heard.append(("first", rid)), first_token(route, rid, now))
    router.on_finished = lambda route, rid, now: (heard.append(("finished", rid)), finished(route, rid, now))
    await run(state, client, monkeypatch=monkeypatch)
    assert client.status == 200
    r0, r1 = (next(rid for rid, s in runtime.slots.items() if s.url == f"http://replica-{i}") for i in (0, 1))
    assert [e for e in heard if e[1] == r1] == [("first", r1), ("finished", r1)]
    assert ("first", r0) not in heard


async def test_the_proxys_log_lines_carry_the_request_id_the_client_got(monkeypatch):
    # A replica on the fcfs scheduler refuses 'priority' (logged as a warning), then serves the request resent.
    answers = iter([Response(status=400, body=b'{"error": {"message": "priority is not supported"}}'), ok_stream()])
    session = Session({"http://replica-0": lambda: next(answers), "http://replica-1": lambda: next(answers)})
    state, client = State(WORLD, session), Client(chat())
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    handler.addFilter(RequestIdFilter())  # as the logging settings install it on every handler
    logger = logging.getLogger("gateway.proxy")
    logger.addHandler(handler)
    try:
        await run(state, client, monkeypatch=monkeypatch)
    finally:
        logger.removeHandler(handler)
    assert client.status == 200
    refused = [r for r in records if "refuses 'priority'" in r.getMessage()]
    rid = dict(client.sent[0]["headers"])[b"x-request-id"].decode()
    assert refused and {r.request_id for r in refused} == {rid}


async def test_a_finished_request_leaves_no_watchdog_timer_holding_it(monkeypatch):
    """The watchdog re-arms while a request runs; once it ends (answered, or after a retry on another replica) its
    timer is cancelled, so the request and everything it refers to are freed now, not when the timer comes due."""
    loop = asyncio.get_running_loop()
    armed, call_later = [], loop.call_later

    def recording(delay, callback, *args, **kwargs):
        handle = call_later(delay, callback, *args, **kwargs)
        if callback is pipeline.watchdog:
            armed.append(handle)
        return handle

    monkeypatch.setattr(loop, "call_later", recording)
    session = Session({"http://replica-0": lambda: Response(status=503), "http://replica-1": ok_stream})
    state = State(WORLD, session)
    state.runtime_for(EP).router.pick = lambda route, views, now: min(v.replica_id for v in views)
    for _ in range(2):  # each request's attempt on replica-0 fails and is retried on replica-1
        client = Client(chat())
        await run(state, client, monkeypatch=monkeypatch)
        assert client.status == 200
    assert len(armed) >= 2 and all(handle.cancelled() for handle in armed)
