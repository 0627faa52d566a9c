"""Attaching the real engine by URL (POST /api/v1/replicas/): it passes the checks that tell a vLLM server serving
the endpoint from anything else, and the same engine under another endpoint's name does not. The fake servers
(HTML /health, no /metrics, another model): tests/api/test_replica_attach.py."""

from __future__ import annotations

import pytest
from django.urls import reverse

from capacity.runtimes.vllm import server_problems
from endpoints.models import Replica, ReplicaState
from tests.conftest import client_for
from tests.factories import EndpointFactory

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db]


def test_the_real_engine_is_a_vllm_server(engine):
    assert server_problems(engine.url, served_model_name=engine.model) == []
    assert server_problems(engine.url, served_model_name=None) == []


def test_an_operator_attaches_the_real_engine_and_it_is_ready(engine, operator, tenant_a):
    endpoint = EndpointFactory(name=engine.model, owner_tenant=tenant_a.tenant)
    response = client_for(operator).post(
        reverse("replica-list"), {"endpoint": endpoint.pk, "url": engine.url}, format="json"
    )
    assert response.status_code == 201, response.content
    replica = Replica.objects.get(pk=response.json()["id"])
    assert (replica.state, replica.actuator, replica.url) == (ReplicaState.READY, "static", engine.url)
    # Its owner reads it; only operators attach.
    refused = client_for(tenant_a.admin).post(
        reverse("replica-list"), {"endpoint": endpoint.pk, "url": engine.url}, format="json"
    )
    assert refused.status_code == 403


def test_the_real_engine_under_another_endpoints_name_is_refused(engine, operator):
    endpoint = EndpointFactory(name="not-what-it-serves")
    response = client_for(operator).post(
        reverse("replica-list"), {"endpoint": endpoint.pk, "url": engine.url}, format="json"
    )
    assert response.status_code == 400, response.content
    (error,) = response.json()["url"]
    assert f"lists {engine.model}, not the served model name 'not-what-it-serves'" in error
    assert not Replica.objects.filter(endpoint=endpoint).exists()
