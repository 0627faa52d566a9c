"""LoRA adapters on the request path, in process (no sockets, no database; docs/lora-serving.md): who may name which adapter,
what the router and the replica are given, loads on demand (one per replica and adapter, however many requests wait
on it), the idle adapter the router names (LRU for a router naming none) unloaded at the slot limit, and failed loads as OpenAI-shaped errors
that leave nothing stuck."""

import asyncio
import json
from dataclasses import replace

import pytest

from capacity.runtimes.lora_artifacts import engine_name
from capacity.runtimes.vllm_metrics import ReplicaMetrics, parse_vllm_metrics
from gateway.proxy.config import ProxyConfig
from gateway.proxy.errors import ProxyError
from gateway.proxy.replica_adapters import ReplicaAdapters, engine_adapters, ensure_loaded
from gateway.proxy.runtime import ENGINE_NAMED_KEY, EndpointRuntime
from gateway.proxy.snapshot import AdapterInfo
from gateway.proxy.stages import price_request, resolve_model
from gateway.routing.base import RouteRequest
from tests.proxy.snapshots import TENANT_A, TENANT_B, bearer, endpoint, key, reservation, snapshot
from tests.proxy.test_pipeline import Client, State, run
from tests.proxy.test_relay import DONE, USAGE, Response
from tests.proxy.test_stages import chat


def adapter(name="support-ft", *, owner=TENANT_A, base="chat-7b", path="/lora/support", root="", factor=1.1):
    return AdapterInfo(
        name=name, owner_tenant_id=owner, endpoint_name=base, rank=8, path=path, created=0, root=root, mu_factor=factor
    )


BASE = endpoint(replicas=2, limit=4, max_loras=2)
NO_LORA = endpoint(id=9, name="plain-7b", max_loras=0)
ADAPTERS = [
    adapter(),
    adapter("shared-ft", owner=None),
    adapter("b-ft", owner=TENANT_B),
    adapter("plain-ft", base="plain-7b"),
]


def world(*adapters):
    snap = snapshot(endpoints=[BASE, NO_LORA], reservations={(TENANT_A, BASE.id): reservation(priority="standard")})
    snap.adapters_by_name.update({a.name: a for a in adapters or ADAPTERS})
    return snap


# -- resolve and price -------------------------------------------------------------------------------------------
def test_an_adapter_resolves_to_its_base_endpoint_for_tenants_that_may_use_it():
    snap = world()
    found, used = resolve_model(snap, key(), chat("support-ft"))
    assert (found.name, used.name) == ("chat-7b", "support-ft")
    assert resolve_model(snap, key(tenant_id=TENANT_B), chat("shared-ft"))[1].name == "shared-ft"
    assert resolve_model(snap, key(), chat("chat-7b"))[1] is None  # the base model itself


def test_another_tenants_adapter_is_a_404_exactly_like_a_missing_model():
    snap = world()
    answers = []
    for name in (
        "b-ft",
        "no-such-ft",
        "plain-ft",
    ):  # B's private adapter; none at all; one whose endpoint has LoRA off
        with pytest.raises(ProxyError) as caught:
            resolve_model(snap, key(), chat(name))
        err = caught.value
        answers.append((err.status, err.code, err.param, err.message.replace(name, "NAME")))
    assert (
        answers[0] == answers[1] == answers[2] == (404, "model_not_found", "model", "The model `NAME` does not exist.")
    )


def test_adapter_requests_cost_the_base_endpoints_mu_times_the_adapter_factor():
    snap, req = world(), chat("support-ft", max_tokens=50)
    base = price_request(snap, key=key(), endpoint=BASE, req=req, requested=None, best_effort_mu_per_min=0)
    lora = price_request(
        snap, key=key(), endpoint=BASE, req=req, requested=None, best_effort_mu_per_min=0, mu_factor=1.1
    )
    assert lora.mu == pytest.approx(base.mu * 1.1) and lora.priority == base.priority == "standard"


