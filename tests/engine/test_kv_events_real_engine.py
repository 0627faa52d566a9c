"""Real vLLM publishes KV-cache events over ZMQ; the subscriber's precise index then says exactly which prompt
blocks the engine's prefix cache holds, through LRU evictions, after the cache is cleared (AllBlocksCleared) and
after the engine restarts (its publisher's sequence back to 0).

The package's events engine (tests/engine/conftest.py; the main engine has no event publisher): 24 KV blocks of 128 tokens, so six 520-token
prompts (4 full blocks each) overflow it and the oldest get evicted; dev mode for ``POST /reset_prefix_cache``.
Prompts are token ids, so the test knows the tokens the engine hashed without a tokenizer.
"""

from __future__ import annotations

import random

import httpx
import pytest

from gateway.kv_events_subscriber import KVEventSubscriber
from gateway.routing.kv_index import KVBlockIndex
from simulator.process import free_port
from tests.engine.conftest import KV_NUM_BLOCKS
from tests.waiting import wait_for

BLOCK = 128  # vLLM's CPU backend block size
REPLICA = "kv-engine"


@pytest.fixture(scope="module")
def kv_events(kv_engine):
    """The events engine (tests/engine/conftest.py) with a subscriber feeding a precise index from its events."""
    index = KVBlockIndex()
    subscriber = KVEventSubscriber(index=index, replica_id=REPLICA, endpoint=kv_engine.events_endpoint, topic="kv")
    subscriber.start()
    try:
        yield kv_engine, index, subscriber
    finally:
        subscriber.stop()


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


def test_the_index_matches_the_engine_cache_through_evictions_and_a_clear(kv_events):
    process, index, subscriber = kv_events
    rng = random.Random(7)
    prompts = [[rng.randrange(5, 4000) for _ in range(4 * BLOCK + 8)] for _ in range(6)]
    for tokens in prompts:
        assert complete(process.url, tokens) == 0
        indexed(index, subscriber, tokens, 4)  # its four full blocks were stored
        with subscriber.lock:
            assert index.size(REPLICA) <= KV_NUM_BLOCKS  # stored minus removed never exceeds the cache

    # Six prompts of five blocks each do not fit 24 blocks: the index must say which survived, as the engine does.
    seen = []
    for tokens in prompts:
        expect = predicted(index, subscriber, tokens)
        assert complete(process.url, tokens) == expect * BLOCK, f"index said {expect} blocks"
        seen.append(expect)
        indexed(index, subscriber, tokens, 4)
    # Evictions happened (vLLM frees a request's blocks tail first, so each prompt lost its last blocks first),
    # and what the index said survived never exceeded the cache.
    assert min(seen) < 4 and sum(seen) <= KV_NUM_BLOCKS, seen
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


METRICS_TOKEN = "kv-events-metrics"


