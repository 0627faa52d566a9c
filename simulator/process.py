"""Start simulated replicas as real processes (for tests, benchmarks and the local actuator).

    from simulator.process import start_replica
    with start_replica(profile="tiny", speed=10, faults={"error_rate": 0.5}) as replica:
        httpx.post(f"{replica.url}/v1/completions", json={...})
        replica.set_faults(hang=True)        # POST /admin/faults
        replica.crash()                       # POST /admin/crash → the process exits
    # leaving the block stops it (SIGTERM, then SIGKILL after a grace period)

``start_replica`` runs ``python -m simulator.cli --port <free port> ...`` (the same command line as
``python manage.py run_replica --runtime sim``, which ``via_manage=True`` uses, without Django's start-up), waits until
``GET /health`` answers 200 (``wait=False`` returns at once, e.g. to watch a cold start), and returns a
``ReplicaProcess`` with ``url``, ``port``, ``pid``, ``stop()``, ``kill()``, ``alive()``, ``wait_exit()``,
``set_faults(**settings)``, ``faults()``, ``crash()`` and ``log()`` (its stdout+stderr so far).

A replica gets SIGTERM when the *thread* that started it ends (Linux ``PR_SET_PDEATHSIG``), and leftovers are
killed at interpreter exit, so a crashed test run leaves no process behind. Start replicas from a long-lived
thread, or pass ``die_with_parent=False`` (and stop them yourself).
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from pathlib import Path

from capacity.runtimes.launch_env import launch_env
from capacity.runtimes.ports import free_port  # noqa: F401  (the tests and harnesses take it from here too)

MANAGE_PY = Path(__file__).resolve().parents[1] / "manage.py"
_started: weakref.WeakSet = weakref.WeakSet()


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the starting process dies (Linux), so no replica outlives it."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


@atexit.register
def _stop_leftovers() -> None:
    for replica in list(_started):
        replica.kill()


def _http(method: str, url: str, payload: dict | None = None, timeout: float = 5.0) -> tuple[int, bytes]:
    data = json.dumps(payload).encode() if payload is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class ReplicaStartError(RuntimeError):
    pass


class ReplicaProcess:
    def __init__(self, proc: subprocess.Popen, host: str, port: int, log_path: str):
        self.proc = proc
        self.host = host
        self.port = port
        self.url = f"http://{host}:{port}"
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def healthy(self, timeout: float = 1.0) -> bool:
        try:
            return _http("GET", f"{self.url}/health", timeout=timeout)[0] == 200
        except OSError:
            return False

    def wait_healthy(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise ReplicaStartError(f"replica exited with {self.proc.returncode}:\n{self.log()[-2000:]}")
            if self.healthy(timeout=0.5):
                return
            time.sleep(0.05)
        raise ReplicaStartError(f"replica not healthy after {timeout_s} s:\n{self.log()[-2000:]}")

    def set_faults(self, **settings) -> dict:
        status, body = _http("POST", f"{self.url}/admin/faults", settings)
        if status != 200:
            raise ValueError(body.decode(errors="replace"))
        return json.loads(body)

    def faults(self) -> dict:
        return json.loads(_http("GET", f"{self.url}/admin/faults")[1])

    def crash(self) -> None:
        """Ask the replica to exit abruptly (exit code 75), as a crashed vLLM would."""
        try:
            _http("POST", f"{self.url}/admin/crash", {})
        except OSError:
            pass

    def wait_exit(self, timeout_s: float = 10.0) -> int | None:
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
            self.proc.wait(10)

    def stop(self, grace_s: float = 5.0) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")
        except OSError:
            return ""

    def __enter__(self) -> ReplicaProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
        try:
            os.unlink(self.log_path)
        except OSError:
            pass


def start_replica(
    *,
    profile: str | None = "tiny",
    speed: float = 1.0,
    port: int | None = None,
    host: str = "127.0.0.1",
    served_model_name: str | None = None,
    scheduling_policy: str = "priority",
    faults: dict | None = None,
    profile_opts: dict | None = None,
    wait: bool = True,
    timeout_s: float = 30.0,
    env: dict | None = None,
    cpus: float | str | None = None,
    via_manage: bool = False,
    die_with_parent: bool = True,
    kv_transfer_config: dict | None = None,
) -> ReplicaProcess:
    """Start one simulated replica process; see the module docstring.

    ``cpus`` is the replica's CPU allotment: its thread pools (``OMP_NUM_THREADS`` and friends) are sized from it,
    or, without one, from what this process may use (affinity, cgroup quota), never from the host's core count.
    ``kv_transfer_config``: vLLM's ``--kv-transfer-config`` (a prefill or decode replica, docs/disaggregation.md).
    """
    port = port or free_port(host)
    # The Django-free entry point starts in a fraction of the time; ``via_manage`` exercises manage.py's.
    entry = [str(MANAGE_PY), "run_replica"] if via_manage else ["-m", "simulator.cli"]
    argv = [
        sys.executable,
        *entry,
        "--runtime",
        "sim",
        "--host",
        host,
        "--port",
        str(port),
        "--speed",
        str(speed),
        "--scheduling-policy",
        scheduling_policy,
    ]
    if profile:
        argv += ["--profile", profile]
    if served_model_name:
        argv += ["--served-model-name", served_model_name]
    for key, value in (faults or {}).items():
        argv += ["--fault", f"{key}={value}"]
    for key, value in (profile_opts or {}).items():
        argv += ["--profile-opt", f"{key}={value}"]
    if kv_transfer_config is not None:
        argv += ["--kv-transfer-config", json.dumps(kv_transfer_config)]
    log = tempfile.NamedTemporaryFile(prefix="sim-replica-", suffix=".log", delete=False)
    proc = subprocess.Popen(
        argv,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **launch_env({"cpus": cpus} if cpus is not None else {}), **(env or {})},
        cwd=str(MANAGE_PY.parent),
        preexec_fn=_die_with_parent if die_with_parent and sys.platform.startswith("linux") else None,
    )
    log.close()
    replica = ReplicaProcess(proc, host, port, log.name)
    _started.add(replica)
    if wait:
        try:
            replica.wait_healthy(timeout_s + float((faults or {}).get("startup_delay_s", 0)))
        except BaseException:
            replica.kill()
            raise
    return replica
