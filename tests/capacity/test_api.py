"""Capacity REST API: plan, ledger and benchmarks, with validation and tenant isolation."""

import pytest

from capacity.models import CapacityBenchmark
from endpoints.models import ReplicaState
from tests.conftest import client_for
from tests.factories import ReplicaFactory

PLAN_URL = "/api/v1/capacity/plan"
LEDGER_URL = "/api/v1/capacity/ledger"
BENCH_URL = "/api/v1/capacity/benchmarks/"

WORKED = {
    "model": {"n_layers": 40, "n_kv_heads": 8, "d_head": 128, "dtype_bytes": 2, "weights_gb": 26},
    "hardware": {"gpu_memory_gb": 80, "overhead_gb": 10, "usd_per_gpu_hour": 2.5},
    "workload": {"arrival_rate_per_s": 20, "input_tokens": 500, "output_tokens": 300, "context_tokens": 800},
    "slo": {"min_stream_tok_s": 60},
    "throughput_table": [
        {"batch": 16, "per_stream_tok_s": 105, "aggregate_tok_s": 1680},
        {"batch": 64, "per_stream_tok_s": 68, "aggregate_tok_s": 4352},
        {"batch": 128, "per_stream_tok_s": 44, "aggregate_tok_s": 5632},
    ],
    "headroom": 0.5,
    "ttft_s": 0.3,
    "spike": {"load_multiplier": 3, "cold_start_s": 90, "utilization_ceiling": 0.8},
}


def test_plan_reproduces_the_worked_example(tenant_a):
    response = client_for(tenant_a.member).post(PLAN_URL, WORKED, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["kv_tok_bytes"], body["b_max"], body["n_base"], body["n_with_headroom"]) == (163840, 64, 2, 3)
    assert (body["n_mem"], body["n_thr"], body["n_lat"]) == (1, 2, 2)
    assert round(body["usd_per_1m_tokens_at_b_max"], 2) == 0.16
    assert body["spike"]["replicas_needed"] == 6
    assert body["binding_barriers"] == ["throughput", "latency"] and "bind together" in body["explanation"]
    assert body["sources"]["throughput_table"] == "given"


def test_plan_from_profiles_and_a_stored_benchmark(tenant_a):
    endpoint = tenant_a.endpoint
    bench = CapacityBenchmark.objects.create(
        model_profile=endpoint.model_profile, hardware_profile=endpoint.hardware_profile, version=1,
        status=CapacityBenchmark.Status.SUCCEEDED, throughput_table=WORKED["throughput_table"],
        alpha=0.003, alpha_cached=0, beta=0.02, gamma=0.1, mu_per_min=1000,
    )  # fmt: skip
    body = {"endpoint": endpoint.pk, "workload": WORKED["workload"], "slo": {"tpot_ms": 1000 / 60}, "ttft_s": 0.3}
    response = client_for(tenant_a.admin).post(PLAN_URL, body, format="json")
    assert response.status_code == 200, response.content
    data = response.json()
    # The endpoint's profiles give the 13B shape, 80 GB and the 10 GB overhead: the worked example again.
    assert (data["kv_tok_bytes"], data["m_kv_gb"], data["n_base"]) == (163840, 44, 2)
    assert data["sources"]["throughput_table"] == f"benchmark:{bench.pk} v1 shape reference"


