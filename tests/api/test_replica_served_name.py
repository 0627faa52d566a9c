"""Attaching a vLLM server that serves the endpoint's model under its own name (``served_model_name``): the name is
checked against the server's /v1/models and recorded for the proxy, which sends it as ``model``
(tests/proxy/test_model_names.py); without it, a server listing another name is refused with a hint."""

from __future__ import annotations

import pytest
from django.urls import reverse

from endpoints.models import Replica, ReplicaState
from tenants.models import AuditEntry
from tests.fake_vllm import fake_server

pytestmark = pytest.mark.django_db

LIST = reverse("replica-list")


def attach(world, **payload):
    return world.client("operator").post(LIST, {"endpoint": world.a.endpoint.pk, **payload}, format="json")


def test_a_server_serving_its_own_name_is_attached_under_that_name(world):
    with fake_server("vllm", model="org/engine-7b") as url:
        response = attach(world, url=url, served_model_name="org/engine-7b")
    assert response.status_code == 201, response.content
    replica = Replica.objects.get(pk=response.json()["id"])
    assert replica.served_model_name == "org/engine-7b" == response.json()["served_model_name"]
    assert replica.state == ReplicaState.READY
    assert "/v1/models lists 'org/engine-7b'" in replica.transitions.last().reason
    entry = AuditEntry.objects.get(action="replica.attach", object_id=str(replica.pk))
    assert entry.detail["served_model_name"] == "org/engine-7b"


def test_without_a_name_the_endpoints_is_checked_recorded_and_the_error_says_what_to_give(world):
    with fake_server("vllm", model=world.a.endpoint.name) as url:
        response = attach(world, url=url)
    assert response.status_code == 201, response.content
    assert Replica.objects.get(pk=response.json()["id"]).served_model_name == world.a.endpoint.name
    with fake_server("vllm", model="org/engine-7b") as url:
        refused = attach(world, url=url)
    assert refused.status_code == 400, refused.content
    (error,) = refused.json()["url"]
    assert "lists org/engine-7b, not the served model name 'a-model'" in error and "give served_model_name" in error


@pytest.mark.parametrize(
    ("name", "field"), [("not-listed", "url"), ("x" * 256, "served_model_name"), ("a\nb", "served_model_name")]
)
def test_a_name_the_server_does_not_serve_or_cannot_be_a_name_is_a_field_error(world, name, field):
    with fake_server("vllm", model="org/engine-7b") as url:
        response = attach(world, url=url, served_model_name=name)
    assert response.status_code == 400, response.content
    assert field in response.json() and not Replica.objects.exists()
