"""The simulator's LoRA model: slots, unload by the router's rule (LRU by default), load time in TTFT, step overhead, and vLLM 0.32's HTTP shapes."""

import json

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from capacity.hardware.profiles import get_profile
from gateway.routing import make_router
from gateway.routing.base import ReplicaView
from simulator.adapter_slots import AdapterSlots, LoraConfig, step_factor, uniform_load_times
from simulator.des import Simulation
from simulator.engine import Engine
from simulator.engine import Sequence as EngineSeq
from simulator.server import ThreadedReplica
from simulator.workloads import SimRequest

# -- slots -----------------------------------------------------------------------------------------------------


def test_a_load_waits_for_the_loader_and_a_second_request_shares_it():
    slots = AdapterSlots(max_loras=2)
    assert slots.acquire("a", now=0.0, load_s=1.5) == 1.5
    assert slots.acquire("a", now=0.5, load_s=1.5) == 1.5  # already loading: no second load
    assert slots.acquire("b", now=0.5, load_s=1.0) == 2.5  # one loader per replica: after a's load
    assert slots.loads == 2


def test_the_lru_idle_adapter_leaves_at_the_limit_and_one_in_use_never_does():
    slots = AdapterSlots(max_loras=2)
    slots.acquire("a", 0.0, 0.0)
    slots.acquire("b", 1.0, 0.0)
    slots.release("a", 2.0)
    slots.release("b", 3.0)
    slots.acquire("b", 4.0, 0.0)  # b in use, a idle and least recently used
    slots.acquire("c", 5.0, 0.0)
    assert slots.held() == {"b", "c"} and slots.unloads == 1
    with pytest.raises(LookupError):
        slots.acquire("d", 6.0, 0.0)  # b and c both in use
    with pytest.raises(RuntimeError):
        slots.unload("b")


def test_step_factor_grows_with_the_batchs_highest_rank():
    assert step_factor([0, 0], 0.1) == 1.0
    assert step_factor([0, 16], 0.1) == pytest.approx(1.1)
    assert step_factor([8, 32], 0.1) == pytest.approx(1.2)
    assert step_factor([32], 0.0) == 1.0


def test_engine_steps_cost_more_with_an_adapter_in_the_batch():
    def first_step(rank: int) -> float:
        engine = Engine(get_profile("llama-8b-h100"))
        engine.lora_overhead = 0.1
        engine.add(EngineSeq("r", 512, 8, [], lora_rank=rank, adapter="a" if rank else None))
        return engine.plan(0.0, 1).duration(1)

    assert first_step(16) == pytest.approx(first_step(0) * 1.1)


def test_uniform_load_times_stay_in_range_and_repeat_per_seed():
    names = [f"a{i}" for i in range(50)]
    times = uniform_load_times(names, 0.5, 2.0, seed=3)
    assert all(0.5 <= t <= 2.0 for t in times.values()) and times == uniform_load_times(names, 0.5, 2.0, seed=3)


# -- discrete-event runner ---------------------------------------------------------------------------------------


class Pin:
    """A router that sends everything to one replica, recording what it saw."""

    name = "pin"

    def __init__(self, replica_id="r0"):
        self.replica_id, self.views = replica_id, []

    def pick(self, request, replicas, now):
        self.views.append({v.replica_id: v for v in replicas})
        return self.replica_id

    def on_routed(self, *a):
        pass

    def on_finished(self, *a):
        pass


def _request(i: int, at: float, adapter: str | None) -> SimRequest:
    return SimRequest(f"q{i}", at, ("word" * 200,), 16, adapter=adapter)


def test_the_first_request_for_an_adapter_waits_for_its_load_in_ttft():
    lora = LoraConfig(max_loras=2, load_s=lambda name: 1.5)
    sim = Simulation(router=Pin(), replicas=1, profile="llama-8b-h100", lora=lora)
    result = sim.run([_request(0, 0.0, "a"), _request(1, 5.0, "a"), _request(2, 10.0, None)])
    first, second, base = result.requests
    assert first.ttft_s > 1.5 and first.extra.get("adapter_load")
    assert second.ttft_s < 0.5 and not second.extra.get("adapter_load")  # resident: no load
    assert base.ttft_s < 0.5


