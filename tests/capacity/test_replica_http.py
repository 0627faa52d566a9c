"""The control plane's replica client: one per process, reused across probes, rebuilt in a forked child."""

import os
import time

import httpx

from capacity.autoscaling.actuators.base import Actuator
from capacity.runtimes import replica_http


def test_probes_reuse_one_client_and_are_cheaper_than_a_client_per_call():
    client = replica_http.replica_client()
    assert replica_http.replica_client() is client
    dead = "http://127.0.0.1:9"  # nothing listens: each probe fails fast, so the timing is the client's own cost
    started = time.perf_counter()
    for _ in range(20):
        assert Actuator.healthy(dead, timeout_s=0.2) is False
    shared = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(20):
        try:
            httpx.get(f"{dead}/health", timeout=0.2)
        except httpx.HTTPError:
            pass
    per_call = time.perf_counter() - started
    assert replica_http.replica_client() is client
    assert shared < per_call  # building a client (CA bundle) per probe is what this removes


def test_a_forked_child_builds_its_own_client():
    parent = replica_http.replica_client()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a Celery prefork worker would be here
        child = replica_http.replica_client()
        os.write(write, b"1" if child is not parent and replica_http.replica_client() is child else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"1"
    assert replica_http.replica_client() is parent