@pytest.mark.parametrize(
    "change, field",
    [
        ({"workload": {"arrival_rate_per_s": -1, "input_tokens": 500, "output_tokens": 300}}, "workload"),
        ({"throughput_table": []}, "throughput_table"),
        ({"throughput_table": [{"batch": 0, "per_stream_tok_s": 10}]}, "throughput_table"),
        ({"headroom": "lots"}, "headroom"),
        ({"hardware": {"gpu_memory_gb": 30, "overhead_gb": 10}}, "hardware.gpu_memory_gb"),
        ({"slo": {}}, "slo"),
    ],
)
def test_plan_rejects_bad_input_with_the_field(tenant_a, change, field):
    response = client_for(tenant_a.member).post(PLAN_URL, {**WORKED, **change}, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()


def test_plan_without_a_table_or_benchmark_says_what_is_missing(tenant_a):
    body = {k: v for k, v in WORKED.items() if k != "throughput_table"}
    response = client_for(tenant_a.member).post(PLAN_URL, body, format="json")
    assert response.status_code == 400
    assert "throughput_table" in response.json()


def test_unreachable_slo_is_an_answer_not_an_error(tenant_a):
    response = client_for(tenant_a.member).post(PLAN_URL, {**WORKED, "slo": {"min_stream_tok_s": 500}}, format="json")
    assert response.status_code == 200
    assert response.json()["feasible"] is False and "SLO unreachable" in response.json()["explanation"]


def test_a_tenant_cannot_plan_on_another_tenants_endpoint(tenant_a, tenant_b, api_client):
    body = {**WORKED, "endpoint": tenant_b.endpoint.pk}
    response = client_for(tenant_a.admin).post(PLAN_URL, body, format="json")
    assert response.status_code == 400 and "endpoint" in response.json()
    assert api_client.post(PLAN_URL, WORKED, format="json").status_code in (401, 403)


def test_ledger_for_operators_and_tenants(operator, tenant_a, tenant_b):
    ReplicaFactory(endpoint=tenant_a.endpoint, state=ReplicaState.READY)
    full = client_for(operator).get(LEDGER_URL).json()
    rows = {row["endpoint"]: row for row in full["endpoints"]}
    assert rows[tenant_a.endpoint.name]["have_mu_per_min"] == 1000
    assert rows[tenant_a.endpoint.name]["sold_mu_per_min"] == 100
    assert full["total"]["sold_mu_per_min"] == 200
    own = client_for(tenant_a.member).get(LEDGER_URL).json()
    assert own["endpoints"] == [] and own["total"] == {}
    assert {row["tenant_id"] for row in own["tenants"]} == {tenant_a.tenant.pk}
    # Asking for another tenant's endpoint yields nothing, not its figures.
    other = client_for(tenant_a.member).get(LEDGER_URL, {"endpoint": tenant_b.endpoint.pk}).json()
    assert other["tenants"] == []
    assert client_for(operator).get(LEDGER_URL, {"endpoint": "x"}).status_code == 400


def test_benchmark_run_is_for_operators_and_needs_a_ready_replica(
    operator, tenant_a, monkeypatch, django_capture_on_commit_callbacks
):
    from workers.tasks import capacity as tasks

    sent = []
    # The service enqueues by name; Celery resolves the registered task and calls its apply_async.
    monkeypatch.setattr(
        tasks.benchmark_endpoint, "apply_async", lambda args, kwargs, **options: sent.append((tuple(args), kwargs))
    )
    url = BENCH_URL + "run/"
    endpoint = tenant_a.endpoint
    assert client_for(tenant_a.admin).post(url, {"endpoint": endpoint.pk}, format="json").status_code == 403
    response = client_for(operator).post(url, {"endpoint": endpoint.pk}, format="json")
    assert response.status_code == 400 and "no ready replica" in str(response.json())
    ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY)
    with django_capture_on_commit_callbacks(execute=True):
        response = client_for(operator).post(url, {"endpoint": endpoint.pk, "quick": True}, format="json")
    assert response.status_code == 202
    assert sent == [((endpoint.pk, None), {"quick": True, "pin": False})]


def test_benchmarks_are_listed_for_everyone(tenant_b):
    endpoint = tenant_b.endpoint
    CapacityBenchmark.objects.create(
        model_profile=endpoint.model_profile, hardware_profile=endpoint.hardware_profile, version=1
    )
    response = client_for(tenant_b.member).get(BENCH_URL)
    assert response.status_code == 200
    assert [row["version"] for row in response.json()["results"]] == [1]
