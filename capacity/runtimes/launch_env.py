"""A replica's launch environment: CPU thread counts from the replica's CPU allotment, never the host's core count.

OpenMP, MKL, OpenBLAS, numexpr and PyTorch size their thread pools from the machine's core count unless told
otherwise, so a replica given 12 cores on a 192-vCPU host starts 192 threads per pool and spends its time in
contention (Databricks measured 3x more completed requests per second after fixing exactly this). The launcher
sets the pools from the allotment:

- ``cpus`` (or ``cpu_allotment``) in the launch options, a number or a Kubernetes quantity (``"12"``, ``"1500m"``);
  else ``resources.limits.cpu`` / ``resources.requests.cpu`` as in a pod spec;
- else what this process may actually use: its CPU affinity and its cgroup CPU quota (``cpu.max``).

vLLM runs one worker process per tensor-parallel rank; each gets its share, so ``tensor_parallel_size`` divides the
allotment. vLLM's CPU backend binds its OpenMP threads to ``VLLM_CPU_OMP_THREADS_BIND`` (CPU ids such as
``0-11``); it is set when the launch options name a ``cpuset``, else to ``nobind`` for a local replica (its own
default binds to cores that the other processes of a shared host also use). ``vllm_engine_env`` adds vLLM's own
variables for a replica the platform starts: no usage stats, offline unless ``offline: false``, and
``cpu_kvcache_gib`` as the CPU backend's KV-cache reservation. No Django import: the actuators, the simulator's
process starter and the Kubernetes pod patch all call this.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

from capacity.runtimes.launch_options import lora_settings

# Thread-pool sizes read at import by the numeric libraries a vLLM (or simulated) replica loads; PyTorch's
# intra-op pool follows OMP_NUM_THREADS, Hugging Face tokenizers' Rust pool follows RAYON_NUM_THREADS.
THREAD_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "NUMEXPR_MAX_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "BLIS_NUM_THREADS",
    "RAYON_NUM_THREADS",
)
ALLOTMENT_KEYS = ("cpus", "cpu_allotment")
_QUANTITY = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*(m?)\s*$")
_CPUSET = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")


def parse_cpu_quantity(value) -> float:
    """CPUs from a number or a Kubernetes CPU quantity ("12", "1.5", "1500m"); ValueError if not a positive amount."""
    if isinstance(value, bool):
        raise ValueError(f"not a CPU amount: {value!r}")
    if isinstance(value, int | float):
        cpus = float(value)
    elif isinstance(value, str) and (match := _QUANTITY.match(value)):
        cpus = float(match.group(1)) / (1000.0 if match.group(2) else 1.0)
    else:
        raise ValueError(f"not a CPU amount: {value!r} (use a number of cores, or millicores such as '1500m')")
    if not math.isfinite(cpus) or cpus <= 0:
        raise ValueError(f"CPU allotment must be positive, got {value!r}")
    return cpus


def cpu_allotment(launch_options: dict | None) -> float | None:
    """The replica's CPU allotment from its launch options, or None when they name none."""
    options = launch_options or {}
    for key in ALLOTMENT_KEYS:
        if options.get(key) is not None:
            return parse_cpu_quantity(options[key])
    resources = options.get("resources")
    if isinstance(resources, dict):
        # A limit is what the container can use; a request alone is still the share it was sized for.
        for kind in ("limits", "requests"):
            section = resources.get(kind)
            if isinstance(section, dict) and section.get("cpu") is not None:
                return parse_cpu_quantity(section["cpu"])
    return None


