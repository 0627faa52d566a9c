"""Smoke: one replica, one proxy worker, the openai client streaming through it."""
import httpx
import openai
import pytest

from tests.proxy.conftest import spawn_proxy, spawn_replica

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_stub_stream_through_proxy(procs, clean_redis, tenant_a):
    spawn_replica(procs, endpoint=tenant_a.endpoint, name="r1", sim=False)
    base = spawn_proxy(procs)
    client = openai.OpenAI(base_url=base + "/v1", api_key=tenant_a.raw_key, max_retries=0)
    stream = client.chat.completions.create(
        model=tenant_a.endpoint.name, messages=[{"role": "user", "content": "hi"}], max_tokens=5, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "t0 t1 t2 t3 t4 "
    r = httpx.get(base + "/metrics")
    assert "infercap_proxy_requests_total" in r.text
