"""Prefill and decode replicas are launched with the endpoint's KV connector (``--kv-transfer-config``), which the
platform sets from the replica's role and the endpoint's ``kv_connector``, never a launch option
(docs/disaggregation.md); the local actuator records the role and starts real processes that hand the KV over."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from django.conf import settings

from capacity.autoscaling.actuators.base import kv_storage_dir
from capacity.autoscaling.actuators.local import LocalActuator, replica_argv, replica_env
from capacity.autoscaling.services import pool_endpoint
from capacity.models import HardwareProfile
from capacity.runtimes.launch_options import tenant_launch_option_errors
from capacity.runtimes.vllm import kv_transfer_config, kv_transfer_env, serve_command
from endpoints.models import Endpoint, ReplicaRole, ReplicaState, Runtime, ServingMode
from endpoints.validation import launch_option_errors
from simulator.cli import build_server
from simulator.tokens import filler_text
from tests.proxy.helpers import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def config_of(argv: list[str]) -> dict | None:
    if "--kv-transfer-config" not in argv:
        return None
    assert argv.count("--kv-transfer-config") == 1
    return json.loads(argv[argv.index("--kv-transfer-config") + 1])


def test_each_role_gets_its_connector():
    assert kv_transfer_config("mixed", "shared_storage", storage_path="/d") is None
    shared = kv_transfer_config("prefill", "shared_storage", storage_path="/d")
    assert json.loads(shared) == {
        "kv_connector": "InfercapSharedStorageConnector",  # vLLM's ExampleConnector, keyed by cache_salt too
        "kv_connector_module_path": "infercap_kv_connector",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": "/d"},
        "kv_load_failure_policy": "recompute",  # not vLLM's "fail": the client would get the error
    }
    # the engine imports it from the plugins directory, and from nothing else of the repository
    plugins = Path(kv_transfer_env(shared)["PYTHONPATH"])
    assert [p.name for p in plugins.iterdir() if p.suffix == ".py"] == ["infercap_kv_connector.py"]
    assert kv_transfer_env(kv_transfer_config("prefill", "nixl")) == {} == kv_transfer_env(None)
    assert json.loads(kv_transfer_config("decode", "shared_storage", storage_path="/d"))["kv_role"] == "kv_consumer"
    for role in ("prefill", "decode"):
        nixl = {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_load_failure_policy": "recompute"}
        assert json.loads(kv_transfer_config(role, "nixl")) == nixl
    for bad in (("both", "nixl", "/d"), ("prefill", "lmcache", "/d"), ("prefill", "shared_storage", None)):
        with pytest.raises(ValueError):
            kv_transfer_config(bad[0], bad[1], storage_path=bad[2])


def test_serve_command_adds_it_once_and_refuses_a_second():
    flag = kv_transfer_config("decode", "nixl")
    assert config_of(serve_command(model="m", port=8000, kv_transfer_config=flag))["kv_connector"] == "NixlConnector"
    assert config_of(serve_command(model="m", port=8000)) is None
    with pytest.raises(ValueError, match="the platform sets it"):
        serve_command(model="m", port=8000, kv_transfer_config=flag, extra_args=["--kv-transfer-config", "{}"])


def test_no_launch_option_carries_it():
    message = "kv_transfer_config is set by the platform from the replica's role and the endpoint's kv_connector"
    assert tenant_launch_option_errors({"kv_transfer_config": "{}"}) == [message]
    assert message in launch_option_errors({"kv_transfer_config": "{}"}, runtime="vllm")  # operators neither
    assert tenant_launch_option_errors({"max_num_seqs": 8}) == []


def disaggregated(endpoint, *, runtime=Runtime.SIM, connector="shared_storage", **prefill_options) -> Endpoint:
    Endpoint.objects.filter(pk=endpoint.pk).update(
        runtime=runtime,
        serving_mode=ServingMode.DISAGGREGATED,
        kv_connector=connector,
        launch_options={"actuator": "local", "profile": "tiny", "profile_opts": {"block_size": 128}},
        prefill_launch_options={"profile": "tiny", "profile_opts": {"block_size": 128}, **prefill_options},
    )
    return Endpoint.objects.get(pk=endpoint.pk)


def test_the_local_actuators_command_lines_by_role(tenant_a):
    endpoint = disaggregated(tenant_a.endpoint, runtime=Runtime.VLLM, max_num_seqs=4)
    shared = str(Path(settings.VAR_DIR) / "kv" / f"endpoint-{endpoint.pk}")
    prefill = replica_argv(pool_endpoint(endpoint, None, role=ReplicaRole.PREFILL), port=8001)
    decode = replica_argv(pool_endpoint(endpoint, None, role=ReplicaRole.DECODE), port=8002)
    assert config_of(prefill)["kv_role"] == "kv_producer" and config_of(decode)["kv_role"] == "kv_consumer"
    assert config_of(prefill)["kv_connector_extra_config"] == {"shared_storage_path": shared}
    assert Path(shared).is_dir()
    assert replica_env(pool_endpoint(endpoint, None, role=ReplicaRole.DECODE))["PYTHONPATH"].endswith("engine_plugins")
    assert "PYTHONPATH" not in replica_env(pool_endpoint(endpoint, None, role=ReplicaRole.MIXED))
    assert prefill[prefill.index("--max-num-seqs") + 1] == "4"  # the prefill pool's own options
    assert "--max-num-seqs" not in decode
    assert config_of(replica_argv(pool_endpoint(endpoint, None, role=ReplicaRole.MIXED), port=8003)) is None
    nixl = disaggregated(endpoint, runtime=Runtime.VLLM, connector="nixl")
    assert config_of(replica_argv(pool_endpoint(nixl, None, role=ReplicaRole.PREFILL), port=8004))["kv_role"] == (
        "kv_both"
    )


def test_a_simulated_role_replica_moves_its_kv_at_the_hardwares_link(tenant_a):
    endpoint = disaggregated(tenant_a.endpoint)
    HardwareProfile.objects.filter(pk=endpoint.hardware_profile_id).update(kv_link_gbps=100.0)
    decode = pool_endpoint(endpoint, None, role=ReplicaRole.DECODE)
    assert "--kv-link-gbps" not in replica_argv(decode, port=8001)  # the tiny profile names no model shape
    decode.launch_options = {**decode.launch_options, "profile": "llama-13b-a100"}
    argv = replica_argv(decode, port=8001)
    assert argv[argv.index("--kv-link-gbps") + 1] == "100.0"
    assert "--kv-link-gbps" not in replica_argv(pool_endpoint(endpoint, None, role=ReplicaRole.MIXED), port=8002)
    opts = {"profile": "llama-13b-a100", "profile_opt": [], "fault": [], "speed": 1.0, "served_model_name": None}
    opts |= {"scheduling_policy": "priority", "kv_link_gbps": 100.0}
    assert build_server(opts).kv_bytes_per_token == 163_840  # the 13B model's K and V of a token (profiles.py)
    with pytest.raises(ValueError, match="names no model shape"):
        build_server(opts | {"profile": "tiny"})


@pytest.mark.e2e  # two replica processes
def test_a_local_prefill_replica_hands_its_kv_to_a_local_decode_replica(tenant_a, reap_local_replicas):
    endpoint = disaggregated(tenant_a.endpoint)
    actuator = LocalActuator()
    (prefill,) = actuator.launch(pool_endpoint(endpoint, None, role=ReplicaRole.PREFILL), 1)
    (decode,) = actuator.launch(pool_endpoint(endpoint, None, role=ReplicaRole.DECODE), 1)
    assert (prefill.role, decode.role) == (ReplicaRole.PREFILL, ReplicaRole.DECODE)

    def both_ready():
        actuator.sync(endpoint)
        return all(r.state == ReplicaState.READY for r in endpoint.replicas.filter(pk__in=[prefill.pk, decode.pk]))

    wait_for(both_ready, 30)
    body = {"model": endpoint.name, "messages": [{"role": "user", "content": filler_text(600, seed="launch")}]}
    first = httpx.post(f"{prefill.url}/v1/chat/completions", json=body | {"max_tokens": 1}, timeout=30).json()
    assert any(kv_storage_dir(endpoint).iterdir())  # the prompt's KV, left where the decode replica looks
    second = httpx.post(f"{decode.url}/v1/chat/completions", json=body | {"max_tokens": 4}, timeout=30).json()
    n = first["usage"]["prompt_tokens"]
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == (n - 2) // 128 * 128 > 0

    # a restarted decode replica comes back a decode replica, with the same connector
    (again,) = actuator.restart(decode)
    assert again.role == ReplicaRole.DECODE and again.pk != decode.pk
    cmdline = Path(f"/proc/{again.actuator_ref}/cmdline").read_bytes().split(b"\0")
    assert config_of([a.decode() for a in cmdline if a])["kv_role"] == "kv_consumer"
