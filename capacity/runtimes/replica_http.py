"""One HTTP client per process for the control plane's calls to replicas (``/health``, ``/metrics``).

``httpx.get`` builds a client per call, and building one loads the CA bundle: about 20 ms of CPU each time, which
was half of an autoscaler tick's cost per endpoint (the actuators probe every replica they sync). One client per
process keeps its connections to the replicas alive too. A forked child (Celery's prefork workers) must not share
its parent's sockets, so the client is rebuilt when the process id changes.
"""

import os
import threading

import httpx

_lock = threading.Lock()
_client: httpx.Client | None = None
_pid: int | None = None


def replica_client() -> httpx.Client:
    """This process's client; pass a ``timeout`` per request."""
    global _client, _pid
    if _client is None or _pid != os.getpid():
        with _lock:
            if _client is None or _pid != os.getpid():
                _client = httpx.Client(
                    follow_redirects=False, limits=httpx.Limits(max_connections=64, max_keepalive_connections=16)
                )
                _pid = os.getpid()
    return _client
