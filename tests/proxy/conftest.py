"""Real processes over real sockets: simulated vLLM replicas and proxy
workers (uvicorn running ``config.asgi``) that read the test database. Every process is killed on teardown."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.db import connection

from endpoints.models import Replica, ReplicaState

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {port} after {timeout} s")


def subprocess_database_url() -> str:
    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s.get("PASSWORD") else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


class Processes:
    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def spawn(self, args: list[str], env: dict | None = None, port: int | None = None) -> subprocess.Popen:
        full_env = {**os.environ, **(env or {})}
        proc = subprocess.Popen(
            args, cwd=ROOT, env=full_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        self.procs.append(proc)
        if port is not None:
            try:
                wait_port(port, proc)
            except Exception:
                self.kill_all()
                err = proc.stderr.read().decode(errors="replace")[-3000:] if proc.stderr else ""
                raise RuntimeError(f"{args} failed to start:\n{err}") from None
        return proc

    def kill(self, proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=5)
        if proc.stderr:
            proc.stderr.close()

    def kill_all(self) -> None:
        for proc in reversed(self.procs):
            self.kill(proc)
        self.procs.clear()


@pytest.fixture
def procs():
    p = Processes()
    yield p
    p.kill_all()


@pytest.fixture
def clean_redis():
    client = redis.Redis.from_url(settings.REDIS_URL)
    for key in client.scan_iter("infercap:*"):
        client.delete(key)
    yield client
    client.close()


def spawn_replica(
    procs: Processes,
    *,
    endpoint,
    name: str,
    speed: float = 20.0,
    concurrency_limit: int = 64,
    extra: list[str] | None = None,
):
    """A simulated vLLM replica process (``--fault …`` in ``extra`` injects failures) plus its READY row."""
    port = free_port()
    # Replicas serve the endpoint's name as their model (the actuators launch them with --served-model-name).
    args = [
        PY,
        "-m",
        "endpoints.runtimes.sim.cli",
        "--runtime",
        "sim",
        "--port",
        str(port),
        "--speed",
        str(speed),
        "--served-model-name",
        endpoint.name,
        *(extra or []),
    ]
    env: dict = {}
    proc = procs.spawn(args, env=env, port=port)
    replica = Replica.objects.create(
        endpoint=endpoint,
        name=name,
        url=f"http://127.0.0.1:{port}",
        state=ReplicaState.READY,
        concurrency_limit=concurrency_limit,
    )
    return proc, replica, port


def spawn_proxy(procs: Processes, db_url: str | None = None, **knobs) -> str:
    """A proxy worker on a free port; ``knobs`` become INFERCAP_PROXY_* variables. Returns its base URL."""
    port = free_port()
    env = {
        "DJANGO_SETTINGS_MODULE": "config.settings.test",
        "DATABASE_URL": db_url or subprocess_database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "INFERCAP_SNAPSHOT_POLL_S": "0.1",
        **{f"INFERCAP_PROXY_{k.upper()}": str(v) for k, v in knobs.items()},
    }
    args = [
        PY,
        "-m",
        "uvicorn",
        "config.asgi:application",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--lifespan",
        "off",
        "--no-access-log",
        "--log-level",
        "warning",
    ]
    procs.spawn(args, env=env, port=port)
    return f"http://127.0.0.1:{port}"


class TcpRelay:
    """A TCP forwarder in a thread: lets a test make PostgreSQL unreachable for one process (``cut``) and bring
    it back (``restore``) without touching the server every other test shares."""

    def __init__(self, target_host: str, target_port: int) -> None:
        import threading

        self.target = (target_host, target_port)
        self.port = free_port()
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self._threads = threading
        self.restore()

    def restore(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        self._threads.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                self._threads.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self) -> None:
        """Refuse new connections and reset the open ones, as a stopped server would."""
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        with self._lock:
            conns, self._conns = self._conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass

    def close(self) -> None:
        self.cut()