# -- the engine's view -------------------------------------------------------------------------------------------
def test_the_scraper_reads_the_newest_lora_info_series_and_models_lists_children():
    text = (
        'vllm:num_requests_running{engine="0",model_name="m"} 1.0\n'
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="old",waiting_lora_adapters=""} 100.0\n'
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="a,b",waiting_lora_adapters="c"} 200.0\n'
    )
    metrics = parse_vllm_metrics(text)
    assert (metrics.lora_max, metrics.lora_active) == (2, frozenset({"a", "b", "c"}))
    cards = {"data": [{"id": "m", "parent": None}, {"id": "a", "parent": "m", "root": "/x"}]}
    assert engine_adapters(json.dumps(cards).encode(), "m") == {"a"}
    assert engine_adapters(b"<html>", "m") == set()


# -- loads -------------------------------------------------------------------------------------------------------
class Engine:
    """A vLLM engine's runtime LoRA API as a session: loads take ``load_s``; ``fail_load`` answers that status."""

    def __init__(self, *, load_s=0.0, fail_load=None, loaded=()):
        self.load_s, self.fail_load = load_s, fail_load
        self.loaded, self.calls = set(loaded), []

    async def post(self, url, *, data, headers, timeout):
        url = str(url)  # the proxy hands aiohttp a parsed yarl.URL
        body = json.loads(data)
        path = "/v1/" + url.split("/v1/", 1)[1]
        self.calls.append((path, body.get("lora_name") or body.get("model")))
        if path == "/v1/load_lora_adapter":
            await asyncio.sleep(self.load_s)
            if self.fail_load:
                return Response(status=self.fail_load, body=b'{"error":{"message":"/secret/path not found"}}')
            if body["lora_name"] in self.loaded:
                return Response(status=400, body=b"The lora adapter 'x' has already been loaded.")
            self.loaded.add(body["lora_name"])
            return Response(body=b"Success")
        if path == "/v1/unload_lora_adapter":
            self.loaded.discard(body["lora_name"])
            return Response(body=b"Success")
        assert body["model"] in self.loaded, "a request for an adapter the replica does not hold"
        return Response(chunks=[USAGE + DONE])

    def count(self, path):
        return sum(1 for p, _ in self.calls if p == path)


async def load(engine, replica, name="support-ft", *, max_loras=2, timeout_s=5.0, **fields):
    return await ensure_loaded(
        engine, url="http://r", replica=replica, adapter=adapter(name, **fields), max_loras=max_loras,
        timeout_s=timeout_s,
    )  # fmt: skip


async def test_concurrent_requests_wait_on_one_load():
    engine, replica = Engine(load_s=0.05), ReplicaAdapters()
    waited = await asyncio.gather(*(load(engine, replica) for _ in range(5)))
    # The request that started the load is told its time (it pays for it); the others waited on it for free.
    assert waited[0] >= 0.05 and waited[1:] == [0.0] * 4 and engine.count("/v1/load_lora_adapter") == 1
    assert replica.held() == {"support-ft"} and not replica.loading
    assert await load(engine, replica) is None  # held: no wait, no call


async def test_at_the_slot_limit_the_least_recently_used_idle_adapter_is_unloaded():
    engine, replica = Engine(), ReplicaAdapters()
    replica.last_used.update({"old": 1.0, "busy": 0.5, "new": 2.0})
    replica.in_use["busy"] = 1
    await load(engine, replica, "third", max_loras=3)
    assert engine.calls[0] == ("/v1/unload_lora_adapter", "old")  # 'busy' is older but in use
    assert replica.held() == {"busy", "new", "third"} and replica.unloads == 1
    replica.in_use.update({"new": 1, "third": 1})
    with pytest.raises(ProxyError) as caught:  # every slot in use
        await load(engine, replica, "fourth", max_loras=3)
    assert (caught.value.status, caught.value.code, caught.value.retry_after) == (503, "adapter_slots_busy", 1)
    assert not replica.loading and "fourth" not in replica.held()


