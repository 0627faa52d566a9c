"""What actuators name after an endpoint comes from its id, never from the tenant-chosen endpoint name: two names
that normalise alike (``Llama.3.70B``, ``llama_3_70b``) must not share a Deployment or a log file."""

import pytest
from django.urls import reverse

from capacity.autoscaling.actuators import kubernetes_objects
from capacity.autoscaling.actuators.local import LocalActuator
from tests.conftest import client_for
from tests.factories import EndpointFactory, HardwareProfileFactory, ModelProfileFactory

pytestmark = pytest.mark.django_db


def test_colliding_endpoint_names_get_distinct_deployments():
    first = EndpointFactory(name="Llama.3.70B", launch_options={"actuator": "kubernetes"})
    second = EndpointFactory(name="llama_3_70b", launch_options={"actuator": "kubernetes"})
    names = {kubernetes_objects.deployment_name(first), kubernetes_objects.deployment_name(second)}
    assert names == {f"infercap-ep-{first.pk}", f"infercap-ep-{second.pk}"}
    assert kubernetes_objects.standby_deployment_name(first) == f"infercap-ep-{first.pk}-standby"
    assert kubernetes_objects.version_deployment_name(first, 3) == f"infercap-ep-{first.pk}-v3"
    assert kubernetes_objects.version_deployment_name(first, 1) == f"infercap-ep-{first.pk}"


def test_an_operator_named_deployment_is_kept():
    endpoint = EndpointFactory(launch_options={"actuator": "kubernetes", "deployment": "llama-13b"})
    assert kubernetes_objects.deployment_name(endpoint) == "llama-13b"


@pytest.mark.parametrize("name", ["Llama.3", "llama_3", "has space", "-lead", "x" * 64])
def test_operator_deployment_names_must_be_kubernetes_names_not_rewritten(operator, name):
    response = client_for(operator).post(
        reverse("endpoint-list"),
        {
            "name": "k8s-probe",
            "model_profile": ModelProfileFactory().pk,
            "hardware_profile": HardwareProfileFactory().pk,
            "launch_options": {"actuator": "kubernetes", "deployment": name},
        },
        format="json",
    )
    assert response.status_code == 400, response.content
    assert "Kubernetes name" in str(response.json()["launch_options"])


def test_local_replica_logs_are_named_by_endpoint_id(tmp_path, settings, monkeypatch, reap_local_replicas):
    """Two endpoints whose names differ only in '/' vs '_' wrote to one log file before."""
    settings.INFERCAP = {**settings.INFERCAP, "SPOOL_DIR": str(tmp_path / "spool")}
    monkeypatch.setattr("capacity.autoscaling.actuators.local.replica_argv", lambda e, port, **kw: ["true"])
    first = EndpointFactory(name="team/model", launch_options={"actuator": "local"})
    second = EndpointFactory(name="team_model", launch_options={"actuator": "local"})
    actuator = LocalActuator()
    replicas = actuator.launch(first, 1) + actuator.launch(second, 1)
    logs = sorted(p.name for p in (tmp_path / "replicas").iterdir())
    assert logs == sorted(f"endpoint-{r.endpoint_id}-{r.name}.log" for r in replicas)
    actuator.terminate(replicas, reason="test")
