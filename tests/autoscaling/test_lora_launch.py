"""An endpoint with LoRA slots launches vLLM with them and lets the proxy load adapters at run time (docs/lora-serving.md)."""

import pytest

from capacity.autoscaling.actuators.local import replica_argv, replica_env
from capacity.runtimes import vllm
from tests.factories import EndpointFactory


@pytest.mark.django_db
def test_lora_options_reach_the_vllm_command_line_and_environment():
    endpoint = EndpointFactory(runtime="vllm", launch_options={"max_loras": 3, "max_lora_rank": 32})
    argv = replica_argv(endpoint, port=8123)
    assert argv[argv.index("--enable-lora") + 1 : argv.index("--enable-lora") + 5] == [
        "--max-loras", "3", "--max-lora-rank", "32",
    ]  # fmt: skip
    assert replica_env(endpoint)["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert endpoint.lora == (3, 32)


@pytest.mark.django_db
def test_without_slots_there_is_no_lora():
    endpoint = EndpointFactory(runtime="vllm", launch_options={"max_loras": 0, "max_lora_rank": 32})
    assert "--enable-lora" not in replica_argv(endpoint, port=8123)
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in replica_env(endpoint)
    assert endpoint.lora == (0, 0)


def test_rank_defaults_to_vllms():
    argv = vllm.serve_command(model="m", port=8000, max_loras=2)
    assert argv[argv.index("--max-lora-rank") + 1] == "16"


@pytest.mark.django_db
def test_simulated_replicas_get_the_same_slots_and_rank():
    endpoint = EndpointFactory(runtime="sim", launch_options={"max_loras": 4, "max_lora_rank": 8, "lora_load_s": 0.5})
    argv = replica_argv(endpoint, port=8123)
    assert argv[argv.index("--max-loras") :][:6] == [
        "--max-loras",
        "4",
        "--max-lora-rank",
        "8",
        "--lora-load-s",
        "0.5",
    ]
    assert "--max-loras" not in replica_argv(EndpointFactory(runtime="sim", launch_options={}), port=8123)
