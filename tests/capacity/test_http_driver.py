"""The benchmark's HTTP driver reads a stream leanly (events split from raw bytes, only the first token's and the
last event parsed) and still gets the first token's time, the usage and an error event right, whatever the
network's chunking."""

import asyncio
import json

import httpx
import pytest

from capacity.replica_benchmark.http_driver import HttpReplicaDriver


def _sse(*events) -> bytes:
    return b"".join(b"data: " + (e if isinstance(e, bytes) else json.dumps(e).encode()) + b"\n\n" for e in events)


USAGE = {"prompt_tokens": 7, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 4}}
STREAM = _sse(
    {"choices": [{"index": 0, "text": ""}]},  # vLLM may open with an empty text: not a token yet
    {"choices": [{"index": 0, "text": "a"}]},
    {"choices": [{"index": 0, "text": "b"}]},
    {"choices": [{"index": 0, "text": "c", "finish_reason": "length"}]},
    {"choices": [], "usage": USAGE},
    b"[DONE]",
)


def _read(body: bytes, chunk: int):
    """``_streamed`` over ``body`` cut into ``chunk``-byte pieces; the clock counts the pieces delivered so far."""
    delivered = 0

    async def pieces():
        nonlocal delivered
        for start in range(0, len(body), chunk):
            delivered += 1
            yield body[start : start + chunk]

    def handler(request):
        return httpx.Response(200, content=pieces(), headers={"content-type": "text/event-stream"})

    async def go():
        driver = HttpReplicaDriver("http://replica.test", model="m", api_key="k")  # a key: no server check
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await driver._streamed(client, {"model": "m"}, lambda: delivered)

    return asyncio.run(go())


@pytest.mark.parametrize("chunk", [1, 7, 64, 10_000])
def test_first_token_and_usage_whatever_the_chunking(chunk):
    accepted, first, usage = _read(STREAM, chunk)
    event_end = STREAM.index(b"\n\n", STREAM.index(b'"a"')) + 2  # the first token's event, read whole
    assert usage == USAGE
    assert first == -(-event_end // chunk)  # the piece that completed it
    assert accepted == 0  # the headers came before any of the body


def test_an_error_event_at_the_end_is_an_error_not_a_missing_usage():
    body = _sse({"choices": [{"index": 0, "text": "a"}]}, {"error": {"message": "boom", "code": 500}}, b"[DONE]")
    with pytest.raises(ValueError, match="boom"):
        _read(body, 5)


def test_a_stream_without_a_token_has_no_first_token_time():
    accepted, first, usage = _read(_sse({"choices": [], "usage": USAGE}, b"[DONE]"), 9)
    assert first is None and usage == USAGE
