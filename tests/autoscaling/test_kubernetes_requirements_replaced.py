# ruff: noqa: F811 - the fixtures imported from the other Kubernetes tests are parameters here
"""The requirements the actuator writes into the template Deployment when it scales from zero do not leak into the
Deployments copied from it (a spot pool, a version), and a from-zero write takes out what the launch no longer needs:
each Deployment's pods carry exactly its own launch's requirements, the ones the room counts
(placement/node_requirements.py, docs/placement.md "In the ledger")."""

import httpx
import kubernetes_validate

from capacity.autoscaling.actuators.base import version_endpoint
from capacity.autoscaling.actuators.kubernetes_objects import launch_requirements
from capacity.autoscaling.services import pool_endpoint
from capacity.models import HardwareProfile
from endpoints.models import Endpoint, EndpointVersion
from endpoints.rollouts import services as versions
from placement.node_requirements import ADDED_ANNOTATION, GPU_PRODUCT_LABEL, NodeRequirements
from tests.autoscaling.test_kubernetes_gang import DEPLOY, NS, actuator, gang, gang_endpoint  # noqa: F401 - a fixture
from tests.autoscaling.test_kubernetes_gang import ApiServer as GangServer
from tests.factories import HardwareProfileFactory

H100 = "NVIDIA-H100-80GB-HBM3"
TEAM_X = {"key": "dedicated", "operator": "Equal", "value": "team-x", "effect": "NoSchedule"}
SPOT_TOLERATION = {"key": "spot", "operator": "Exists"}
DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NS}/deployments"


class ApiServer(GangServer):
    """The gang tests' API server, which also creates Deployments (a version's, a spot pool's)."""

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path == DEPLOYMENTS:
            body = httpx.Response(200, content=request.content).json()
            self.requests.append(("POST", DEPLOYMENTS, body))
            if body["metadata"]["name"] in self.deployments:
                return httpx.Response(409, json={"message": "already exists"})
            self.deployments[body["metadata"]["name"]] = body
            return httpx.Response(201, json=body)
        return super().handle(request)


def exactly(deployment: dict, needs: NodeRequirements) -> tuple[dict, list]:
    """The pod template's node selector and tolerations, and those ``needs`` gives (the template has none)."""
    spec = deployment["spec"]["template"]["spec"]
    got = (spec.get("nodeSelector") or {}, spec.get("tolerations") or [])
    return got, (dict(needs.node_selector), [t.spec for t in needs.tolerations])


def on_h100(tenant, options: dict) -> Endpoint:
    """A one-GPU endpoint on an H100 profile, no gang scheduler: the template Deployment's own pods."""
    served = gang_endpoint(tenant, gpus=1, per_node=8, domain=8, label="kubernetes.io/hostname")
    HardwareProfile.objects.filter(pk=served.hardware_profile_id).update(gpu_product=H100)
    Endpoint.objects.filter(pk=served.pk).update(launch_options={**served.launch_options, **options})
    served.refresh_from_db()
    versions.ensure_current_version(served)
    served.refresh_from_db()
    return served


def test_a_spot_pool_created_after_an_on_demand_launch_from_zero_inherits_nothing(db, tenant_a, gang):
    gang("none")
    served = on_h100(tenant_a, {"tolerations": [TEAM_X], "spot_tolerations": [SPOT_TOLERATION]})
    spot = HardwareProfileFactory(
        name="any-spot", gpus_per_replica=1, capacity_type=HardwareProfile.CapacityType.SPOT, usd_per_gpu_hour=0.9
    )  # no gpu_product: any GPU node the spot selector admits
    Endpoint.objects.filter(pk=served.pk).update(spot_hardware_profile=spot)
    served.refresh_from_db()
    server = ApiServer(served.pk)
    actuator(server).launch(served, 1)  # from zero: the template Deployment gets the H100 selector
    template = server.deployments[DEPLOY]
    assert template["spec"]["template"]["spec"]["nodeSelector"] == {GPU_PRODUCT_LABEL: H100}
    pool = pool_endpoint(served, spot)
    actuator(server).launch(pool, 1)
    created = server.deployments[f"{DEPLOY}-spot"]
    got, wanted = exactly(created, launch_requirements(pool))
    assert got == wanted, "the spot pool's own requirements, not the on-demand profile's model too"
    assert got == ({"karpenter.sh/capacity-type": "spot"}, [TEAM_X, SPOT_TOLERATION])
    kubernetes_validate.validate(created, "1.32", strict=True)
    # The on-demand Deployment, launched from zero again, still carries its own.
    template["spec"]["replicas"] = 0
    actuator(server).launch(served, 1)
    assert exactly(template, launch_requirements(served))[0] == ({GPU_PRODUCT_LABEL: H100}, [TEAM_X])


def test_a_version_whose_options_drop_a_selector_key_and_a_toleration_runs_without_them(db, settings, tenant_a, gang):
    gang("none")
    settings.INFERCAP = {**settings.INFERCAP, "KUBERNETES_API_URL": "https://k8s.test"}  # the version's check
    served = on_h100(tenant_a, {"node_selector": {"pool": "inference", "zone": "eu-1a"}, "tolerations": [TEAM_X]})
    server = ApiServer(served.pk)
    actuator(server).launch(served, 1)
    assert server.deployments[DEPLOY]["spec"]["template"]["spec"]["nodeSelector"]["zone"] == "eu-1a"
    options = {**served.launch_options, "node_selector": {"pool": "inference"}}
    del options["tolerations"]
    v2 = versions.create_version(endpoint=served, launch_options=options)
    view = version_endpoint(served, v2)
    actuator(server).launch(view, 1)
    created = server.deployments[f"{DEPLOY}-v2"]
    got, wanted = exactly(created, launch_requirements(view))
    assert got == wanted == ({GPU_PRODUCT_LABEL: H100, "pool": "inference"}, []), "no zone, no team-x toleration"
    kubernetes_validate.validate(created, "1.32", strict=True)


def test_a_deployment_scaled_from_zero_loses_what_its_launch_no_longer_needs(db, tenant_a, gang):
    gang("none")
    served = on_h100(tenant_a, {"node_selector": {"pool": "inference"}})
    server = ApiServer(served.pk)
    actuator(server).launch(served, 1)
    template = server.deployments[DEPLOY]
    assert template["spec"]["template"]["spec"]["nodeSelector"] == {GPU_PRODUCT_LABEL: H100, "pool": "inference"}
    # Scaled to zero; the operator takes the product off the profile and the selector off the options.
    template["spec"]["replicas"] = 0
    HardwareProfile.objects.filter(pk=served.hardware_profile_id).update(gpu_product="")
    options = {k: v for k, v in served.launch_options.items() if k != "node_selector"}
    Endpoint.objects.filter(pk=served.pk).update(launch_options=options)
    EndpointVersion.objects.filter(pk=served.current_version_id).update(launch_options=options)
    served.refresh_from_db()
    assert launch_requirements(served) == NodeRequirements()
    actuator(server).launch(served, 1)
    pod = template["spec"]["template"]
    assert "nodeSelector" not in pod["spec"], "a merge patch of the new template alone would have kept both keys"
    assert ADDED_ANNOTATION not in (pod["metadata"].get("annotations") or {})
    assert template["spec"]["replicas"] == 1
    kubernetes_validate.validate(template, "1.32", strict=True)
