"""Real vLLM publishes KV-cache events over ZMQ; the subscriber's precise index then says exactly which prompt
blocks the engine's prefix cache holds, through LRU evictions and after the cache is cleared (AllBlocksCleared).

One engine of its own (the session engine has no event publisher): 24 KV blocks of 128 tokens, so six 520-token
prompts (4 full blocks each) overflow it and the oldest get evicted; dev mode for ``POST /reset_prefix_cache``.
Prompts are token ids, so the test knows the tokens the engine hashed without a tokenizer.
"""

from __future__ import annotations

import json
import os
import random

import httpx
import pytest

from endpoints.kv_events_subscriber import KVEventSubscriber
from endpoints.routing.kv_index import KVBlockIndex
from endpoints.runtimes.sim.process import free_port
from tests.engine.engine import engine_installed, start_engine, stop_engine
from tests.waiting import wait_for

BLOCK = 128  # vLLM's CPU backend block size
NUM_BLOCKS = 24
REPLICA = "kv-engine"


@pytest.fixture(scope="module")
def kv_engine():
    if os.environ.get("INFERCAP_SKIP_ENGINE") == "1":
        pytest.skip("INFERCAP_SKIP_ENGINE=1: the real vLLM engine tests are skipped")
    if not engine_installed():
        pytest.fail("the real vLLM engine is not installed: run scripts/install_engine.sh", pytrace=False)
    events_port = free_port()
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{events_port}", "topic": "kv"}
    process = start_engine(
        served_model_name="tiny-llama",
        extra=[
            "--kv-events-config",
            json.dumps(config),
            "--num-gpu-blocks-override",
            str(NUM_BLOCKS),
            "--max-model-len",
            "1024",
        ],
        env={"VLLM_SERVER_DEV_MODE": "1"},
    )
    index = KVBlockIndex()
    subscriber = KVEventSubscriber(
        index=index, replica_id=REPLICA, endpoint=f"tcp://127.0.0.1:{events_port}", topic="kv"
    )
    subscriber.start()
    try:
        yield process, index, subscriber
    finally:
        subscriber.stop()
        stop_engine(process)
        os.unlink(process.log_path)


def complete(url: str, tokens: list[int]) -> int:
    """Send a prompt of token ids; the engine's count of its cached prompt tokens."""
    response = httpx.post(
        f"{url}/v1/completions", json={"model": "tiny-llama", "prompt": tokens, "max_tokens": 1}, timeout=120
    )
    response.raise_for_status()
    return (response.json()["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def predicted(index: KVBlockIndex, subscriber: KVEventSubscriber, tokens: list[int]) -> int:
    with subscriber.lock:
        return index.match_tokens(REPLICA, tokens, BLOCK)


def indexed(index, subscriber, tokens, blocks: int):
    return wait_for(
        lambda: predicted(index, subscriber, tokens) == blocks,
        timeout=20,
        message=f"the index holding {blocks} blocks of the prompt",
    )


def test_the_index_matches_the_engine_cache_through_evictions_and_a_clear(kv_engine):
    process, index, subscriber = kv_engine
    rng = random.Random(7)
    prompts = [[rng.randrange(5, 4000) for _ in range(4 * BLOCK + 8)] for _ in range(6)]
    for tokens in prompts:
        assert complete(process.url, tokens) == 0
        indexed(index, subscriber, tokens, 4)  # its four full blocks were stored
        with subscriber.lock:
            assert index.size(REPLICA) <= NUM_BLOCKS  # stored minus removed never exceeds the cache

    # Six prompts of five blocks each do not fit 24 blocks: the index must say which survived, as the engine does.
    seen = []
    for tokens in prompts:
        expect = predicted(index, subscriber, tokens)
        assert complete(process.url, tokens) == expect * BLOCK, f"index said {expect} blocks"
        seen.append(expect)
        indexed(index, subscriber, tokens, 4)
    # Evictions happened (vLLM frees a request's blocks tail first, so each prompt lost its last blocks first),
    # and what the index said survived never exceeded the cache.
    assert min(seen) < 4 and sum(seen) <= NUM_BLOCKS, seen
    with subscriber.lock:
        assert index.usable(REPLICA, subscriber.clock())
    assert subscriber.malformed == 0

    # The cache is cleared. vLLM queues AllBlocksCleared and publishes it with the next step's events, before
    # the blocks that step stores: afterwards the index holds exactly the new prompt's blocks, as the engine does.
    httpx.post(f"{process.url}/reset_prefix_cache", timeout=30).raise_for_status()
    fresh = [rng.randrange(5, 4000) for _ in range(4 * BLOCK + 8)]
    assert complete(process.url, fresh) == 0
    indexed(index, subscriber, fresh, 4)
    wait_for(lambda: index.size(REPLICA) == 4, timeout=20, message="only the new prompt's blocks after the clear")
    assert all(predicted(index, subscriber, tokens) == 0 for tokens in prompts)
    assert complete(process.url, prompts[-1]) == 0  # the engine agrees: its old blocks are gone
    indexed(index, subscriber, prompts[-1], 4)
    assert complete(process.url, prompts[-1]) == 4 * BLOCK