def test_views_show_held_adapters_slots_and_active_ones():
    router = Pin()
    sim = Simulation(router=router, replicas=1, profile="llama-8b-h100", lora=LoraConfig(max_loras=3))
    sim.run([_request(0, 0.0, "a"), _request(1, 0.2, "b"), _request(2, 30.0, None)])
    seen: ReplicaView = router.views[1]["r0"]
    assert seen.adapters == {"a"} and seen.max_loras == 3
    assert router.views[2]["r0"].adapters == {"a", "b"} and router.views[2]["r0"].active_adapters == frozenset()


def test_requests_wait_for_a_slot_when_every_slot_is_in_use():
    lora = LoraConfig(max_loras=1, load_s=lambda name: 0.5)
    sim = Simulation(router=Pin(), replicas=1, profile="llama-8b-h100", lora=lora)
    a, b = SimRequest("qa", 0.0, ("word" * 200,), 200, adapter="a"), _request(1, 0.1, "b")
    result = sim.run([a, b])
    ra, rb = result.requests
    assert rb.extra.get("slot_wait") and rb.first_token_s > ra.finish_s  # b loaded only once a had finished
    assert all(r.status == "ok" for r in result.requests)


@pytest.mark.parametrize(("policy", "kept"), [("infercap", {"hot", "new"}), ("lora_affinity", {"rare", "new"})])
def test_a_full_replica_evicts_by_the_routers_rule_lru_for_the_baselines(policy, kept):
    # 'hot' asked 4 times, then 'rare' once, then 'new' on a replica of 2 slots: infercap's least popular idle
    # adapter ('rare') leaves; LRU, the rule of a router naming none (vLLM's), evicts 'hot'.
    router = make_router(policy, seed=1)
    sim = Simulation(router=router, replicas=1, profile="llama-8b-h100", lora=LoraConfig(max_loras=2))
    stream = [_request(i, float(i), "hot") for i in range(4)] + [_request(4, 10.0, "rare"), _request(5, 20.0, "new")]
    result = sim.run(stream)
    assert all(r.status == "ok" for r in result.requests)
    assert sim.replicas["r0"].slots.held() == kept


def test_slots_ask_their_injected_rule_at_the_limit():
    asked = []

    def rule(last_used, in_use, now):
        asked.append((dict(last_used), set(in_use), now))
        return "b"

    slots = AdapterSlots(max_loras=2, victim=rule)
    slots.acquire("a", 0.0, 0.0)
    slots.acquire("b", 1.0, 0.0)
    slots.release("b", 2.0)
    slots.acquire("c", 3.0, 0.0)
    assert slots.held() == {"a", "c"} and asked == [({"a": 0.0, "b": 2.0}, {"a"}, 3.0)]


def test_an_adapter_request_on_a_replica_without_slots_is_a_404():
    sim = Simulation(router=Pin(), replicas=1, profile="llama-8b-h100", lora=LoraConfig(max_loras=0))
    (only,) = sim.run([_request(0, 0.0, "a")]).requests
    assert only.status == "error" and "does not exist" in only.reason


# -- HTTP ------------------------------------------------------------------------------------------------------


@pytest.fixture
def lora_replica():
    with ThreadedReplica(get_profile("tiny"), speed=4.0, max_loras=2, max_lora_rank=16) as replica:
        yield replica


def _adapter_dir(tmp_path, name: str, rank: int = 8):
    path = tmp_path / name
    path.mkdir()
    (path / "adapter_config.json").write_text(json.dumps({"r": rank, "target_modules": ["q_proj", "v_proj"]}))
    return str(path)


def load(url, name, path, **extra):
    return httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path, **extra})