def cgroup_cpu_quota(cgroup_root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs allowed by this process's cgroup v2 quota (``cpu.max``: "<quota> <period>" or "max ..."), if any."""
    try:
        quota, period = (cgroup_root / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    try:
        return int(quota) / int(period)
    except (ValueError, ZeroDivisionError):
        return None


def usable_cpus(*, affinity: set[int] | None = None, quota: float | None = None) -> float:
    """What this process may actually run on: its CPU affinity, capped by the cgroup quota.

    The host's core count (``os.cpu_count``) is the last resort, only where neither affinity nor quota is known.
    """
    if affinity is None and hasattr(os, "sched_getaffinity"):
        affinity = os.sched_getaffinity(0)
    if quota is None:
        quota = cgroup_cpu_quota()
    cpus = float(len(affinity)) if affinity else float(os.cpu_count() or 1)
    return min(cpus, quota) if quota else cpus


def thread_count(cpus: float, *, processes: int = 1) -> int:
    """Threads per pool for each of ``processes`` processes sharing ``cpus``: whole cores, at least one."""
    if processes < 1:
        raise ValueError("processes must be at least 1")
    return max(1, math.floor(cpus / processes + 1e-9))


def thread_env(threads: int, *, cpuset: str | None = None) -> dict[str, str]:
    """Environment variables sizing every thread pool to ``threads``."""
    if threads < 1:
        raise ValueError("threads must be at least 1")
    env = {name: str(threads) for name in THREAD_VARS}
    # One core: the tokenizer's pool would only contend with the server's own thread.
    env["TOKENIZERS_PARALLELISM"] = "true" if threads > 1 else "false"
    if cpuset:
        if not _CPUSET.match(cpuset.replace(" ", "")):
            raise ValueError(f"cpuset must look like '0-11' or '0,2,4-7', got {cpuset!r}")
        env["VLLM_CPU_OMP_THREADS_BIND"] = cpuset.replace(" ", "")
    return env


def launch_env(
    launch_options: dict | None,
    *,
    runtime: str = "sim",
    affinity: set[int] | None = None,
    quota: float | None = None,
) -> dict[str, str]:
    """The thread environment for one replica: its allotment (or, without one, what this process may use), shared
    among vLLM's tensor-parallel workers. ValueError on a bad allotment, cpuset or tensor_parallel_size."""
    options = launch_options or {}
    cpus = cpu_allotment(options)
    if cpus is None:
        cpus = usable_cpus(affinity=affinity, quota=quota)
    processes = 1
    if runtime == "vllm" and options.get("tensor_parallel_size") is not None:
        processes = int(options["tensor_parallel_size"])
        if processes < 1:
            raise ValueError("tensor_parallel_size must be a positive integer")
    cpuset = options.get("cpuset")
    if cpuset is not None and not isinstance(cpuset, str):
        raise ValueError("cpuset must be a string such as '0-11'")
    env = thread_env(thread_count(cpus, processes=processes), cpuset=cpuset)
    if runtime == "vllm":
        vllm_engine_env(options)  # its values are checked here too, so a bad one is refused before any launch
    env["INFERCAP_CPU_ALLOTMENT"] = f"{cpus:g}"
    return env


def vllm_engine_env(launch_options: dict | None) -> dict[str, str]:
    """vLLM's own variables for a replica the platform starts: never phone home, never ask a model hub (unless the
    operator set ``offline: false``), the CPU backend's thread binding and KV-cache size (GPU builds ignore both).
    ValueError on a bad ``cpu_kvcache_gib`` or ``offline``."""
    options = launch_options or {}
    env = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    if options.get("cpuset") is None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    gib = options.get("cpu_kvcache_gib")
    if gib is not None:
        if isinstance(gib, bool) or not isinstance(gib, int | float) or not math.isfinite(gib) or gib <= 0:
            raise ValueError(f"cpu_kvcache_gib must be a positive number of GiB, got {gib!r}")
        env["VLLM_CPU_KVCACHE_SPACE"] = f"{gib:g}"
    if lora_settings(options)[0]:
        # The proxy loads and unloads LoRA adapters through the engine's API (docs/lora-serving.md).
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    offline = options.get("offline", True)
    if not isinstance(offline, bool):
        raise ValueError(f"offline must be true or false, got {offline!r}")
    if offline:
        # A replica serves what the operator put on disk (or in the local hub cache); a hub download at start-up
        # would make its cold start depend on the network and on whatever the hub serves that day.
        env |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return env


def kubernetes_container_patch(
    launch_options: dict | None, *, container: str = "vllm", runtime: str = "vllm"
) -> dict | None:
    """Strategic-merge patch for a replica Deployment's container: CPU request and limit = the allotment, and
    the thread variables set to match. None when the launch options name no allotment (the template's own
    ``resourceFieldRef`` entries then follow whatever limit it sets)."""
    options = launch_options or {}
    cpus = cpu_allotment(options)
    if cpus is None:
        return None
    quantity = f"{round(cpus * 1000)}m"
    env = launch_env(options, runtime=runtime)
    env.pop("INFERCAP_CPU_ALLOTMENT", None)
    return {
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": container,
                            "resources": {"requests": {"cpu": quantity}, "limits": {"cpu": quantity}},
                            # valueFrom: null drops the template's resourceFieldRef (an entry may not have both).
                            "env": [
                                {"name": name, "value": value, "valueFrom": None}
                                for name, value in sorted(env.items())
                            ],
                        }
                    ]
                }
            }
        }
    }
