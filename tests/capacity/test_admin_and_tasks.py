"""The ledger admin page and the benchmark task's failure path."""

from capacity.models import CapacityBenchmark
from endpoints.models import ReplicaState
from simulator.process import free_port
from tests.factories import ReplicaFactory
from workers.tasks.capacity import benchmark_endpoint

LEDGER_ADMIN = "/admin/capacity/endpointcapacity/"


def test_ledger_admin_lists_have_and_sold(client, operator, tenant_a):
    operator.is_staff = True
    operator.save()
    ReplicaFactory(endpoint=tenant_a.endpoint, state=ReplicaState.READY)
    client.force_login(operator)
    response = client.get(LEDGER_ADMIN)
    assert response.status_code == 200
    page = response.content.decode()
    assert tenant_a.endpoint.name in page and "1,000.0" in page and "100.0" in page


def test_ledger_admin_is_closed_to_tenants(client, tenant_a):
    tenant_a.admin.is_staff = True
    tenant_a.admin.save()
    client.force_login(tenant_a.admin)
    assert client.get(LEDGER_ADMIN).status_code in (302, 403)


def test_task_records_an_unreachable_replica_as_a_failed_benchmark(tenant_a):
    endpoint = tenant_a.endpoint
    replica = ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY, url=f"http://127.0.0.1:{free_port()}")
    outcome = benchmark_endpoint(endpoint.pk, replica.pk, quick=True)
    # Checked to be a vLLM server before the sweep: the error says which probe failed.
    assert outcome["status"] == "failed" and "is not a vLLM server" in outcome["error"]
    assert "/health" in outcome["error"]
    failed = CapacityBenchmark.objects.get()
    assert failed.status == CapacityBenchmark.Status.FAILED and failed.finished_at is not None
