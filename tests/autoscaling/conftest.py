"""Fixtures for the autoscaling tests: a clean Redis namespace, no replica process left behind, this host's GPUs
and the environments replicas were started with."""

import subprocess

import pytest

from capacity.autoscaling import store, tick_reads
from capacity.autoscaling.actuators import local
from endpoints.models import Replica


@pytest.fixture
def clean_store(clean_redis):
    """A clean Redis namespace, a fresh client in the autoscaler's store, and no demand window kept from before."""
    store.reset_client()
    tick_reads.forget_windows()
    return clean_redis


@pytest.fixture
def reap_local_replicas():
    """Stop every process the local actuator started during the test, also when the test failed."""
    yield
    pids = {
        int(p) for p in Replica.objects.filter(actuator="local").values_list("actuator_ref", flat=True) if p.isdigit()
    }
    for pid in pids | set(local._CHILDREN):
        local.stop_pid(pid, grace_s=2.0)


@pytest.fixture
def host_gpus(settings, tmp_path):
    """Set this host's GPUs for the local actuator (``INFERCAP_LOCAL_GPUS``: ``8``, ``8/2``, empty)."""

    def use(spec: str) -> None:
        settings.INFERCAP = {**settings.INFERCAP, "LOCAL_GPUS": spec}
        settings.VAR_DIR = tmp_path

    return use


@pytest.fixture
def child_envs(monkeypatch):
    """The environment every replica process was started with, in order."""
    envs: list[dict] = []
    real = subprocess.Popen

    def popen(argv, **kwargs):
        envs.append(kwargs.get("env") or {})
        return real(argv, **kwargs)

    monkeypatch.setattr(local.subprocess, "Popen", popen)
    return envs
