"""A disaggregated endpoint on Kubernetes: its prefill and decode pools run in Deployments of their own, copied from
the template with the role's label and the engine's ``--kv-transfer-config`` (NIXL), their pods registered in
their role and scaled apart (the fake API server of test_kubernetes_versions.py)."""

from collections import Counter

import pytest

from capacity.autoscaling.actuators import ActuatorError
from capacity.autoscaling.actuators.kubernetes_objects import PD_ROLE
from capacity.autoscaling.services import pool_endpoint
from endpoints.models import Endpoint, ReplicaState
from tests.autoscaling.test_kubernetes_versions import cluster, endpoint, k8s  # noqa: F401 - fixtures


def test_each_pool_runs_in_its_own_deployment_with_its_role(db, clean_store, cluster, k8s, endpoint):  # noqa: F811
    Endpoint.objects.filter(pk=endpoint.pk).update(
        serving_mode="disaggregated", kv_connector="nixl", prefill_launch_options={"max_num_seqs": 4}
    )
    endpoint.refresh_from_db()
    k8s.launch(pool_endpoint(endpoint, None, role="prefill"), 1)
    k8s.launch(pool_endpoint(endpoint, None, role="decode"), 2)
    created = {body["metadata"]["name"]: body for method, _, body in cluster.requests if method == "POST"}
    assert set(created) == {"llama-13b-prefill", "llama-13b-decode"}
    for role in ("prefill", "decode"):
        spec = created[f"llama-13b-{role}"]["spec"]
        assert spec["selector"]["matchLabels"] == {"app": "llama-13b", "infercap/role": "replica", PD_ROLE: role}
        assert spec["template"]["metadata"]["labels"][PD_ROLE] == role
        args = spec["template"]["spec"]["containers"][0]["args"]
        assert args[:3] == ["meta-llama/Llama-2-13b-chat-hf", "--served-model-name=llama-13b", "--port=8000"]
        nixl = '{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_load_failure_policy":"recompute"}'
        assert args[3:] == [f"--kv-transfer-config={nixl}"]
    assert (cluster.replicas("llama-13b-prefill"), cluster.replicas("llama-13b-decode")) == (1, 2)

    k8s.sync(endpoint)
    live = endpoint.replicas.filter(state=ReplicaState.READY)
    assert Counter(live.values_list("role", flat=True)) == {"mixed": 2, "prefill": 1, "decode": 2}
    assert all(r.name.startswith("llama-13b-prefill-") for r in live.filter(role="prefill"))
    k8s.launch(pool_endpoint(endpoint, None, role="decode"), 1)  # registered pods count: one more, not three
    assert cluster.replicas("llama-13b-decode") == 3

    # one pool scales in without touching the other
    k8s.terminate(list(live.filter(role="prefill")), reason="scale in")
    assert (cluster.replicas("llama-13b-prefill"), cluster.replicas("llama-13b-decode")) == (0, 3)
    assert cluster.replicas("llama-13b") == 2


def test_a_pool_needs_nixl_and_no_spot(db, clean_store, cluster, k8s, endpoint):  # noqa: F811
    Endpoint.objects.filter(pk=endpoint.pk).update(serving_mode="disaggregated", kv_connector="shared_storage")
    endpoint.refresh_from_db()
    with pytest.raises(ActuatorError, match="with nixl"):
        k8s.launch(pool_endpoint(endpoint, None, role="decode"), 1)
    assert "llama-13b-decode" not in cluster.deployments
    with pytest.raises(ActuatorError, match="spot"):
        k8s.launch(pool_endpoint(endpoint, endpoint.hardware_profile, role="decode"), 1)
