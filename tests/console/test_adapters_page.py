"""The console's LoRA adapters page: each user sees the adapters the API would list, with their last day's
traffic; operators also see which adapters each LoRA replica's engine holds now (docs/lora-serving.md)."""

from django.urls import reverse

from endpoints.models import Adapter
from tests.adapter_artifacts import LORA_OPTIONS
from tests.factories import EndpointFactory, ReplicaFactory, UsageRecordFactory
from tests.fake_vllm import fake_server


def _adapters(tenant_a, tenant_b):
    for actors, name in ((tenant_a, "a-support-ft"), (tenant_b, "b-secret-ft")):
        endpoint = EndpointFactory(owner_tenant=actors.tenant, launch_options=LORA_OPTIONS)
        Adapter.objects.create(name=name, owner_tenant=actors.tenant, endpoint=endpoint, rank=8, artifact_path=name)
        for _ in range(3):
            UsageRecordFactory(tenant=actors.tenant, endpoint=endpoint, adapter=name, mu=2.5)
    return Adapter.objects.get(name="a-support-ft").endpoint


def test_tenant_sees_its_own_adapters_and_their_traffic_only(client, tenant_a, tenant_b):
    _adapters(tenant_a, tenant_b)
    client.force_login(tenant_a.member)
    page = client.get(reverse("console:adapters")).content.decode()
    assert "a-support-ft" in page and "b-secret-ft" not in page
    assert "<td>3</td><td>7.5</td>" in page  # three requests, 3 x 2.5 MU
    assert "Adapters per replica" not in page and '<th scope="col">Artifact</th>' not in page  # operators' only


def test_operator_sees_every_adapter_and_what_each_replica_holds(client, operator, tenant_a, tenant_b):
    endpoint = _adapters(tenant_a, tenant_b)
    with fake_server("vllm", model=endpoint.name) as url:
        ReplicaFactory(endpoint=endpoint, name="lora-r1", url=url)
        ReplicaFactory(endpoint=endpoint, name="gone-r2", url="http://127.0.0.1:9")  # nothing listens there
        client.force_login(operator)
        page = client.get(reverse("console:adapters")).content.decode()
    assert "a-support-ft" in page and "b-secret-ft" in page
    assert f"{endpoint.name}/lora-r1</td><td>2</td>\n      <td>none" in page
    assert "did not answer" in page
