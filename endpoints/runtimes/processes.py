"""Starting and stopping the platform's own processes for tests and benchmarks: simulated replicas and uvicorn
workers (the proxy, the bare pass-through) on free ports.

    with ProcessGroup() as group:
        replica = group.spawn(sim_replica_argv(port := free_port(), served_model_name="m"), port=port)
        proxy = group.spawn(uvicorn_argv("config.asgi:application", proxy_port := free_port()), port=proxy_port,
                            env=child_django_env())
    # leaving the block stops every process, newest first: SIGTERM to its process group, SIGKILL after 5 s

Each child runs in its own session (process group), so stopping it also stops whatever it started. ``spawn``
waits until the port accepts connections and, when the child exits first, raises with the tail of its stderr.
(``endpoints.runtimes.sim.process.start_replica`` is the richer handle for one replica: faults, crash, log.)
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from endpoints.runtimes.sim.process import free_port

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable

__all__ = [
    "PY",
    "ROOT",
    "ProcessGroup",
    "child_django_env",
    "database_url",
    "free_port",
    "sim_replica_argv",
    "stop_process",
    "uvicorn_argv",
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
    import importlib.util

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
    """A simulated vLLM replica (``python -m endpoints.runtimes.sim.cli``, no Django start-up)."""
    argv = [PY, "-m", "endpoints.runtimes.sim.cli", "--runtime", "sim", "--port", str(port), "--speed", str(speed)]
    if served_model_name:
        argv += ["--served-model-name", served_model_name]
    return argv + list(extra)


def database_url() -> str:
    """The database this (Django) process uses, as a URL for a child process."""
    from django.db import connection

    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s.get("PASSWORD") else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def child_django_env(settings_module: str | None = None, **extra: str) -> dict[str, str]:
    """Environment for a child Django process that must see this process's database and Redis."""
    from django.conf import settings

    env = {
        "DJANGO_SETTINGS_MODULE": settings_module or os.environ.get("DJANGO_SETTINGS_MODULE", "config.settings.local")
    }
    from django.db import connection

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
    ) -> subprocess.Popen:
        """Start ``argv`` (``env`` added to this environment); with ``port``, wait until it listens there.
        ``stderr``: a file path or object for the child's stderr; by default it is kept for the error message."""
        log = None
        if stderr is None:
            log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop_process via proc.stderr
            err_target = log
        elif isinstance(stderr, (str, Path)):
            err_target = open(stderr, "ab")  # noqa: SIM115 - the child keeps it open
        else:
            err_target = stderr
        proc = subprocess.Popen(
            argv,
            cwd=self.cwd,
            env={**os.environ, **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err_target,
            start_new_session=True,
        )
        if isinstance(stderr, (str, Path)):
            err_target.close()
        proc._infercap_log = log  # type: ignore[attr-defined]
        self.procs.append(proc)
        if port is not None:
            try:
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
