"""The simulated replica's KV connectors (simulator/kv_transfer.py): a prefill on one replica, its decode on another,
with what the real engine reports (tests/engine/test_pd_real_engine.py checks the same against vLLM)."""

import asyncio
import json
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from capacity.hardware.profiles import get_profile
from simulator.cli import build_server
from simulator.kv_transfer import KV_FILE, Link, lookup_tokens, parse_kv_transfer_config, prefix_key, store_tokens
from simulator.protocol import Prompt
from simulator.server import ThreadedReplica
from simulator.tokens import filler_text, render_chat
from tests.waiting import wait_for

BLOCK = 128  # the CPU engine's block size


def profile():
    return get_profile("tiny", block_size=BLOCK, num_gpu_blocks=64, prefill_tokens_per_s=4000.0)


def shared(tmp_path, role: str) -> dict:
    config = {"kv_connector": "ExampleConnector", "kv_role": role}
    return config | {"kv_connector_extra_config": {"shared_storage_path": str(tmp_path)}}


def counters(url: str) -> dict:
    found = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for sample in family.samples:
            source = sample.labels.get("source")
            found[sample.name + (f"[{source}]" if source else "")] = sample.value
    return found


def rendered(text: str) -> str:
    return render_chat([{"role": "user", "content": text}])


def chat(url: str, text: str, **extra) -> dict:
    body = {"messages": [{"role": "user", "content": text}], "temperature": 0, **extra}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture
def pair(tmp_path):
    producer = ThreadedReplica(
        profile(), kv_transfer=parse_kv_transfer_config(json.dumps(shared(tmp_path, "kv_producer")))
    )
    consumer = ThreadedReplica(
        profile(), kv_transfer=parse_kv_transfer_config(json.dumps(shared(tmp_path, "kv_consumer")))
    )
    with producer, consumer:
        yield producer, consumer


