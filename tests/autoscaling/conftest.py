"""Fixtures for the autoscaling tests: a clean Redis namespace and no replica process left behind."""

import pytest
import redis
from django.conf import settings

from capacity.autoscaling import store
from capacity.autoscaling.actuators import local
from endpoints.models import Replica
from tests.proxy.conftest import Processes


@pytest.fixture
def procs():
    p = Processes()
    yield p
    p.kill_all()


@pytest.fixture
def clean_store():
    client = redis.Redis.from_url(settings.REDIS_URL)
    for key in client.scan_iter("infercap:*"):
        client.delete(key)
    store.reset_client()
    yield client
    client.close()


@pytest.fixture
def reap_local_replicas():
    """Stop every process the local actuator started during the test, also when the test failed."""
    yield
    pids = {
        int(p) for p in Replica.objects.filter(actuator="local").values_list("actuator_ref", flat=True) if p.isdigit()
    }
    for pid in pids | set(local._CHILDREN):
        local.stop_pid(pid, grace_s=2.0)
