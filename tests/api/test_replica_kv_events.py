"""An operator attaching a vLLM server names where it publishes its KV-cache events (``kv_events_endpoint``): a
``tcp://host:port`` is recorded for the proxy's subscriber, anything else is a field error and no row; a tenant on a
shared endpoint never sees the address (tests/proxy/test_kv_feeds.py for the subscriber)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from endpoints.models import Replica
from tests.fake_vllm import fake_server

pytestmark = pytest.mark.django_db

LIST = reverse("replica-list")


def attach(world, **payload):
    return world.client("operator").post(LIST, {"endpoint": world.a.endpoint.pk, **payload}, format="json")


def test_the_event_endpoint_is_recorded_and_shown_to_operators(world):
    with fake_server("vllm", model=world.a.endpoint.name) as url:
        response = attach(world, url=url, kv_events_endpoint="tcp://10.0.0.7:5557")
    assert response.status_code == 201, response.content
    replica = Replica.objects.get(pk=response.json()["id"])
    assert replica.kv_events_endpoint == "tcp://10.0.0.7:5557" == response.json()["kv_events_endpoint"]


@pytest.mark.parametrize("bad", ["tcp://*:5557", "http://10.0.0.7:5557", "tcp://10.0.0.7", "tcp://h:99999"])
def test_a_bad_event_endpoint_is_a_field_error(world, bad):
    with fake_server("vllm", model=world.a.endpoint.name) as url:
        response = attach(world, url=url, kv_events_endpoint=bad)
    assert response.status_code == 400, response.content
    assert "kv_events_endpoint" in response.json() and not Replica.objects.exists()
