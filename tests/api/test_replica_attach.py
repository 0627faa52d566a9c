"""Attaching a running vLLM server by URL (POST /api/v1/replicas/, operators only), and what a URL that is not a
vLLM server gets everywhere the platform talks to a replica: a field error at registration, a failed probe (not a
crash) in the health check, a clear error from the benchmark. The same checks against the real engine:
tests/engine/test_replica_attach_real.py."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from capacity.models import CapacityBenchmark
from capacity.replica_benchmark.sweep import BenchmarkError
from capacity.services import benchmark_run
from endpoints.health import HealthConfig, health_check_cycle
from endpoints.models import Replica, ReplicaState
from tenants.models import AuditEntry
from tests.factories import ReplicaFactory
from tests.fake_vllm import fake_server

pytestmark = pytest.mark.django_db

LIST = reverse("replica-list")


def attach(world, who="operator", **payload):
    return world.client(who).post(LIST, {"endpoint": world.a.endpoint.pk, **payload}, format="json")


def test_an_operator_attaches_a_vllm_server_that_turns_ready_at_once(world):
    with fake_server("vllm", model=world.a.endpoint.name) as url:
        response = attach(world, url=url + "/", concurrency_limit=12)
    assert response.status_code == 201, response.content
    body = response.json()
    replica = Replica.objects.get(pk=body["id"])
    assert body["url"] == replica.url == url  # stored without the trailing slash
    assert (replica.state, replica.actuator, replica.concurrency_limit) == (ReplicaState.READY, "static", 12)
    assert replica.name == f"attached-127.0.0.1-{url.rsplit(':', 1)[1]}" == body["name"]
    transitions = list(replica.transitions.values_list("to_state", "reason"))
    assert [state for state, _ in transitions] == ["starting", "ready"]
    assert "attached by operator" in transitions[0][1] and "vLLM checks passed" in transitions[1][1]
    entry = AuditEntry.objects.get(action="replica.attach", object_id=str(replica.pk))
    assert entry.actor == world.operator and entry.detail["url"] == url


@pytest.mark.parametrize(
    ("kind", "says"),
    [
        ("html_health", "HTML page"),
        ("no_metrics", "GET /metrics answered 404"),
        ("plain_metrics", "no vllm: series"),
        ("wrong_model", "lists some-other-model, not the served model name 'a-model'"),
    ],
)
def test_a_server_that_is_not_vllm_serving_the_endpoint_is_a_field_error_and_no_replica(world, kind, says):
    with fake_server(kind, model=world.a.endpoint.name) as url:
        response = attach(world, url=url)
    assert response.status_code == 400, response.content
    errors = response.json()["url"]
    assert any(says in error for error in errors), errors
    assert all(error.startswith("is not a vLLM server serving 'a-model'") for error in errors)
    assert not Replica.objects.exists()


def test_an_html_server_says_every_way_it_is_not_vllm(world):
    with fake_server("html_health", model=world.a.endpoint.name) as url:
        errors = attach(world, url=url).json()["url"]
    assert len(errors) == 3, errors  # /health is a page, /v1/models no model list, /metrics no vllm: series


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://127.0.0.1:9", "cannot reach"),
        ("ftp://127.0.0.1/", "http:// or https://"),
        ("http://user:pw@127.0.0.1:8000", "without credentials"),
        ("http://127.0.0.1:8000/?x=1", "without credentials, query or fragment"),
        ("not a url", "http:// or https://"),
        ("http://127.0.0.1:99999", "not a valid URL"),
    ],
)
def test_an_unusable_url_is_a_field_error(world, url, says):
    response = attach(world, url=url)
    assert response.status_code == 400, response.content
    assert any(says in error for error in response.json()["url"]), response.json()


@pytest.mark.parametrize("who", ["a_admin", "a_write_key", "a_member", "a_read_key", "b_admin"])
def test_tenants_may_not_attach_replicas_even_to_their_own_endpoint(world, who):
    with fake_server("vllm", model=world.a.endpoint.name) as url:
        response = attach(world, who, url=url)
    assert response.status_code == 403, response.content
    assert not Replica.objects.exists()


def test_the_same_server_is_attached_once_and_names_are_unique(world):
    with fake_server("vllm", model=world.a.endpoint.name) as url:
        assert attach(world, url=url, name="edge-1").status_code == 201
        again = attach(world, url=url)
        assert again.status_code == 400 and "already a replica" in str(again.json()["url"])
        ReplicaFactory(endpoint=world.a.endpoint, name="edge-2", url="http://10.0.0.9:8000")
        clash = attach(world, url=url + "/v2", name="edge-2")
        assert clash.status_code == 400 and "name" in clash.json()
        bad_name = attach(world, url=url + "/v3", name="../x y")
        assert bad_name.status_code == 400 and "name" in bad_name.json()


def test_replicas_are_attached_never_edited_or_deleted_over_the_api(world):
    replica = ReplicaFactory(endpoint=world.a.endpoint)
    detail = reverse("replica-detail", args=[replica.pk])
    client = world.client("operator")
    assert client.patch(detail, {"url": "http://10.0.0.1:1"}, format="json").status_code == 405
    assert client.delete(detail).status_code == 405


# -- later: the health check and the benchmark ---------------------------------------------------------------
def test_the_health_check_fails_a_ready_replica_whose_url_serves_html_and_does_not_crash(world, clean_redis):
    with fake_server("html_health", model=world.a.endpoint.name) as url:
        # Attached when it was vLLM; the address now answers a web server's page.
        replica = ReplicaFactory(endpoint=world.a.endpoint, url=url, state=ReplicaState.READY, actuator="static")
        config = HealthConfig(idle_after_s=0, failures_to_fail=1, ttft_timeout_s=2.0)
        report = health_check_cycle(config=config, endpoint_ids=[world.a.endpoint.pk])
    (check,) = report.checks
    assert check.probed and not check.result.ok
    assert "not an SSE stream: not vLLM" in check.result.error and "text/html" in check.result.error
    replica.refresh_from_db()
    assert replica.state == ReplicaState.FAILED and "not an SSE stream" in replica.failure_reason
    assert check.restart.startswith("unavailable: an attached replica")  # said, not raised or logged as an error


@pytest.mark.parametrize(("kind", "says"), [("html_health", "HTML page"), ("no_metrics", "/metrics answered 404")])
def test_benchmarking_a_url_that_is_not_vllm_fails_clearly_and_records_why(world, kind, says):
    with fake_server(kind, model=world.a.endpoint.name) as url:
        with pytest.raises(BenchmarkError, match="is not a vLLM server to benchmark") as failed:
            benchmark_run(endpoint=world.a.endpoint, url=url, quick=True)
        assert says in str(failed.value)
        with pytest.raises(CommandError, match=f"benchmark failed: {url} is not a vLLM server"):
            call_command("benchmark_replica", "--endpoint", world.a.endpoint.name, "--url", url, stderr=StringIO())
    recorded = CapacityBenchmark.objects.filter(status=CapacityBenchmark.Status.FAILED)
    assert recorded.count() == 2 and all("not a vLLM server" in b.detail.get("error", "") for b in recorded)
