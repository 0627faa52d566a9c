"""Real processes over real sockets: simulated vLLM replicas and proxy
workers (uvicorn running ``config.asgi``) that read the test database. Every process is killed on teardown."""

import socket
import uuid

import pytest
import redis
from django.conf import settings

from capacity.runtimes.processes import (
    PY,
    ROOT,
    ProcessGroup,
    database_url,
    free_port,
    sim_replica_argv,
    uvicorn_argv,
    wait_port,
)
from endpoints.models import Replica, ReplicaState

# Kept for the tests that import them from here.
Processes = ProcessGroup
subprocess_database_url = database_url
__all__ = ["PY", "ROOT", "Processes", "free_port", "subprocess_database_url", "wait_port"]


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
    proc = procs.spawn(
        sim_replica_argv(port, speed=speed, served_model_name=endpoint.name, extra=extra or []), port=port
    )
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
    procs.spawn(uvicorn_argv("config.asgi:application", port), env=env, port=port)
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


@pytest.fixture
def members_key():
    """A members hash of the test's own for the heartbeat script (``gateway.proxy.membership``), deleted afterwards
    with its members' holdings."""
    name = f"test:members:{uuid.uuid4().hex[:8]}"
    yield name
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(name, *client.keys(f"{name}:*"))
    client.close()
