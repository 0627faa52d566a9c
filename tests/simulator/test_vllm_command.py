"""The ``vllm serve`` command line built for an endpoint (not run in CI)."""

import shutil

import pytest

from capacity.runtimes.vllm import serve_command, serve_command_line


def test_serve_command_carries_the_platform_flags():
    argv = serve_command(
        model="meta-llama/Llama-2-13b-hf",
        port=8001,
        served_model_name="chat-13b",
        max_num_seqs=64,
        gpu_memory_utilization=0.9,
        tensor_parallel_size=2,
    )
    assert argv[:3] == ["vllm", "serve", "meta-llama/Llama-2-13b-hf"]
    joined = " ".join(argv)
    for flag in (
        "--port 8001",
        "--served-model-name chat-13b",
        "--max-num-seqs 64",
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--scheduling-policy priority",
        "--gpu-memory-utilization 0.9",
        "--tensor-parallel-size 2",
    ):
        assert flag in joined
    assert "--max-model-len" not in joined
    assert serve_command_line(model="m with space", port=1).startswith("vllm serve 'm with space'")


@pytest.mark.parametrize(
    "bad",
    [
        {"model": "", "port": 1},
        {"model": "m", "port": 70000},
        {"model": "m", "port": 1, "scheduling_policy": "lifo"},
        {"model": "m", "port": 1, "gpu_memory_utilization": 1.5},
        {"model": "m", "port": 1, "max_num_seqs": 0},
    ],
)
def test_bad_options_are_refused(bad):
    with pytest.raises(ValueError):
        serve_command(**bad)


@pytest.mark.skipif(shutil.which("vllm") is not None, reason="vllm is installed: the command would exec it")
def test_run_replica_vllm_without_vllm_installed_is_a_clear_error():
    from django.core.management import call_command
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="not installed|needs --model"):
        call_command("run_replica", "--runtime", "vllm", "--model", "m", "--port", "8001")
    with pytest.raises(CommandError, match="needs --model"):
        call_command("run_replica", "--runtime", "vllm")