def test_the_consumer_loads_what_the_producer_stored_and_skips_its_prefill(pair, tmp_path):
    producer, consumer = pair
    text = filler_text(700, seed="pd")
    prefill = chat(producer.url, text, max_tokens=1)
    n = prefill["usage"]["prompt_tokens"]
    assert prefill["usage"]["completion_tokens"] == 1
    assert prefill["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert prefill["kv_transfer_params"] is None  # ExampleConnector says nothing in the response
    folders = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert len(folders) == 1 and (folders[0] / KV_FILE).is_file()
    assert json.loads((folders[0] / KV_FILE).read_text())["tokens"] == store_tokens(n, BLOCK)
    assert folders[0].name == prefix_key(Prompt(rendered(text), n), store_tokens(n, BLOCK))
    produced = counters(producer.url)

    decode = chat(consumer.url, text, max_tokens=8)
    hit = lookup_tokens(n, BLOCK)
    assert hit == (n - 2) // BLOCK * BLOCK > 0
    assert decode["usage"]["prompt_tokens_details"] == {
        "cached_tokens": hit,
        "created_cache_tokens": n // BLOCK * BLOCK - hit,
        "multimodal_tokens": None,
    }
    assert (
        decode["choices"][0]["message"]["content"]
        == chat(producer.url, text, max_tokens=8)["choices"][0]["message"]["content"]
    )
    seen = counters(consumer.url)
    assert seen["vllm:external_prefix_cache_queries_total"] == n
    assert seen["vllm:external_prefix_cache_hits_total"] == hit
    assert seen["vllm:prefix_cache_hits_total"] == 0
    assert seen["vllm:prompt_tokens_by_source_total[external_kv_transfer]"] == hit
    assert seen["vllm:prompt_tokens_by_source_total[local_compute]"] == n - hit
    assert seen["vllm:prompt_tokens_cached_by_source_total[external_unspecified]"] == hit
    assert seen["vllm:prompt_tokens_cached_total"] == hit
    # the loaded tokens cost no prefill time: the consumer computed n - hit tokens where the producer computed n
    assert seen["vllm:request_prefill_time_seconds_sum"] < 0.5 * produced["vllm:request_prefill_time_seconds_sum"]
    assert produced["vllm:external_prefix_cache_hits_total"] == 0


def test_a_miss_is_computed_and_stored_by_either_role_and_short_prompts_never_hit(pair, tmp_path):
    producer, consumer = pair
    text = filler_text(400, seed="miss")
    first = chat(consumer.url, text, max_tokens=2)
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert len(list(tmp_path.iterdir())) == 1  # vLLM's ExampleConnector stores whatever kv_role says
    again = chat(producer.url, text, max_tokens=2)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == lookup_tokens(
        first["usage"]["prompt_tokens"], BLOCK
    )
    short = filler_text(60, seed="short")
    chat(producer.url, short, max_tokens=1)
    assert chat(consumer.url, short, max_tokens=2)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert counters(consumer.url)["vllm:external_prefix_cache_hits_total"] == 0


def test_block_alignment_is_the_engines():
    assert [lookup_tokens(n, 128) for n in (1, 129, 130, 1010, 524)] == [0, 0, 128, 896, 512]
    assert [store_tokens(n, 128) for n in (1, 129, 130, 1010, 524)] == [0, 128, 128, 896, 512]


def nixl(policy: str = "fail") -> str:
    return json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_load_failure_policy": policy})


def test_nixl_prefill_names_its_blocks_and_the_decode_pulls_them_once():
    with (
        ThreadedReplica(profile(), kv_transfer=parse_kv_transfer_config(nixl())) as prefill,
        ThreadedReplica(profile(), kv_transfer=parse_kv_transfer_config(nixl())) as decode,
        ThreadedReplica(profile(), kv_transfer=parse_kv_transfer_config(nixl("recompute"))) as lenient,
    ):
        text = filler_text(500, seed="nixl")
        first = chat(prefill.url, text, max_tokens=1, kv_transfer_params={"do_remote_decode": True})
        params = first["kv_transfer_params"]
        n = first["usage"]["prompt_tokens"]
        assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
        assert params["remote_port"] == int(prefill.url.rsplit(":", 1)[1]) and params["remote_num_tokens"] == n
        assert {"remote_block_ids", "remote_engine_id", "remote_request_id", "tp_size"} <= set(params)
        # a plain request on the same replica says nothing
        assert chat(prefill.url, text, max_tokens=1)["kv_transfer_params"] is None

        # the prompt's blocks wait for the pull in the prefill replica's KV cache, and are freed by it
        assert prefill.call(lambda: prefill.server.engine.kv.usage) == pytest.approx(-(-n // BLOCK) / 64)
        answer = chat(decode.url, text, max_tokens=4, kv_transfer_params=params)
        assert prefill.call(lambda: prefill.server.engine.kv.usage) == 0.0
        assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == (n - 1) // BLOCK * BLOCK
        assert counters(decode.url)["vllm:external_prefix_cache_hits_total"] == (n - 1) // BLOCK * BLOCK

        # pulled once: the lease is gone; "fail" fails the request, "recompute" computes it here
        failed = httpx.post(
            f"{decode.url}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": text + " more"}], "kv_transfer_params": params},
        )
        assert failed.status_code == 500 and "KV transfer" in failed.json()["error"]["message"]
        recomputed = chat(lenient.url, text + " more", max_tokens=2, kv_transfer_params=params)
        assert recomputed["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


@pytest.mark.parametrize(
    "text, problem",
    [
        ("{", "not JSON"),
        ('{"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}', "kv_connector"),
        ('{"kv_connector": "ExampleConnector", "kv_role": "producer"}', "kv_role"),
        ('{"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_load_failure_policy": "x"}', "policy"),
    ],
)
def test_a_bad_config_says_what_is_wrong(text, problem):
    with pytest.raises(ValueError, match=problem):
        parse_kv_transfer_config(text)


def test_the_command_line_takes_vllms_flag(tmp_path):
    opts = {
        "profile": "tiny",
        "profile_opt": [],
        "fault": [],
        "speed": 1.0,
        "served_model_name": None,
        "scheduling_policy": "priority",
        "kv_transfer_config": json.dumps(shared(tmp_path, "kv_consumer")),
    }
    server = build_server(opts)
    assert server.kv_connector.config.role == "kv_consumer"
    assert server.kv_connector.config.shared_storage_path == str(tmp_path)
    assert build_server(opts | {"kv_transfer_config": None}).kv_connector is None


def test_a_replica_process_takes_the_config(tmp_path):
    from simulator.process import start_replica

    config = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    with start_replica(profile="tiny", kv_transfer_config=config) as replica:
        prefill = chat(replica.url, filler_text(200), max_tokens=1, kv_transfer_params={"do_remote_decode": True})
        assert prefill["kv_transfer_params"]["remote_port"] == replica.port


async def test_a_link_shares_its_bandwidth_among_the_transfers_in_flight():
    loop = asyncio.get_running_loop()
    start = loop.time()
    # 1 GB per simulated second, twice as fast as the wall clock: a loaded machine's late timer (tens of ms) stays
    # well inside the tolerances (at 10x a 50 ms delay read as half a simulated second)
    link = Link(8.0, clock=lambda: (loop.time() - start) * 2, speed=2)

    async def took(nbytes: float) -> float:
        began = loop.time()
        await link.transfer(nbytes)
        return (loop.time() - began) * 2  # simulated seconds

    alone = await took(1e9)
    both = await asyncio.gather(took(1e9), took(1e9))
    small_first = await asyncio.gather(took(1e9), took(0.5e9))
    assert alone == pytest.approx(1.0, abs=0.15)
    assert both == [pytest.approx(2.0, abs=0.2)] * 2  # half the bandwidth each
    assert small_first == [pytest.approx(1.5, abs=0.2), pytest.approx(1.0, abs=0.2)]
    assert link.transfers == 5 and not link.active


def test_a_nixl_pull_crosses_the_prefill_replicas_link():
    config = parse_kv_transfer_config(nixl())
    link = {"kv_link_gbps": 8.0, "kv_bytes_per_token": 2e6}  # a 500-token prompt: 1 GB, one simulated second
    with (
        ThreadedReplica(profile(), speed=5.0, kv_transfer=config, **link) as prefill,
        ThreadedReplica(profile(), speed=5.0, kv_transfer=config) as decode,
    ):
        text = filler_text(500, seed="link")
        params = chat(prefill.url, text, max_tokens=1, kv_transfer_params={"do_remote_decode": True})[
            "kv_transfer_params"
        ]
        began = time.monotonic()
        chat(decode.url, text, max_tokens=1, kv_transfer_params=params)
        waited = (time.monotonic() - began) * 5.0
        moved = params["remote_num_tokens"] * 2e6 / 1e9
        assert moved <= waited < moved + 3.0, (moved, waited)  # the transfer, then a short prefill (a busy host)
        assert prefill.server.kv_link.transfers == 1


def test_a_folder_without_its_kv_stops_the_replica_as_it_stops_the_engine(pair, tmp_path):
    producer, consumer = pair
    text = filler_text(500, seed="half")
    chat(producer.url, text, max_tokens=1)
    [folder] = [p for p in tmp_path.iterdir() if p.is_dir()]
    (folder / KV_FILE).unlink()  # as a prefill engine killed between two layer files leaves it
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": 2}
    failed = httpx.post(f"{consumer.url}/v1/chat/completions", json=body, timeout=10)
    assert failed.status_code == 500 and "EngineCore" in failed.json()["error"]["message"]
    assert wait_for(lambda: consumer.server.crashed, 5)


def test_the_platforms_connector_keys_by_cache_salt_where_vllms_example_does_not(tmp_path):
    def replicas(connector: str, path):
        config = {
            "kv_connector": connector,
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"shared_storage_path": str(path)},
        }
        parsed = parse_kv_transfer_config(json.dumps(config))
        return ThreadedReplica(profile(), kv_transfer=parsed), ThreadedReplica(profile(), kv_transfer=parsed)

    text = filler_text(500, seed="salt")
    for connector, other_tenant_hits in (("ExampleConnector", True), ("InfercapSharedStorageConnector", False)):
        producer, consumer = replicas(connector, tmp_path / connector)
        with producer, consumer:
            chat(producer.url, text, max_tokens=1, cache_salt="tenant-a")
            other = chat(consumer.url, text, max_tokens=1, cache_salt="tenant-b")
            assert (other["usage"]["prompt_tokens_details"]["cached_tokens"] > 0) is other_tenant_hits, connector
            same = chat(consumer.url, text, max_tokens=1, cache_salt="tenant-a")
            assert same["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
