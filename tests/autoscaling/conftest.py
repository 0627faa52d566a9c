"""Fixtures for the autoscaling tests: a clean Redis namespace and no replica process left behind."""

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
