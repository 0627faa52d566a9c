"""The real proxy (uvicorn running ``config.asgi``) in front of the real vLLM engine, attached to an endpoint whose
name is not the model name the engine serves: the proxy sends the engine its own name and the client reads the
endpoint's; streamed and plain chat and completions are metered with the engine's own token counts, cached tokens
included; a client that leaves mid-stream aborts the request inside the engine; the engine's 4xx answers reach the
client OpenAI-shaped with their status; one tenant's cached prefix is invisible to another (cache_salt).

Two engines (priority classes as vLLM's ``priority``, prefix affinity): test_proxy_two_engines.py."""

from __future__ import annotations

import re
import uuid
from types import SimpleNamespace

import httpx
import pytest

from billing.models import UsageRecord
from endpoints.services import replica_attach
from tests.factories import EndpointFactory, ReservationFactory
from tests.proxy.conftest import spawn_proxy
from tests.proxy.helpers import assert_openai_error, chat_body, sse_events, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ENDPOINT = "team-chat"  # not what the engine serves (tests/engine/conftest.py: tiny-llama)
BLOCK_TOKENS = 128  # the CPU backend's KV block: vLLM caches whole blocks only
_WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex bold jackdaws".split()


def document(seed: str, words: int = 160) -> str:
    """A prompt of a few hundred tokens (several KV blocks) that no earlier request shares: ``seed`` comes first."""
    return seed + " " + " ".join(_WORDS[(i * 7 + len(seed)) % len(_WORDS)] for i in range(words))