def test_load_serve_list_and_unload_as_vllm(lora_replica, tmp_path):
    url, path = lora_replica.url, _adapter_dir(tmp_path, "sql")
    reply = load(url, "sql", path)
    assert reply.status_code == 200 and reply.text == "Success: LoRA adapter 'sql' added successfully."
    cards = httpx.get(f"{url}/v1/models").json()["data"]
    assert [c["id"] for c in cards] == ["tiny", "sql"]
    assert cards[1]["parent"] == "tiny" and cards[1]["root"] == path and cards[1]["object"] == "model"
    chat = httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": "sql", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    )
    assert chat.status_code == 200 and chat.json()["model"] == "sql"
    reply = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "sql"})
    assert reply.status_code == 200 and reply.text == "Success: LoRA adapter 'sql' removed successfully."
    gone = httpx.post(f"{url}/v1/completions", json={"model": "sql", "prompt": "hi", "max_tokens": 2})
    assert gone.status_code == 404 and gone.json()["error"]["type"] == "NotFoundError"
    assert gone.json()["error"]["message"].startswith("The model `sql` does not exist.")


def test_load_and_unload_errors_have_vllms_status_and_message(lora_replica, tmp_path):
    url, path = lora_replica.url, _adapter_dir(tmp_path, "a")
    cases = [
        (load(url, "", path), 400, "Both 'lora_name' and 'lora_path' must be provided."),
        (load(url, "tiny", path), 400, "The lora adapter 'tiny' conflicts with a served base model."),
        (load(url, "x", str(tmp_path / "missing")), 404, f"No adapter found for {tmp_path / 'missing'}"),
        (load(url, "big", _adapter_dir(tmp_path, "big", rank=64)), 500, "LoRA rank 64 is greater than max_lora_rank"),
        (httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "nope"}), 404, "cannot be found"),
        (httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": ""}), 400, "'lora_name' needs to be"),
    ]
    for reply, status, text in cases:
        assert reply.status_code == status and text in reply.json()["error"]["message"], reply.text
        assert reply.json()["error"]["code"] == status
    assert load(url, "a", path).status_code == 200
    again = load(url, "a", path)
    assert again.status_code == 400 and "has already been loaded" in again.json()["error"]["message"]
    assert load(url, "a", path, load_inplace=True).status_code == 200
    missing_field = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "z"})
    # pydantic's error, as the replica's other endpoints report it (vLLM's request-validation handler)
    assert missing_field.status_code == 400 and "lora_path" in missing_field.json()["error"]["message"]


def test_a_load_at_the_slot_limit_unloads_the_least_recently_used_adapter(lora_replica, tmp_path):
    url = lora_replica.url
    for name in ("a", "b", "c"):
        assert load(url, name, _adapter_dir(tmp_path, name)).status_code == 200
    ids = [c["id"] for c in httpx.get(f"{url}/v1/models").json()["data"]]
    assert ids == ["tiny", "b", "c"]


def test_lora_requests_info_lists_running_adapters_with_a_timestamp(lora_replica, tmp_path):
    url = lora_replica.url
    load(url, "a", _adapter_dir(tmp_path, "a"))
    httpx.post(f"{url}/v1/completions", json={"model": "a", "prompt": "hi", "max_tokens": 2})
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(f"{url}/metrics").text)}
    samples = families["vllm:lora_requests_info"].samples
    assert {tuple(sorted(s.labels)) for s in samples} == {
        ("max_lora", "running_lora_adapters", "waiting_lora_adapters")
    }
    newest = max(samples, key=lambda s: s.value)
    assert newest.labels["max_lora"] == "2" and newest.value > 1.6e9


def test_a_replica_without_slots_has_no_lora_routes_or_gauge():
    with ThreadedReplica(get_profile("tiny"), speed=4.0) as replica:
        reply = httpx.post(f"{replica.url}/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": "/tmp"})
        assert reply.status_code == 404 and reply.json() == {"detail": "Not Found"}
        assert "vllm:lora_requests_info" not in httpx.get(f"{replica.url}/metrics").text
