"""The real-vLLM runtime: the ``vllm serve`` command line for an endpoint's options (used by actuators; not in CI).

Flags follow VLLM_CONTRACT.md: prefix caching on, prompt-token details on (else ``cached_tokens`` is absent),
priority scheduling (the platform sends ``priority``), request-id headers echoed, and the served model name
set to the endpoint name so the proxy can pass ``model`` through unchanged.
"""

from __future__ import annotations

import shlex

from endpoints.runtimes.launch_env import launch_env


def serve_command(
    *,
    model: str,
    port: int,
    host: str = "0.0.0.0",
    served_model_name: str | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    max_model_len: int | None = None,
    gpu_memory_utilization: float | None = None,
    tensor_parallel_size: int | None = None,
    scheduling_policy: str = "priority",
    enable_prefix_caching: bool = True,
    block_size: int | None = None,
    dtype: str | None = None,
    extra_args: list[str] | None = None,
    executable: str = "vllm",
) -> list[str]:
    """argv for ``vllm serve``; raises ValueError on options vLLM would refuse."""
    if not model:
        raise ValueError("model is required")
    if not 0 < int(port) < 65536:
        raise ValueError(f"port out of range: {port}")
    if scheduling_policy not in ("fcfs", "priority"):
        raise ValueError("scheduling_policy must be 'fcfs' or 'priority'")
    if gpu_memory_utilization is not None and not 0 < gpu_memory_utilization <= 1:
        raise ValueError("gpu_memory_utilization must be in (0, 1]")
    for name, value in (
        ("max_num_seqs", max_num_seqs),
        ("max_num_batched_tokens", max_num_batched_tokens),
        ("max_model_len", max_model_len),
        ("tensor_parallel_size", tensor_parallel_size),
        ("block_size", block_size),
    ):
        if value is not None and int(value) < 1:
            raise ValueError(f"{name} must be a positive integer")
    argv = [executable, "serve", model, "--host", host, "--port", str(int(port))]
    if served_model_name:
        argv += ["--served-model-name", served_model_name]
    argv += ["--enable-prefix-caching" if enable_prefix_caching else "--no-enable-prefix-caching"]
    argv += ["--enable-prompt-tokens-details", "--enable-request-id-headers"]
    argv += ["--scheduling-policy", scheduling_policy]
    for flag, value in (
        ("--max-num-seqs", max_num_seqs),
        ("--max-num-batched-tokens", max_num_batched_tokens),
        ("--max-model-len", max_model_len),
        ("--gpu-memory-utilization", gpu_memory_utilization),
        ("--tensor-parallel-size", tensor_parallel_size),
        ("--block-size", block_size),
        ("--dtype", dtype),
    ):
        if value is not None:
            argv += [flag, str(value)]
    return argv + list(extra_args or [])


def serve_command_line(**options) -> str:
    return shlex.join(serve_command(**options))


def serve_env(launch_options: dict | None = None, **host) -> dict[str, str]:
    """Environment for ``vllm serve``: thread pools sized from the replica's CPU allotment (``cpus``), split among
    its tensor-parallel workers; see ``endpoints.runtimes.launch_env``. ``host`` overrides affinity/quota (tests)."""
    return launch_env(launch_options, runtime="vllm", **host)