def engine_metrics(url: str) -> dict[str, float]:
    """The engine's own counters and gauges, summed over labels, by name (plus ``vllm:request_success_total``
    per ``finished_reason``, as ``…{reason}``)."""
    values: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{", 1)[0]
        if name == "vllm:request_success_total":
            reason = re.search(r'finished_reason="([^"]+)"', name_labels)
            name = f"{name}{{{reason.group(1) if reason else ''}}}"
        values[name] = values.get(name, 0.0) + float(value)
    return values


def delta(after: dict[str, float], before: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def metrics_once(url: str, condition, timeout: float = 20.0) -> dict[str, float]:
    """The engine's metrics as soon as ``condition`` holds for them (they follow each engine step)."""

    last: dict[str, float] = {}

    def met() -> dict[str, float] | None:
        last.update(engine_metrics(url))
        return dict(last) if condition(last) else None

    try:
        return wait_for(met, timeout, interval=0.1)
    except AssertionError:
        counts = {k: v for k, v in last.items() if k.startswith(("vllm:num_requests", "vllm:request_success"))}
        raise AssertionError(f"the engine's metrics did not get there within {timeout} s: {counts}") from None


@pytest.fixture
def served(engine, procs, clean_redis, tenant_a, tenant_b):
    """The session engine attached to a shared endpoint named otherwise, a proxy in front, and both tenants with
    reservations large enough never to be limited. The model profile allows more context than the engine, so the
    engine, not the proxy, refuses what is over its own."""
    endpoint = EndpointFactory(
        name=ENDPOINT,
        ttft_slo_ms=60_000,
        tpot_slo_ms=5_000,
        concurrency_max=8,
        concurrency_limit=8,
        model_profile__name="tiny-llama-8k",
        model_profile__max_model_len=8192,
    )
    for actors in (tenant_a, tenant_b):
        ReservationFactory(tenant=actors.tenant, endpoint=endpoint, mu_per_min=1e9)
    replica = replica_attach(endpoint=endpoint, url=engine.url, name="session-engine", served_model_name=engine.model)
    assert replica.served_model_name == engine.model != ENDPOINT
    return SimpleNamespace(
        endpoint=endpoint, replica=replica, base=spawn_proxy(procs), a=tenant_a.raw_key, b=tenant_b.raw_key
    )


def call(base: str, key: str, body: dict, *, path: str = "/v1/chat/completions", headers=None) -> httpx.Response:
    auth = {"Authorization": f"Bearer {key}", **(headers or {})}
    return httpx.post(base + path, json=body, headers=auth, timeout=180)


def completion_body(prompt: str, *, max_tokens: int = 4, stream: bool = False, **extra) -> dict:
    return {
        "model": ENDPOINT,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": stream,
        **extra,
    }


def answer(response: httpx.Response) -> dict:
    """The usage the client read and every ``model`` it saw, from a plain or a streamed answer."""
    assert response.status_code == 200, response.text
    if not response.headers["content-type"].startswith("text/event-stream"):
        body = response.json()
        return {"usage": body["usage"], "models": {body["model"]}, "events": 1}
    events = sse_events(response.text)
    assert events[-1] == "[DONE]", events[-3:]
    chunks = [e for e in events if isinstance(e, dict)]
    usage = [c["usage"] for c in chunks if c.get("usage")]
    return {"usage": usage[-1] if usage else None, "models": {c["model"] for c in chunks}, "events": len(chunks)}


def cached(usage: dict) -> int:
    return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


def usage_rows(responses: dict[str, httpx.Response]) -> dict[str, UsageRecord]:
    """The proxy's usage record of each response, by the response's label (records are written off the path)."""
    ids = {label: r.headers["x-request-id"] for label, r in responses.items()}
    wait_for(lambda: UsageRecord.objects.filter(request_id__in=ids.values()).count() == len(ids), 20)
    rows = {row.request_id: row for row in UsageRecord.objects.filter(request_id__in=ids.values())}
    return {label: rows[request_id] for label, request_id in ids.items()}


def test_chat_and_completions_are_served_under_the_endpoints_name_and_metered_with_the_engines_usage(engine, served):
    nonce = uuid.uuid4().hex
    system = document(f"chat {nonce}")
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Summarise."}]
    prompt = document(f"completion {nonce}")
    usage_on = {"include_usage": True}
    before = engine_metrics(engine.url)
    responses = {
        "chat stream": call(
            served.base, served.a, chat_body(ENDPOINT, max_tokens=4, messages=messages, stream_options=usage_on)
        ),
        # The same prompt again, streamed without asking for usage: the proxy asks for it, and keeps it to itself.
        "chat stream again": call(served.base, served.a, chat_body(ENDPOINT, max_tokens=5, messages=messages)),
        "chat": call(served.base, served.a, chat_body(ENDPOINT, max_tokens=3, stream=False, messages=messages)),
        "completion": call(served.base, served.a, completion_body(prompt), path="/v1/completions"),
        "completion stream again": call(
            served.base,
            served.a,
            completion_body(prompt, max_tokens=6, stream=True, stream_options=usage_on),
            path="/v1/completions",
        ),
    }
    seen = {label: answer(r) for label, r in responses.items()}
    # The engine was asked for its own model name (else: 404); the client reads the endpoint's, in every chunk.
    assert all(s["models"] == {ENDPOINT} for s in seen.values()), {k: s["models"] for k, s in seen.items()}
    assert seen["chat stream again"]["usage"] is None and seen["chat stream again"]["events"] >= 5
    assert engine.model.encode() not in b"".join(r.content for r in responses.values())

    rows = usage_rows(responses)
    for label, s in seen.items():
        row = rows[label]
        assert row.status == "ok" and row.replica_id == served.replica.pk, (label, row.status)
        if s["usage"] is not None:  # what the client read is what was metered
            usage = s["usage"]
            assert (row.input_tokens, row.output_tokens, row.cached_tokens) == (
                usage["prompt_tokens"],
                usage["completion_tokens"],
                cached(usage),
            ), label
    assert [rows[label].output_tokens for label in responses] == [4, 5, 3, 4, 6]  # ignore_eos: exactly max_tokens
    # A repeated prompt is served from the engine's prefix cache: every whole block but the one holding the last
    # prompt token (vLLM recomputes that token), and the first time nothing.
    for first, again in (
        ("chat stream", "chat stream again"),
        ("chat stream", "chat"),
        ("completion", "completion stream again"),
    ):
        prompt_tokens = rows[again].input_tokens
        assert prompt_tokens == rows[first].input_tokens >= 2 * BLOCK_TOKENS
        assert rows[first].cached_tokens == 0
        assert rows[again].cached_tokens == (prompt_tokens - 1) // BLOCK_TOKENS * BLOCK_TOKENS, again
    # And the rows add up to the engine's own counters over the same requests (the stream whose usage the client
    # never saw included).
    after = metrics_once(engine.url, lambda m: delta(m, before, "vllm:generation_tokens_total") >= 22)
    assert sum(r.input_tokens for r in rows.values()) == delta(after, before, "vllm:prompt_tokens_total")
    assert sum(r.output_tokens for r in rows.values()) == delta(after, before, "vllm:generation_tokens_total") == 22
    assert sum(r.cached_tokens for r in rows.values()) == delta(after, before, "vllm:prompt_tokens_cached_total")


def test_a_client_leaving_mid_stream_aborts_the_request_inside_the_engine(engine, served):
    before = engine_metrics(engine.url)
    assert before.get("vllm:num_requests_running", 0) == 0
    body = chat_body(ENDPOINT, max_tokens=3000, content=f"{uuid.uuid4().hex} talk for a long time")
    headers = {"Authorization": f"Bearer {served.a}"}
    with httpx.Client(timeout=120) as client:
        with client.stream("POST", served.base + "/v1/chat/completions", json=body, headers=headers) as response:
            assert response.status_code == 200
            request_id = response.headers["x-request-id"]
            chunks = response.iter_raw()
            next(chunks)  # the engine is generating
            metrics_once(engine.url, lambda m: m["vllm:num_requests_running"] >= 1, timeout=30)
        # Leaving the block closes the connection mid-stream: 3,000 tokens would take minutes here.
    after = metrics_once(engine.url, lambda m: m["vllm:num_requests_running"] == 0, timeout=30)
    # Not running, and not finished either (vLLM counts no client abort among its finished requests): aborted.
    assert delta(after, before, "vllm:request_success_total{length}") == 0
    assert delta(after, before, "vllm:request_success_total{stop}") == 0
    assert 0 < delta(after, before, "vllm:generation_tokens_total") < 3000
    row = wait_for(lambda: UsageRecord.objects.filter(request_id=request_id).first(), 20)
    assert row.status == "client_cancelled"
    # Metered for what the engine computed, though no usage chunk came: the prompt as the engine's /tokenize counts
    # it (its own prompt counter agrees), and at least the token the client was sent.
    assert row.input_tokens == delta(after, before, "vllm:prompt_tokens_total") > 0
    assert 1 <= row.output_tokens <= delta(after, before, "vllm:generation_tokens_total")
    assert row.mu > 0


def test_the_engines_own_client_errors_reach_the_client_openai_shaped(engine, served):
    too_long_prompt = document("long", words=1500)  # more tokens than the engine's 4,096-token context
    cases = {
        "max_tokens": chat_body(ENDPOINT, max_tokens=5000, stream=False),  # the proxy allows 8,192, the engine not
        "max_tokens streamed": chat_body(ENDPOINT, max_tokens=5000),
        "temperature": chat_body(ENDPOINT, stream=False, temperature="hot"),
        "prompt": completion_body(too_long_prompt, max_tokens=16),
    }
    for label, body in cases.items():
        path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
        proxied = call(served.base, served.a, body, path=path)
        err = assert_openai_error(proxied, 400)
        # Exactly what the engine answers the same request, sent to it directly under its own name.
        direct = httpx.post(engine.url + path, json={**body, "model": engine.model}, timeout=120)
        assert direct.status_code == 400 and proxied.json() == direct.json(), label
        assert err["param"] in {"max_tokens", "body.temperature", "prompt", "input_tokens", None}, err
    # ``priority`` is the proxy's to set: a client's, even of the wrong type, never reaches the engine.
    assert (
        call(served.base, served.a, chat_body(ENDPOINT, stream=False, max_tokens=2, priority="high")).status_code
        == 200
    )
    rows = UsageRecord.objects.filter(endpoint=served.endpoint)
    wait_for(lambda: rows.count() == len(cases) + 1, 20)
    assert sorted(rows.values_list("status", flat=True)) == ["ok"] + ["upstream_error"] * len(cases)


def test_another_tenant_replaying_a_prompt_gets_nothing_from_the_first_tenants_cache(engine, served):
    prompt = document(f"secret {uuid.uuid4().hex}")

    def cached_for(key: str) -> tuple[int, int]:
        usage = call(served.base, key, completion_body(prompt, max_tokens=1), path="/v1/completions").json()["usage"]
        return usage["prompt_tokens"], cached(usage)

    prompt_tokens, first = cached_for(served.a)
    reusable = (prompt_tokens - 1) // BLOCK_TOKENS * BLOCK_TOKENS
    assert first == 0 and reusable >= 2 * BLOCK_TOKENS
    assert cached_for(served.a) == (prompt_tokens, reusable)  # tenant A hits its own blocks
    assert cached_for(served.b) == (prompt_tokens, 0)  # tenant B replaying A's prompt: nothing cached
    assert cached_for(served.b) == (prompt_tokens, reusable)  # then B's own blocks
    # Sent to the engine without any salt, the prompt finds neither tenant's blocks.
    direct = httpx.post(
        engine.url + "/v1/completions",
        json={**completion_body(prompt, max_tokens=1), "model": engine.model},
        timeout=120,
    )
    assert cached(direct.json()["usage"]) == 0