def proxy_counter(base: str, name: str, **labels: str) -> float:
    """A counter of the proxy's /metrics, summed over the series carrying ``labels``."""
    total = 0.0
    text = httpx.get(f"{base}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}, timeout=10).text
    for line in text.splitlines():
        if line.startswith(name + "_total{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rpartition(" ")[2])
    return total


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_live_proxy_routes_to_the_replica_whose_events_show_the_prompt(kv_events, procs, clean_redis, tenant_a):
    """Through a real proxy: an endpoint of two replicas, the engine (publishing KV events) and a simulated one
    (none). Prompts put in the engine's cache behind the proxy's back, so only its events can tell, are routed to
    the engine, the proxy tokenizing the chat as vLLM does (the engine then reports them cached); the routing
    decisions say the precise index chose."""
    from django.conf import settings

    from billing.models import UsageRecord
    from capacity.runtimes.processes import sim_replica_argv
    from endpoints.services import replica_attach
    from gateway.proxy.isolation import CacheSalts
    from tests.factories import EndpointFactory, ModelProfileFactory, ReservationFactory
    from tests.proxy.conftest import spawn_proxy

    process, _index, subscriber = kv_events
    events = subscriber.endpoint  # the engine's publisher, tcp://127.0.0.1:<port>
    endpoint = EndpointFactory(
        name="tiny-llama",
        model_profile=ModelProfileFactory(name="tiny-llama", max_model_len=1024),
        routing_policy="infercap",
        ttft_slo_ms=60_000,
        tpot_slo_ms=5_000,
        concurrency_max=8,
        concurrency_limit=8,
    )
    ReservationFactory(tenant=tenant_a.tenant, endpoint=endpoint, mu_per_min=1e9, priority="critical")
    replica_attach(endpoint=endpoint, url=process.url, name="engine", kv_events_endpoint=events, concurrency_limit=8)
    sim_port = free_port()
    procs.spawn(sim_replica_argv(sim_port, served_model_name="tiny-llama"), port=sim_port)
    replica_attach(endpoint=endpoint, url=f"http://127.0.0.1:{sim_port}", name="sim", concurrency_limit=8)
    # Placement is judged here, not the staleness rule (see test_proxy_two_engines.py: a loaded CI machine's engine can
    # miss scrapes for over 2 s).
    base = spawn_proxy(procs, metrics_token=METRICS_TOKEN, metrics_stale_s=120)
    salt = CacheSalts(settings.INFERCAP.get("CACHE_SALT_SECRET") or settings.SECRET_KEY).for_tenant(tenant_a.tenant.pk)
    rng = random.Random(11)
    words = ["alpha", "bravo", "delta", "kilo", "lima", "oscar", "tango", "zulu"]

    def chat(system: str, question: str) -> dict:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        return {"model": "tiny-llama", "messages": messages, "max_tokens": 1}

    def direct(body: dict) -> None:  # to the engine, as the proxy would send it (its tenant's cache salt)
        httpx.post(
            f"{process.url}/v1/chat/completions", json={**body, "cache_salt": salt}, timeout=120
        ).raise_for_status()

    def via_proxy(body: dict) -> httpx.Response:
        auth = {"Authorization": f"Bearer {tenant_a.raw_key}"}
        response = httpx.post(f"{base}/v1/chat/completions", json=body, headers=auth, timeout=180)
        assert response.status_code == 200, response.text
        return response

    via_proxy(chat("hello", "hi"))  # the proxy loads its snapshot and subscribes to the engine's events

    # A SUB socket joins asynchronously: warm the engine (a prompt of full blocks: only they are stored and
    # published) until the proxy has counted a batch from it.
    def warm() -> None:
        direct(chat(" ".join(rng.choice(words) for _ in range(200)), "x"))

    wait_for(
        lambda: warm() or proxy_counter(base, "infercap_proxy_kv_event_batches"),
        timeout=30,
        message="the proxy receiving the engine's KV events",
    )
    ids = []
    for k in range(3):
        system = " ".join(rng.choice(words) for _ in range(300))  # ~3 blocks of 128 tokens
        before = proxy_counter(base, "infercap_proxy_kv_event_batches")
        direct(chat(system, "first question"))
        wait_for(lambda b=before: proxy_counter(base, "infercap_proxy_kv_event_batches") > b, timeout=10)
        response = via_proxy(chat(system, f"question {k}"))
        cached = (response.json()["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        assert cached >= 2 * BLOCK, f"prompt {k}: the engine cached {cached} of its tokens"
        ids.append(response.headers["x-request-id"])
    wait_for(lambda: UsageRecord.objects.filter(request_id__in=ids).count() == 3, timeout=20)
    assert set(UsageRecord.objects.filter(request_id__in=ids).values_list("replica__name", flat=True)) == {"engine"}
    assert proxy_counter(base, "infercap_proxy_prefix_index", endpoint="tiny-llama", index="precise") >= 3


def test_the_index_starts_afresh_when_the_engine_restarts(kv_events, engine_pool):
    """The engine is stopped and started again on the same ports, its cache empty. From the moment its publisher
    drops, the subscriber stops trusting the old picture; the new engine's first batch (sequence 0) replaces it, and
    the index again predicts exactly what the engine reports cached. Runs last in this module: it restarts the
    engine the other tests here use (test_lora_real_engine then finds it fresh, as it starts)."""
    process, index, subscriber = kv_events
    rng = random.Random(13)
    old = [[rng.randrange(5, 4000) for _ in range(4 * BLOCK + 8)] for _ in range(2)]
    for tokens in old:
        complete(process.url, tokens)
        indexed(index, subscriber, tokens, 4)
    drops = subscriber.disconnects
    with subscriber.lock:
        old_seq = index.replica(REPLICA).last_seq

    def trusted() -> bool:
        with subscriber.lock:
            return index.usable(REPLICA, subscriber.clock())

    def stopped() -> None:
        wait_for(
            lambda: subscriber.disconnects > drops, timeout=30, message="the subscriber seeing the publisher drop"
        )
        assert not trusted()
        assert predicted(index, subscriber, old[0]) == 4  # the old picture is kept, and not trusted

    engine_pool.restart("kv_engine", on_stopped=stopped)
    # The new engine is up: until its first batch the old engine's blocks are not trusted.
    assert not trusted() or predicted(index, subscriber, old[0]) == 0
    fresh = [rng.randrange(5, 4000) for _ in range(4 * BLOCK + 8)]
    assert complete(process.url, fresh) == 0
    indexed(index, subscriber, fresh, 4)
    assert trusted()
    with subscriber.lock:
        assert index.size(REPLICA) == 4 and index.replica(REPLICA).last_seq < old_seq  # a new sequence
    assert all(predicted(index, subscriber, tokens) == 0 for tokens in old)
    assert complete(process.url, old[0]) == 0  # the engine agrees: the old engine's blocks are gone
    indexed(index, subscriber, old[0], 4)
    assert complete(process.url, old[0]) == 4 * BLOCK
    assert subscriber.malformed == 0
