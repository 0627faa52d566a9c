"""The console's replica attach form: operators only, the service's checks as field errors, confirm then act."""

import pytest
from django.urls import reverse

from endpoints.models import Replica, ReplicaState
from tests.fake_vllm import fake_server

pytestmark = pytest.mark.django_db


def test_an_operator_attaches_a_vllm_server_after_confirming(client, operator, tenant_a):
    client.force_login(operator)
    endpoint = tenant_a.endpoint
    page = client.get(reverse("console:endpoint", args=[endpoint.pk]))
    url = reverse("console:replica-attach", args=[endpoint.pk])
    assert url in page.content.decode()  # the endpoint page links to the form
    assert client.get(url).status_code == 200
    with fake_server("vllm", model=endpoint.name) as server:
        first = client.post(url, {"url": server, "name": "edge-1"})
        assert first.status_code == 200 and 'name="confirmed" value="yes"' in first.content.decode()
        assert not Replica.objects.exists()  # nothing before the confirmation
        done = client.post(url, {"url": server, "name": "edge-1", "concurrency_limit": "", "confirmed": "yes"})
    assert done.status_code == 302 and done["Location"] == reverse("console:endpoint", args=[endpoint.pk])
    replica = Replica.objects.get(endpoint=endpoint)
    assert (replica.name, replica.url, replica.state) == ("edge-1", server, ReplicaState.READY)
    assert replica.concurrency_limit == endpoint.concurrency_limit


def test_a_server_that_is_not_vllm_comes_back_as_an_error_on_the_url(client, operator, tenant_a):
    client.force_login(operator)
    url = reverse("console:replica-attach", args=[tenant_a.endpoint.pk])
    with fake_server("html_health", model=tenant_a.endpoint.name) as server:
        refused = client.post(url, {"url": server, "confirmed": "yes"})
    assert refused.status_code == 400
    assert any("HTML page" in error for error in refused.context["form"].errors["url"])
    assert "field-error" in refused.content.decode()
    assert not Replica.objects.exists()


def test_tenants_never_see_the_attach_form(client, tenant_a):
    client.force_login(tenant_a.admin)
    url = reverse("console:replica-attach", args=[tenant_a.endpoint.pk])
    assert client.get(url).status_code == 404
    with fake_server("vllm", model=tenant_a.endpoint.name) as server:
        assert client.post(url, {"url": server, "confirmed": "yes"}).status_code == 404
    assert not Replica.objects.exists()
    page = client.get(reverse("console:endpoint", args=[tenant_a.endpoint.pk]))
    assert url not in page.content.decode()
