"""/v1/embeddings on the real engine (vLLM 0.32, CPU build, the tiny model under ``--runner pooling``): the
simulator answers in the same shapes and with the same refusals, and the proxy in front of the engine meters
what the engine counted."""

from __future__ import annotations

import base64

import httpx
import pytest

from billing.models import UsageRecord
from capacity.hardware.profiles import get_profile
from endpoints.services import replica_attach
from simulator.server import ThreadedReplica
from tests.factories import EndpointFactory, ReservationFactory
from tests.proxy.conftest import spawn_proxy
from tests.proxy.helpers import assert_openai_error, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

REQUESTS = [
    {"input": "hello world"},
    {"input": ["the first text", "and a second one"]},
    {"input": [1, 2, 3, 4]},
    {"input": "hello world", "encoding_format": "base64"},
    {"input": "hello world", "cache_salt": "tenant-salt", "priority": 0},
]
REFUSED = [{"input": ""}, {"input": "hi", "dimensions": 4}]


def _shape(answer: dict) -> dict:
    """What a client relies on: keys, types, vector lengths (decoded for base64), usage keys."""
    vectors = []
    for item in answer["data"]:
        vector = item["embedding"]
        length = len(base64.b64decode(vector)) // 4 if isinstance(vector, str) else len(vector)
        vectors.append((sorted(item), item["index"], item["object"], type(vector).__name__, length))
    return {
        "keys": sorted(answer),
        "object": answer["object"],
        "id": answer["id"].split("-", 1)[0],
        "vectors": vectors,
        "usage": sorted(answer["usage"]),
        "completion_tokens": answer["usage"]["completion_tokens"],
        "details": (answer["usage"]["prompt_tokens_details"], answer["usage"]["completion_tokens_details"]),
    }


def test_the_simulator_answers_embeddings_as_the_engine_does(embed_engine):
    with ThreadedReplica(
        get_profile("tiny"), speed=4.0, runner="pooling", served_model_name=embed_engine.model
    ) as sim:
        for body in REQUESTS:
            real = httpx.post(
                f"{embed_engine.url}/v1/embeddings", json={"model": embed_engine.model, **body}, timeout=60
            )
            ours = httpx.post(f"{sim.url}/v1/embeddings", json={"model": embed_engine.model, **body}, timeout=60)
            assert real.status_code == ours.status_code == 200, (body, real.text, ours.text)
            assert _shape(ours.json()) == _shape(real.json()), body
        for body in REFUSED:
            real = httpx.post(
                f"{embed_engine.url}/v1/embeddings", json={"model": embed_engine.model, **body}, timeout=60
            )
            ours = httpx.post(f"{sim.url}/v1/embeddings", json={"model": embed_engine.model, **body}, timeout=60)
            assert real.status_code == ours.status_code == 400, body
            assert ours.json()["error"]["message"] == real.json()["error"]["message"], body
        named = {"model": embed_engine.model, "input": "x"}
        ids = [
            httpx.post(f"{u}/v1/embeddings", json=named, headers={"X-Request-Id": "r-7"}).json()["id"]
            for u in (embed_engine.url, sim.url)
        ]
        assert ids == ["embd-r-7", "embd-r-7"]
        for url in (embed_engine.url, sim.url):  # a pooling model serves no completions
            gone = httpx.post(f"{url}/v1/chat/completions", json={"model": embed_engine.model, "messages": []})
            assert gone.status_code == 404 and gone.json() == {"detail": "Not Found"}


def _prompt_tokens(url: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("vllm:prompt_tokens_total"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_the_proxy_meters_what_the_engine_counted(embed_engine, procs, clean_redis, tenant_a):
    endpoint = EndpointFactory(name="team-embed", owner_tenant=tenant_a.tenant, ttft_slo_ms=60_000)
    ReservationFactory(tenant=tenant_a.tenant, endpoint=endpoint, mu_per_min=1e9)
    replica_attach(endpoint=endpoint, url=embed_engine.url, name="embed-engine", served_model_name=embed_engine.model)
    base = spawn_proxy(procs)
    before = _prompt_tokens(embed_engine.url)
    auth = {"Authorization": f"Bearer {tenant_a.raw_key}"}
    answers = []
    for body in ({"input": ["one text", "two texts", "three"]}, {"input": "a longer text " * 20}):
        r = httpx.post(f"{base}/v1/embeddings", json={"model": "team-embed", **body}, headers=auth, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["model"] == "team-embed"  # the engine's own name written back as the endpoint's
        answers.append(r.json())
    counted = wait_for(lambda: (_prompt_tokens(embed_engine.url) - before) or None, timeout=20)
    records = wait_for(
        lambda: (
            list(UsageRecord.objects.filter(endpoint=endpoint))
            if UsageRecord.objects.filter(endpoint=endpoint).count() == 2
            else None
        ),
        timeout=20,
    )
    assert sum(a["usage"]["prompt_tokens"] for a in answers) == counted
    assert sum(r.input_tokens for r in records) == counted and all(r.output_tokens == 0 for r in records)
    refused = httpx.post(
        f"{base}/v1/embeddings", json={"model": "team-embed", "input": "hi", "dimensions": 2}, headers=auth
    )
    assert "Matryoshka" in assert_openai_error(refused, 400)["message"]