@pytest.mark.parametrize(("policy", "unloaded"), [("infercap", "rare"), ("least_request", "hot")])
async def test_at_the_limit_the_runtime_unloads_the_adapter_its_router_names(policy, unloaded):
    # infercap's rule: the least popular idle adapter ('rare', asked once) leaves, though 'hot' was used longer ago;
    # a router naming no rule leaves it to LRU (vLLM's own).
    runtime = EndpointRuntime(replace(BASE, routing_policy=policy), config=ProxyConfig(), clock=lambda: 30.0)
    for i in range(6):
        request = RouteRequest(request_id=f"h{i}", prompt_text="", adapter="hot")
        runtime.router.on_routed(request, "100", float(i))
        runtime.router.on_finished(request, "100", float(i) + 0.5)
    runtime.router.on_routed(RouteRequest(request_id="r", prompt_text="", adapter="rare"), "100", 20.0)
    replica = runtime.adapters_of(runtime.slots["100"])
    replica.last_used.update({"hot": 5.5, "rare": 20.5})
    engine = Engine(loaded={"hot", "rare"})
    await load(engine, replica, "third", max_loras=2)
    assert engine.calls[0] == ("/v1/unload_lora_adapter", unloaded)
    assert replica.held() == {"hot", "rare", "third"} - {unloaded}


@pytest.mark.parametrize("case", ["refused", "timeout", "vanished"])
async def test_a_failed_load_is_an_openai_error_and_leaves_nothing_loading(case, tmp_path):
    engine = Engine(fail_load=404 if case == "refused" else None, load_s=1.0 if case == "timeout" else 0.0)
    fields = {"root": str(tmp_path), "path": str(tmp_path / "gone")} if case == "vanished" else {}
    replica = ReplicaAdapters()
    results = await asyncio.gather(
        *(load(engine, replica, timeout_s=0.2, **fields) for _ in range(3)), return_exceptions=True
    )
    assert all(isinstance(r, ProxyError) for r in results)
    expected = {"refused": 502, "timeout": 502, "vanished": 503}[case]
    assert {(r.status, r.type, r.param) for r in results} == {(expected, "server_error", "model")}
    assert "/secret" not in results[0].message  # the engine's message names the operators' paths
    assert not replica.loading and not replica.held()
    assert engine.count("/v1/load_lora_adapter") == (0 if case == "vanished" else 1)
    engine.fail_load, engine.load_s = None, 0.0
    if case != "vanished":
        assert await load(engine, replica) > 0  # the next request tries again


async def test_an_adapter_another_process_loaded_counts_as_loaded():
    engine, replica = Engine(loaded={"support-ft"}), ReplicaAdapters()
    await load(engine, replica)
    assert replica.held() == {"support-ft"}
    replica.sync_from_models({"support-ft", "elsewhere"})
    assert replica.last_used["elsewhere"] == 0.0  # the least recently used: evicted first
    replica.sync_from_models({"elsewhere"})
    assert replica.held() == {"elsewhere"}


# -- through the pipeline ----------------------------------------------------------------------------------------
def lora_chat(model="support-ft"):
    return {"model": model, "messages": [{"role": "user", "content": "hello"}], "stream": True, "max_tokens": 5}


async def test_the_first_request_loads_the_adapter_on_the_picked_replica_and_names_it_upstream(monkeypatch):
    engine = Engine(load_s=0.05)
    state = State(world(), engine)
    clients = [Client(lora_chat()) for _ in range(3)]
    await asyncio.gather(*(run(state, c, monkeypatch=monkeypatch) for c in clients))
    assert [c.status for c in clients] == [200, 200, 200]
    completions = [name for path, name in engine.calls if path == "/v1/chat/completions"]
    assert completions == ["support-ft"] * 3  # the engine is asked for the adapter, under its own name
    loads = engine.count("/v1/load_lora_adapter")
    runtime = state.runtimes[BASE.id]
    holders = [rid for rid, a in runtime.adapters.items() if "support-ft" in a.held()]
    assert loads == len(holders) >= 1
    assert all(not a.in_use for a in runtime.adapters.values())  # every request gave its use back
    records = state.usage.records
    assert [r["adapter"] for r in records] == ["support-ft"] * 3 and {r["endpoint_id"] for r in records} == {BASE.id}


