"""The simulated replica's /v1/embeddings, as vLLM 0.32 serves it with --runner pooling (simulator/embeddings.py):
the response's shape, float and base64 vectors, usage and the engine's prompt counter, and the 404s and 400s the
engine gives."""

import base64
import math
import struct

import httpx
import openai
import pytest

from capacity.hardware.profiles import get_profile
from simulator.embeddings import EMBEDDING_DIM
from simulator.server import ThreadedReplica
from simulator.tokens import count_tokens


@pytest.fixture
def pooling():
    with ThreadedReplica(get_profile("tiny"), speed=4.0, runner="pooling", served_model_name="embedder") as replica:
        yield replica


def _prompt_counter(url: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("vllm:prompt_tokens_total"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_embeddings_have_vllms_shape_and_count_the_prompt(pooling):
    client = openai.OpenAI(base_url=f"{pooling.url}/v1", api_key="x")
    answer = client.embeddings.create(model="embedder", input=["hello world", "a b c"])
    assert answer.object == "list" and answer.id.startswith("embd-") and answer.model == "embedder"
    assert [d.index for d in answer.data] == [0, 1] and all(len(d.embedding) == EMBEDDING_DIM for d in answer.data)
    assert math.isclose(sum(v * v for v in answer.data[0].embedding), 1.0, rel_tol=1e-6)
    expected = count_tokens("hello world") + count_tokens("a b c")
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == expected
    assert _prompt_counter(pooling.url) == expected  # the engine's own counter agrees with the usage
    again = client.embeddings.create(model="embedder", input="hello world")
    assert again.data[0].embedding == answer.data[0].embedding  # the same input, the same vector
    raw = httpx.post(
        f"{pooling.url}/v1/embeddings", json={"model": "embedder", "input": [1, 2, 3], "encoding_format": "base64"}
    ).json()
    named = httpx.post(
        f"{pooling.url}/v1/embeddings", json={"model": "embedder", "input": "x"}, headers={"X-Request-Id": "r-9"}
    )
    assert named.json()["id"] == "embd-r-9" and named.headers["X-Request-Id"] == "r-9"
    floats = struct.unpack(f"<{EMBEDDING_DIM}f", base64.b64decode(raw["data"][0]["embedding"]))
    assert math.isclose(sum(v * v for v in floats), 1.0, rel_tol=1e-5) and raw["usage"]["prompt_tokens"] == 3
    assert raw["usage"]["completion_tokens"] == 0 and raw["usage"]["prompt_tokens_details"] is None


def test_what_the_engine_refuses(pooling):
    post = lambda body: httpx.post(f"{pooling.url}/v1/embeddings", json={"model": "embedder", **body})  # noqa: E731
    empty = post({"input": ""})
    assert empty.status_code == 400 and empty.json()["error"]["message"] == "The decoder prompt cannot be empty"
    sized = post({"input": "hi", "dimensions": 4})
    assert sized.status_code == 400 and "does not support Matryoshka embeddings" in sized.json()["error"]["message"]
    assert post({"input": "hi", "model": "other"}).status_code == 404
    # A pooling replica serves no completions, and a generating one no embeddings: FastAPI's 404.
    completions = httpx.post(f"{pooling.url}/v1/completions", json={"model": "embedder", "prompt": "hi"})
    assert completions.status_code == 404 and completions.json() == {"detail": "Not Found"}
    with ThreadedReplica(get_profile("tiny"), speed=4.0) as generating:
        refused = httpx.post(f"{generating.url}/v1/embeddings", json={"model": "tiny", "input": "hi"})
        assert refused.status_code == 404 and refused.json() == {"detail": "Not Found"}
