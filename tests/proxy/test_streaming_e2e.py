"""The official openai client through the proxy against real replicas: text and usage as the replica produced them."""

import httpx
import openai
import pytest

from billing.models import UsageRecord
from tests.proxy.conftest import spawn_proxy, spawn_replica
from tests.proxy.helpers import chat_body, sse_events, wait_usage

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_openai_client_streams_chat_and_completions_like_the_replica(procs, clean_redis, tenant_a):
    _, replica, port = spawn_replica(procs, endpoint=tenant_a.endpoint, name="r1")
    direct = f"http://127.0.0.1:{port}"
    base = spawn_proxy(procs)
    model = tenant_a.endpoint.name
    client = openai.OpenAI(base_url=base + "/v1", api_key=tenant_a.raw_key, max_retries=0)
    messages = [{"role": "user", "content": "Tell me about model units and capacity."}]

    # Chat, streaming, usage requested: text and usage as the replica produced them.
    chunks = list(
        client.chat.completions.create(
            model=model, messages=messages, max_tokens=12, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 12
    want = httpx.post(
        direct + "/v1/chat/completions",
        json=chat_body(model, max_tokens=12, stream=False, messages=messages),
        timeout=30,
    ).json()
    assert text == want["choices"][0]["message"]["content"]
    assert usage.prompt_tokens == want["usage"]["prompt_tokens"]

    # Completions, streaming, no usage asked: the proxy still meters exactly but does not forward the usage chunk.
    raw = httpx.post(
        base + "/v1/completions",
        json={"model": model, "prompt": "The quick brown fox", "max_tokens": 9, "stream": True},
        headers={"Authorization": f"Bearer {tenant_a.raw_key}"},
        timeout=30,
    )
    assert raw.status_code == 200 and raw.headers["x-request-id"].startswith("req-")
    events = sse_events(raw.text)
    assert events[-1] == "[DONE]"
    assert all(e == "[DONE]" or e.get("choices") for e in events), (
        "usage-only chunk leaked to a client that did not ask"
    )
    completion_text = "".join(e["choices"][0]["text"] for e in events if e != "[DONE]")
    want = httpx.post(
        direct + "/v1/completions", json={"model": model, "prompt": "The quick brown fox", "max_tokens": 9}, timeout=30
    ).json()
    assert completion_text == want["choices"][0]["text"]

    # Non-streaming chat through the SDK.
    resp = client.chat.completions.create(model=model, messages=messages, max_tokens=4)
    assert resp.usage.completion_tokens == 4 and resp.choices[0].message.content

    records = wait_usage(3, tenant=tenant_a.tenant)
    assert [r.status for r in records] == ["ok", "ok", "ok"]
    assert len({r.request_id for r in records}) == 3
    assert records[0].output_tokens == 12 and records[0].input_tokens == usage.prompt_tokens
    assert records[0].cached_tokens == (
        (usage.prompt_tokens_details.cached_tokens or 0) if usage.prompt_tokens_details else 0
    )
    assert records[1].output_tokens == 9, "metered from the usage chunk the client never saw"
    assert records[1].request_id == raw.headers["x-request-id"]
    for r in records:
        assert r.replica_id == replica.pk and r.mu > 0 and r.ttft_ms is not None and r.e2e_ms >= r.ttft_ms
        assert r.api_key_id == tenant_a.key.pk and r.endpoint_id == tenant_a.endpoint.pk
    assert records[0].tpot_ms is not None

    # /v1/models lists only what this key may call; another tenant's endpoint is invisible.
    listed = client.models.list()
    assert [m.id for m in listed.data] == [model]
    assert UsageRecord.objects.count() == 3
