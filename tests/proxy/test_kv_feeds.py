"""The live precise prefix index in the proxy: one KV-event subscriber per replica that publishes, following the
config snapshot (started, replaced, stopped, closed), real ZMQ sockets feeding the router's index; the prompt
tokenized as the engine tokenizes it, and the approximate index answering whenever that is not possible."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import msgpack
import pytest
import zmq

from gateway.proxy.config import ProxyConfig
from gateway.proxy.kv_feeds import KVFeeds
from gateway.proxy.prompt_tokens import PromptTokenizer, TokenizerCache
from gateway.proxy.request import parse_request
from gateway.proxy.runtime import EndpointRuntime
from gateway.proxy.snapshot import ReplicaInfo
from gateway.proxy.stages import prompt_tokens
from gateway.routing.base import RouteRequest
from gateway.routing.bounded_affinity import PREFIX_SOURCE_KEY
from gateway.routing.kv_events import endpoint_problem
from gateway.routing.llmd import KV_TOKENS_KEY
from simulator.process import free_port
from tests.proxy.snapshots import endpoint
from tests.waiting import wait_for

TINY = Path(__file__).resolve().parents[2] / "var" / "engine" / "tiny-llama"
BLOCK = 4


class FakeSubscriber:
    def __init__(self, *, index, replica_id, endpoint, topic, lock, clock, on_batch):
        self.replica_id, self.endpoint = replica_id, endpoint
        self.started = self.stopped = False
        self.joined_s = None

    def start(self, wait_s=5.0):
        assert wait_s == 0.0, "the proxy never waits on its event loop"
        self.started = True

    def stop(self, timeout_s=2.0):
        self.stopped = True
        self.joined_s = timeout_s

    @property
    def alive(self):
        return not self.stopped or not self.joined_s


def replica(rid: int, events: str = "") -> ReplicaInfo:
    return ReplicaInfo(
        id=rid, name=f"r{rid}", url=f"http://replica-{rid}", concurrency_limit=4, kv_events_endpoint=events
    )


def test_subscribers_follow_the_snapshot_and_close_joins_them():
    made = []
    feeds = KVFeeds(subscriber_factory=lambda **kw: made.append(FakeSubscriber(**kw)) or made[-1])
    feeds.sync([replica(1, "tcp://127.0.0.1:6001"), replica(2), replica(3, "tcp://10.0.0.3:6003")])
    assert sorted(feeds.subscribers) == ["1", "3"] and all(s.started for s in made)
    feeds.index.replica("1").blocks.add(b"h")  # what replica 1's events said

    feeds.sync([replica(1, "tcp://127.0.0.1:7001"), replica(3, "tcp://10.0.0.3:6003")])  # 1 restarted elsewhere
    first, third, renewed = made[0], made[1], made[2]
    assert first.stopped and first.joined_s == 0.0 and not third.stopped
    assert feeds.subscribers["1"] is renewed and renewed.endpoint == "tcp://127.0.0.1:7001"
    assert feeds.index.size("1") == 0  # the old engine's blocks are forgotten

    feeds.sync([replica(1, "tcp://127.0.0.1:7001")])  # 3 left the snapshot
    assert third.stopped and sorted(feeds.subscribers) == ["1"] and len(made) == 3
    feeds.close()
    assert renewed.stopped and renewed.joined_s == 2.0 and not feeds.active


def test_a_runtime_subscribes_only_under_the_precise_policy():
    base = endpoint(replicas=0)
    info = dataclasses.replace(base, routing_policy="infercap", replicas=(replica(5, "tcp://127.0.0.1:1"), replica(6)))
    runtime = EndpointRuntime(info, config=ProxyConfig(), clock=time.monotonic)
    try:
        assert sorted(runtime.kv_feeds.subscribers) == ["5"]
        assert runtime.router.kv_index is runtime.kv_feeds.index
        runtime.update(dataclasses.replace(info, routing_policy="least_request"))
        assert not runtime.kv_feeds.active  # another policy reads no events: nothing subscribed
    finally:
        runtime.close()


def publish(pub, seq: int, events: list) -> None:
    pub.send_multipart([b"kv", seq.to_bytes(8, "big", signed=True), msgpack.packb([time.time(), events, None])])


def stored(tokens: list[int], hashes: list[bytes]) -> dict:
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": None,
        "token_ids": tokens,
        "block_size": BLOCK,
    }


def test_real_zmq_events_steer_the_router_to_the_replica_holding_the_prompt():
    port = free_port()
    pub = zmq.Context.instance().socket(zmq.PUB)
    pub.bind(f"tcp://127.0.0.1:{port}")
    base = endpoint(replicas=0)
    info = dataclasses.replace(
        base, routing_policy="infercap", replicas=(replica(1), replica(2, f"tcp://127.0.0.1:{port}"))
    )
    runtime = EndpointRuntime(info, config=ProxyConfig(), clock=time.monotonic)
    try:
        tokens = list(range(10, 10 + 8 * BLOCK))
        # A SUB socket joins a PUB one asynchronously: publish until the subscriber has seen a batch.
        wait_for(
            lambda: (
                publish(pub, 0, [stored(tokens, [bytes([i]) for i in range(8)])]) or runtime.kv_feeds.index.size("2")
            ),
            timeout=10,
            message="the subscriber receiving the engine's BlockStored",
        )
        route = RouteRequest(request_id="a", prompt_text="x" * 200, extra={KV_TOKENS_KEY: tokens + [1, 2]})
        slot = runtime.try_take(route, 1.0)
        assert slot.view.replica_id == "2" and route.extra[PREFIX_SOURCE_KEY] == "precise"
        plain = RouteRequest(request_id="b", prompt_text="y" * 200)  # no tokens: the approximate index
        runtime.try_take(plain, 1.0)
        assert plain.extra[PREFIX_SOURCE_KEY] == "approximate"
    finally:
        runtime.close()
        pub.close(0)
    assert not any(s.alive for s in runtime.kv_feeds._stopping)


def test_a_restarted_publisher_is_noticed_and_its_first_batch_starts_the_replica_afresh():
    """An engine stops (its PUB socket closes) and a new one binds the same address: the subscriber sees the
    connection drop, the replica is not trusted until a batch arrives, and the new engine's first batch replaces
    the old engine's blocks, even when the subscriber reconnected only after the new engine's first batches."""
    from gateway.kv_events_subscriber import KVEventSubscriber
    from gateway.routing.kv_index import KVBlockIndex

    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    context = zmq.Context.instance()
    index = KVBlockIndex()
    subscriber = KVEventSubscriber(index=index, replica_id="r", endpoint=address, clock=time.monotonic, poll_ms=20)
    old = context.socket(zmq.PUB)
    old.bind(address)
    subscriber.start()
    new = None
    try:
        wait_for(
            lambda: publish(old, 0, [stored(list(range(8)), [b"a", b"b"])]) or index.size("r"),
            timeout=10,
            message="the subscriber receiving the first engine's blocks",
        )
        for seq in range(1, 6):
            publish(old, seq, [])
        wait_for(lambda: index.replica("r").last_seq == 5, timeout=10, message="batches up to sequence 5")
        assert index.usable("r", time.monotonic()) and subscriber.disconnects == 0

        old.close(0)  # the engine stops
        wait_for(lambda: subscriber.disconnects == 1, timeout=10, message="the subscriber seeing the drop")
        with subscriber.lock:
            assert not index.usable("r", time.monotonic()) and index.blocks("r") == {b"a", b"b"}

        new = context.socket(zmq.PUB)
        new.bind(address)  # the restarted engine; the subscriber missed its batches 0 and 1
        wait_for(
            lambda: publish(new, 2, [stored(list(range(100, 104)), [b"c"])]) or index.size("r") == 1,
            timeout=10,
            message="the new engine's batch replacing the old engine's blocks",
        )
        with subscriber.lock:
            assert index.blocks("r") == {b"c"} and index.usable("r", time.monotonic())
        assert subscriber.malformed == 0
    finally:
        subscriber.stop()
        old.close(0)
        if new is not None:
            new.close(0)
    assert not subscriber.alive


def test_the_endpoint_address_is_checked():
    assert endpoint_problem("tcp://127.0.0.1:5557") is None and endpoint_problem("tcp://[::1]:5557") is None
    assert endpoint_problem("tcp://vllm-0.pool.svc:5557") is None
    for bad in ("tcp://*:5557", "http://h:1", "tcp://h", "tcp://h:0", "tcp://h:70000", "tcp://a b:1", "ipc:///x"):
        assert endpoint_problem(bad), bad


@pytest.mark.skipif(not (TINY / "tokenizer.json").is_file(), reason="the tiny model is not built (make engine)")
def test_chat_prompts_tokenize_through_the_template_and_what_cannot_be_reproduced_falls_back():
    tokenizer = PromptTokenizer(TINY)
    bos = tokenizer.tokenizer.token_to_id("<|bos|>")
    body = {"messages": [{"role": "system", "content": "be terse"}, {"role": "user", "content": "hi"}]}
    ids = tokenizer.tokens("chat", body)
    text = tokenizer.tokenizer.decode(ids, skip_special_tokens=False)
    assert ids[0] == bos and ids.count(bos) == 1  # the template's BOS, not a second one added by the encoder
    assert text.endswith("<|assistant|>\n") and "<|user|>\nhi<|eos|>" in text
    assert tokenizer.tokens("completions", {"prompt": "hi"})[0] != bos  # its post-processor adds none
    assert tokenizer.tokens("completions", {"prompt": [5, 6, 7]}) == [5, 6, 7]
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    for unsupported in (parts, {**body, "tools": [{"type": "function"}]}, {"prompt": ["a", "b"]}):
        assert tokenizer.tokens("chat" if "messages" in unsupported else "completions", unsupported) is None
    cache = TokenizerCache()
    assert cache.cached(str(TINY)) is False
    assert cache.get(str(TINY)) is cache.get(str(TINY)) is not None
    assert cache.get(str(TINY.parent)) is None  # no tokenizer.json there


@pytest.mark.skipif(not (TINY / "tokenizer.json").is_file(), reason="the tiny model is not built (make engine)")
def test_the_proxy_tokenizes_only_for_an_endpoint_whose_replicas_publish_events(settings):
    settings.INFERCAP = {**settings.INFERCAP, "VLLM_MODELS_DIR": str(TINY.parent)}

    class State:
        tokenizers = TokenizerCache()
        tokenize_pool = None  # the loop's default executor

    req = parse_request("chat", b'{"model": "m", "messages": [{"role": "user", "content": "hello"}]}')
    with_events = dataclasses.replace(
        endpoint(replicas=0), model=TINY.name, routing_policy="infercap", replicas=(replica(1, "tcp://127.0.0.1:1"),)
    )
    runtime = EndpointRuntime(with_events, config=ProxyConfig())
    try:
        route = RouteRequest(request_id="a", prompt_text="hello")
        asyncio.run(prompt_tokens(State(), runtime, route, req))
        assert route.extra[KV_TOKENS_KEY] == PromptTokenizer(TINY).tokens("chat", req.body)
        runtime.update(dataclasses.replace(with_events, replicas=(replica(1),)))  # its events went away
        route = RouteRequest(request_id="b", prompt_text="hello")
        asyncio.run(prompt_tokens(State(), runtime, route, req))
        assert KV_TOKENS_KEY not in route.extra
        runtime.update(dataclasses.replace(with_events, model="no-such-model"))  # no local tokenizer
        asyncio.run(prompt_tokens(State(), runtime, route, req))
        assert KV_TOKENS_KEY not in route.extra
    finally:
        runtime.close()