async def test_a_failed_load_reaches_the_client_as_an_openai_error_and_is_metered(monkeypatch):
    state = State(world(), Engine(fail_load=500))
    client = Client(lora_chat())
    await run(state, client, monkeypatch=monkeypatch)
    assert client.status == 502 and client.error()["code"] == "adapter_load_failed"
    [record] = state.usage.records
    assert (record["status"], record["adapter"]) == ("upstream_error", "support-ft")
    assert state.runtimes[BASE.id].in_flight == 0


async def test_a_tenant_cannot_reach_another_tenants_adapter_through_the_pipeline(monkeypatch):
    engine = Engine()
    state = State(world(), engine)
    client = Client(lora_chat("b-ft"))
    await run(state, client, headers=bearer(), monkeypatch=monkeypatch)
    assert client.status == 404 and client.error()["code"] == "model_not_found"
    assert engine.calls == [] and state.usage.records == []


# -- the runtime's views -----------------------------------------------------------------------------------------
def test_views_carry_the_engines_lora_state_and_adapter_requests_go_only_where_they_fit():
    class Scraper:  # replica 100's engine runs LoRA (2 slots, 'ft' running); replica 101's does not
        def latest(self, rid):
            lora = {"lora_max": 2, "lora_active": frozenset({"ft"})} if rid == "100" else {}
            return ReplicaMetrics(scraped_at=1.0, **lora)

        def note(self, rids):
            pass

    runtime = EndpointRuntime(
        endpoint(replicas=2, limit=4), config=ProxyConfig(), scraper=Scraper(), clock=lambda: 1.0
    )
    views = {v.replica_id: v for v in runtime._views(1.0)}
    assert (views["100"].adapters, views["100"].max_loras, views["100"].active_adapters) == ({"ft"}, 2, {"ft"})
    assert views["101"].max_loras == 0
    for i in range(3):  # however the router would spread them, adapter requests land where adapters are served
        slot = runtime.try_take(RouteRequest(request_id=f"r{i}", prompt_text="", adapter="other"), 1.0)
        assert slot is not None and slot.replica_id == 100
    runtime.adapters["100"].in_use.update({"ft": 1, "other": 1})
    runtime.adapters["100"].last_used["other"] = 1.0
    held = RouteRequest(request_id="r9", prompt_text="", adapter="third")
    assert runtime.try_take(held, 1.0) is None  # both slots hold adapters in use: it waits in the queue


def test_a_tenants_adapter_goes_where_its_quota_does_not_unload_its_own():
    class Scraper:  # both replicas' engines serve 2 adapters: one tenant's private ones may hold 1 slot of each
        def latest(self, rid):
            return ReplicaMetrics(scraped_at=1.0, lora_max=2, lora_active=frozenset())

        def note(self, rids):
            pass

    runtime = EndpointRuntime(
        endpoint(replicas=2, limit=4), config=ProxyConfig(), scraper=Scraper(), clock=lambda: 1.0
    )
    runtime.router.pick = lambda route, views, now: min(v.replica_id for v in views)  # it would pick replica 100
    first, second = (engine_name(adapter_id=i, owner_tenant_id=TENANT_A, fingerprint="f0") for i in (1, 2))
    runtime._views(1.0)
    runtime.adapters["100"].last_used[first] = 1.0  # the tenant's first adapter, idle on replica 100
    route = RouteRequest(request_id="r1", prompt_text="", adapter=second)
    route.extra[ENGINE_NAMED_KEY] = True
    slot = runtime.try_take(route, 1.0)
    # On 100 its quota would unload its first adapter to load the second: 101 has room, so it goes there.
    assert slot is not None and slot.replica_id == 101
    again = RouteRequest(request_id="r2", prompt_text="", adapter=first)
    again.extra[ENGINE_NAMED_KEY] = True
    assert runtime.try_take(again, 1.0).replica_id == 100  # where it is held
