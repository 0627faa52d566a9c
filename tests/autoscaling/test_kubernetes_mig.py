# ruff: noqa: F811 - the fixtures imported from the other Kubernetes tests are parameters here
"""MIG slices on Kubernetes (placement/mig.py, docs/placement.md "MIG slices"): a MIG profile's pod asks for
one slice as the device plugin's strategy names it (``nvidia.com/mig-<profile>`` and no ``nvidia.com/gpu`` under
mixed; ``nvidia.com/gpu`` on nodes whose product label names the slice under single), is never a LeaderWorkerSet,
and validates strictly; the room counts each node's allocatable slices less what live pods ask of them, on the nodes
the endpoint's requirements admit; an unknown strategy fails the launch with a message naming the setting."""

import copy

import jsonschema
import kubernetes_validate
import pytest

from capacity.autoscaling.actuators import ActuatorError
from capacity.autoscaling.actuators.free_gpus import free_gpus
from capacity.autoscaling.actuators.gang import (
    GPU,
    Gang,
    one_gpu_template,
    replica_objects,
    single_node_template,
    volcano_pod_group,
)
from capacity.autoscaling.actuators.kubernetes_room import cluster_from, kubernetes_room, refresh_room, snapshot
from capacity.autoscaling.services import pool_endpoint
from capacity.ledger import capacity_ledger
from endpoints.models import Endpoint, ReplicaState
from placement import mig
from placement.node_requirements import GPU_PRODUCT_LABEL, endpoint_requirements
from tests.autoscaling.test_gang_objects import POD, POD_GROUP_SCHEMA, _valid_pod_template
from tests.autoscaling.test_kubernetes_gang import (
    DEPLOY,
    LWS_PATH,
    NS,
    PG_PATH,
    ApiServer,
    actuator,
    gang,  # noqa: F401 - a fixture
)
from tests.autoscaling.test_kubernetes_room import ApiServer as RoomServer
from tests.autoscaling.test_kubernetes_room import api, node, pod, room_store  # noqa: F401
from tests.autoscaling.test_kubernetes_versions import cluster, endpoint, k8s  # noqa: F401
from tests.factories import HardwareProfileFactory

A100 = "NVIDIA-A100-SXM4-80GB"
SLICE = "nvidia.com/mig-1g.10gb"
SINGLE_PRODUCT = f"{A100}-MIG-1g.10gb"
TEAM_X = {"key": "dedicated", "value": "team-x", "effect": "NoSchedule"}


def use_strategy(settings, strategy: str) -> None:
    settings.INFERCAP = {**settings.INFERCAP, "KUBERNETES_MIG_STRATEGY": strategy}


def mig_endpoint(tenant, *, profile: str = "1g.10gb", product: str = A100) -> Endpoint:
    hardware = HardwareProfileFactory(
        name=f"a100-{profile}", gpus_per_replica=1, gpu_product=product, mig_profile=profile, gpu_memory_gb=10
    )
    Endpoint.objects.filter(pk=tenant.endpoint.pk).update(
        hardware_profile=hardware, launch_options={"actuator": "kubernetes", "namespace": NS, "deployment": DEPLOY}
    )
    return Endpoint.objects.get(pk=tenant.endpoint.pk)


def engine(deployment: dict) -> dict:
    return deployment["spec"]["template"]["spec"]["containers"][0]["resources"]


# -- the objects ------------------------------------------------------------------------------------------------
def test_a_slice_pod_asks_for_the_slice_and_no_whole_gpu_and_validates():
    with_requests = copy.deepcopy(POD)
    with_requests["spec"]["containers"][0]["resources"]["requests"][GPU] = 1  # a template that requests GPUs too
    for template in (POD, with_requests):
        pod_ = single_node_template(template, gpus=1, gang=Gang(gpus_per_node=1, domain_gpus=1, resource=SLICE))
        _valid_pod_template(pod_)
        resources = pod_["spec"]["containers"][0]["resources"]
        assert resources["limits"][SLICE] == 1 and GPU not in resources["limits"]
        assert GPU not in resources["requests"]
        assert (SLICE in resources["requests"]) == (template is with_requests)
        assert resources["limits"]["cpu"] == "12", "the template's other resources stay"
    # Back to whole GPUs: the slice goes, the GPUs come back
    whole = single_node_template(pod_, gpus=2, gang=Gang())
    assert whole["spec"]["containers"][0]["resources"]["limits"][GPU] == 2
    assert SLICE not in whole["spec"]["containers"][0]["resources"]["limits"]


def test_a_volcano_pod_group_counts_slices_and_a_slice_is_never_a_leader_worker_set():
    group = volcano_pod_group(
        name="g", namespace=NS, labels={}, members=1, gpus=1, queue="q", resource="nvidia.com/mig-3g.40gb"
    )
    jsonschema.validate(group, POD_GROUP_SCHEMA)
    assert group["spec"]["minResources"] == {"nvidia.com/mig-3g.40gb": "1"}
    gang_ = Gang(scheduler="volcano", gpus_per_node=1, domain_gpus=1, resource=SLICE)
    with pytest.raises(ActuatorError, match="fits one node"):
        replica_objects(name="g", namespace=NS, labels={}, pod=POD, gpus=1, gang=gang_)


# -- the actuator -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scheduler", ["none", "kueue", "volcano"])
def test_under_mixed_a_mig_launch_asks_for_one_slice_on_the_gpus_own_product(db, tenant_a, gang, settings, scheduler):
    gang(scheduler)
    use_strategy(settings, "mixed")
    endpoint = mig_endpoint(tenant_a)
    server = ApiServer(endpoint.pk)
    actuator(server).launch(endpoint, 2)
    deployment = server.deployments[DEPLOY]
    kubernetes_validate.validate(deployment, "1.32", strict=True)
    assert engine(deployment)["limits"][SLICE] == 1
    assert GPU not in engine(deployment)["limits"] and GPU not in engine(deployment).get("requests", {})
    assert deployment["spec"]["template"]["spec"]["nodeSelector"][GPU_PRODUCT_LABEL] == A100
    assert deployment["spec"]["replicas"] == 2
    assert not server.sent("POST", LWS_PATH) and not server.sent("POST", PG_PATH), "one pod, one slice"
    assert ("kueue.x-k8s.io/queue-name" in deployment["metadata"]["labels"]) == (scheduler == "kueue")
    assert (deployment["spec"]["template"]["spec"].get("schedulerName") == "volcano") == (scheduler == "volcano")


def test_under_single_a_mig_launch_asks_for_a_gpu_on_nodes_labelled_with_the_slice(db, tenant_a, gang, settings):
    gang("none")
    use_strategy(settings, "single")
    endpoint = mig_endpoint(tenant_a)
    server = ApiServer(endpoint.pk)
    actuator(server).launch(endpoint, 1)
    deployment = server.deployments[DEPLOY]
    kubernetes_validate.validate(deployment, "1.32", strict=True)
    assert engine(deployment)["limits"][GPU] == 1
    assert not [key for key in engine(deployment)["limits"] if key.startswith("nvidia.com/mig-")]
    assert deployment["spec"]["template"]["spec"]["nodeSelector"][GPU_PRODUCT_LABEL] == SINGLE_PRODUCT


def test_a_template_a_mig_launch_wrote_asks_for_a_whole_gpu_again_once_the_profile_is_whole(
    db, tenant_a, gang, settings
):
    gang("none")
    use_strategy(settings, "mixed")
    endpoint = mig_endpoint(tenant_a)
    server = ApiServer(endpoint.pk)
    k8s = actuator(server)
    k8s.launch(endpoint, 1)
    assert SLICE in engine(server.deployments[DEPLOY])["limits"]
    server.deployments[DEPLOY]["spec"]["replicas"] = 0  # scaled in: no pod to roll
    whole = HardwareProfileFactory(name="a100-whole", gpus_per_replica=1, gpu_product=A100)
    Endpoint.objects.filter(pk=endpoint.pk).update(hardware_profile=whole)
    k8s.launch(Endpoint.objects.get(pk=endpoint.pk), 1)
    limits = engine(server.deployments[DEPLOY])["limits"]
    assert limits[GPU] == 1 and SLICE not in limits
    kubernetes_validate.validate(server.deployments[DEPLOY], "1.32", strict=True)


@pytest.mark.parametrize("pool", ["spot", "prefill"])
def test_a_whole_gpu_pool_copied_from_a_template_a_mig_launch_wrote_asks_for_a_whole_gpu(
    db, clean_store, cluster, k8s, endpoint, settings, pool
):
    # The endpoint's own replicas are slices; its spot or prefill pool is on whole GPUs. The pool's Deployment is
    # copied from the template the endpoint's MIG launch wrote: it must not keep the slice's resource.
    use_strategy(settings, "mixed")
    sliced = HardwareProfileFactory(name="a100-slice", gpus_per_replica=1, gpu_product=A100, mig_profile="1g.10gb")
    whole = HardwareProfileFactory(name="a100-whole", gpus_per_replica=1, gpu_product=A100)
    pools = {"spot_hardware_profile": whole} if pool == "spot" else {"serving_mode": "disaggregated",
             "kv_connector": "nixl", "prefill_hardware_profile": whole}  # fmt: skip
    Endpoint.objects.filter(pk=endpoint.pk).update(hardware_profile=sliced, **pools)
    endpoint.refresh_from_db()
    template = cluster.deployments["llama-13b"]  # as the endpoint's own MIG launch left it
    template["spec"]["template"] = single_node_template(
        template["spec"]["template"], gpus=1, gang=Gang(gpus_per_node=1, domain_gpus=1, resource=SLICE)
    )
    k8s.launch(pool_endpoint(endpoint, whole if pool == "spot" else None, role=pool if pool == "prefill" else None), 1)
    ((name, body),) = [(b["metadata"]["name"], b) for m, _, b in cluster.requests if m == "POST"]
    limits = engine(body)["limits"]
    assert limits[GPU] == 1 and SLICE not in limits, (name, limits)
    kubernetes_validate.validate(body, "1.32", strict=True)


@pytest.mark.parametrize("pool", ["spot", "prefill"])
def test_a_one_gpu_pool_copied_from_a_gang_placed_8_gpu_template_asks_for_one_gpu_and_no_gang(
    db, clean_store, cluster, k8s, endpoint, pool
):
    # A TP-8 endpoint's template, as a launch under Volcano on an NVL72 rack placed it; its spot or prefill pool is
    # one GPU a replica with no gang scheduler now. The copy must not ask for 8 GPUs (7 paid for and idle, and the
    # ledger counting 1) nor keep the rack's affinity and Volcano's scheduler; an operator's own affinity stays.
    eight = HardwareProfileFactory(name="h100x8", gpus_per_replica=8, gpu_product="NVIDIA-H100-80GB-HBM3")
    one = HardwareProfileFactory(name="h100x1", gpus_per_replica=1, gpu_product="NVIDIA-H100-80GB-HBM3")
    pools = {"spot_hardware_profile": one} if pool == "spot" else {"serving_mode": "disaggregated",
             "kv_connector": "nixl", "prefill_hardware_profile": one}  # fmt: skip
    Endpoint.objects.filter(pk=endpoint.pk).update(hardware_profile=eight, **pools)
    endpoint.refresh_from_db()
    template = cluster.deployments["llama-13b"]
    placed = single_node_template(
        template["spec"]["template"], gpus=8, gang=Gang(scheduler="volcano", domain_label="nvidia.com/gpu.clique")
    )
    own = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 10, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                           "labelSelector": {"matchLabels": {"app": "llama"}}}}]}}  # fmt: skip
    placed["spec"]["affinity"].update(own)
    template["spec"]["template"] = placed
    assert engine(template)["limits"][GPU] == 8 and placed["spec"]["schedulerName"] == "volcano"
    k8s.launch(pool_endpoint(endpoint, one if pool == "spot" else None, role=pool if pool == "prefill" else None), 1)
    ((name, body),) = [(b["metadata"]["name"], b) for m, _, b in cluster.requests if m == "POST"]
    pod = body["spec"]["template"]
    assert engine(body)["limits"][GPU] == 1, name
    assert pod["spec"]["affinity"] == own and "schedulerName" not in pod["spec"]
    assert not set(pod["metadata"].get("annotations") or {}) & {"scheduling.volcano.sh/queue-name"}
    kubernetes_validate.validate(body, "1.32", strict=True)


def test_one_gpu_template_takes_out_only_what_the_gang_placement_wrote():
    """An operator's own template of the same shape (a GPU-presence affinity, Volcano as their scheduler) is not the
    platform's to undo; a quantity the API server answers as a string is already one GPU."""
    own = copy.deepcopy(POD)
    own["spec"]["containers"][0]["resources"] = {"limits": {GPU: "1"}}
    own["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "Exists"}]}]}}}  # fmt: skip
    own["spec"]["schedulerName"] = "volcano"
    own.setdefault("metadata", {})["annotations"] = {"scheduling.volcano.sh/queue-name": "team-x"}
    assert one_gpu_template(own) is own  # nothing to change: no PATCH
    placed = single_node_template(own, gpus=4, gang=Gang(scheduler="volcano", domain_label="nvidia.com/gpu.clique"))
    back = one_gpu_template(placed)
    assert back["spec"]["containers"][0]["resources"]["limits"] == {GPU: 1}
    assert "affinity" not in back["spec"] and "schedulerName" not in back["spec"]
    assert back["metadata"]["annotations"] == {}


def test_an_unknown_strategy_fails_the_launch_by_name_but_not_the_sync(db, tenant_a, gang, settings):
    gang("none")
    use_strategy(settings, "mixed")
    endpoint = mig_endpoint(tenant_a)
    server = ApiServer(endpoint.pk)
    k8s = actuator(server)
    k8s.launch(endpoint, 1)
    server._pod("ep-abc", server.deployments[DEPLOY]["spec"]["template"], {})
    use_strategy(settings, "mig-everywhere")
    sent = len([r for r in server.requests if r[0] != "GET"])
    with pytest.raises(ActuatorError, match=r"KUBERNETES_MIG_STRATEGY.*'mig-everywhere' is not one of mixed, single"):
        k8s.launch(endpoint, 1)
    assert len([r for r in server.requests if r[0] != "GET"]) == sent, "nothing written"
    k8s.sync(endpoint)  # what runs is still registered
    assert endpoint.replicas.get().state == ReplicaState.READY
    # A whole-GPU endpoint is not held up by the MIG setting
    whole = HardwareProfileFactory(name="a100-whole", gpus_per_replica=1, gpu_product=A100)
    assert endpoint_requirements({}, whole, mig_strategy="mig-everywhere").resource == GPU


def test_the_single_strategy_needs_the_profiles_product():
    hardware = HardwareProfileFactory.build(name="any-mig", gpus_per_replica=1, gpu_product="", mig_profile="1g.10gb")
    assert endpoint_requirements({}, hardware, mig_strategy="mixed").node_selector == ()
    with pytest.raises(ValueError, match="must name its gpu_product"):
        endpoint_requirements({}, hardware, mig_strategy="single")


# -- the room ---------------------------------------------------------------------------------------------------
def mig_node(name: str, *, gpus: int = 0, slices: dict, product: str = A100, taints=None, **kw) -> dict:
    body = node(name, gpus, labels={GPU_PRODUCT_LABEL: product}, **kw)
    body["status"]["allocatable"].update({f"nvidia.com/mig-{p}": str(n) for p, n in slices.items()})
    if taints:
        body["spec"]["taints"] = taints
    return body


def slice_pod(name: str, node_name: str, resource: str, count: int, *, requests: bool = False) -> dict:
    body = pod(name, node_name, 0)
    body["spec"]["containers"][0]["resources"] = {
        "limits": {resource: str(count)},
        **({"requests": {resource: str(count)}} if requests else {}),
    }
    return body


@pytest.fixture
def mig_cluster() -> RoomServer:
    """a100-cut: every GPU cut (mixed), 7 × 1g.10gb, 3 held by two pods; a100-part: 4 whole GPUs (1 held) and
    14 × 1g.10gb, 2 × 3g.40gb (1 held); a100-mig-taint: 7 × 1g.10gb, tainted for the slice resource (a pod asking
    for it tolerates that); a100-team-x: 7 × 1g.10gb for another team; a100-cordoned: 7 × 1g.10gb, cordoned; l40s: 8
    whole GPUs of another model."""
    nodes = [
        mig_node("a100-cut", slices={"1g.10gb": 7}),
        mig_node("a100-part", gpus=4, slices={"1g.10gb": 14, "3g.40gb": 2}),
        mig_node("a100-mig-taint", slices={"1g.10gb": 7}, taints=[{"key": SLICE, "effect": "NoSchedule"}]),
        mig_node("a100-team-x", slices={"1g.10gb": 7}, taints=[TEAM_X]),
        mig_node("a100-cordoned", slices={"1g.10gb": 7}, cordoned=True),
        node("l40s", 8, labels={GPU_PRODUCT_LABEL: "NVIDIA-L40S"}),
    ]
    pods = [
        slice_pod("small-a", "a100-cut", SLICE, 2),
        slice_pod("small-b", "a100-cut", SLICE, 1, requests=True),
        slice_pod("big", "a100-part", "nvidia.com/mig-3g.40gb", 1),
        pod("whole", "a100-part", 1),
        slice_pod("done", "a100-cut", SLICE, 4) | {"status": {"phase": "Succeeded"}},
    ]
    return RoomServer(nodes, pods)


def test_the_room_counts_free_slices_on_the_nodes_the_endpoint_may_use(db, room_store, tenant_a, mig_cluster):
    small = mig_endpoint(tenant_a)
    published = refresh_room(api=api(mig_cluster))
    assert [n["name"] for n in published["nodes"]] == ["a100-part", "l40s"], "nodes with whole GPUs, as before"
    assert [n["name"] for n in published["slice_nodes"]] == ["a100-cut", "a100-mig-taint", "a100-team-x"]
    assert published["held_slices"] == {"a100-cut": {"1g.10gb": 3}, "a100-part": {"3g.40gb": 1}}
    published_, room = kubernetes_room()
    assert published_ and room.free_count() == 3 + 8, "whole GPUs only: a slice is not a GPU"
    needs = endpoint_requirements(small.launch_options, small.hardware_profile, mig_strategy="mixed")
    # a100-cut's 4 free, a100-part's 14, a100-mig-taint's 7; not team-x's node, not the cordoned one
    assert room.slices_free(needs, "1g.10gb") == 4 + 14 + 7
    assert room.slices_free(needs, "3g.40gb") == 1
    assert room.slices_free(needs, "2g.20gb") == 0
    l40s = HardwareProfileFactory(
        name="l40s-mig", gpus_per_replica=1, gpu_product="NVIDIA-L40S", mig_profile="1g.10gb"
    )
    assert room.slices_free(endpoint_requirements({}, l40s), "1g.10gb") == 0, "no slice on another model's node"
    tolerant = endpoint_requirements(
        {"tolerations": [{"key": "dedicated", "operator": "Exists"}]}, small.hardware_profile
    )
    assert room.slices_free(tolerant, "1g.10gb") == 4 + 14 + 7 + 7
    with pytest.raises(ValueError, match="'both' is not one of mixed, single"):
        room.slices_free(needs, "1g.10gb", "both")


def test_under_single_the_slices_are_the_gpus_of_nodes_labelled_with_the_slice(db, room_store, tenant_a):
    small = mig_endpoint(tenant_a)
    nodes = [
        node("a100-single", 28, labels={GPU_PRODUCT_LABEL: SINGLE_PRODUCT}),  # 4 GPUs of 7 slices each
        node("a100-whole", 8, labels={GPU_PRODUCT_LABEL: A100}),
    ]
    refresh_room(api=api(RoomServer(nodes, [pod("small-a", "a100-single", 3), pod("whole", "a100-whole", 2)])))
    _, room = kubernetes_room()
    needs = endpoint_requirements(small.launch_options, small.hardware_profile, mig_strategy="single")
    assert needs.node_selector == ((GPU_PRODUCT_LABEL, SINGLE_PRODUCT),)
    assert room.slices_free(needs, "1g.10gb", "single") == 25, "not a100-whole's 6 free GPUs"


def test_a_room_published_before_slices_were_read_still_reads(mig_cluster):
    live = [p for p in mig_cluster.items["/api/v1/pods"] if p["status"]["phase"] == "Running"]
    room = snapshot(mig_cluster.items["/api/v1/nodes"], live, domain_labels=[], label_keys=[GPU_PRODUCT_LABEL])
    old = {
        "nodes": [{k: v for k, v in n.items() if k != "slices"} for n in room["nodes"]],
        "held": room["held"],
        "label_keys": room["label_keys"],
    }
    before = cluster_from(old)
    assert before.free_count() == 3 + 8 and before.mig_free == {}
    hardware = HardwareProfileFactory.build(
        name="a100-mig", gpus_per_replica=1, gpu_product=A100, mig_profile="1g.10gb"
    )
    needs = endpoint_requirements({}, hardware)
    assert before.slices_free(needs, "1g.10gb") is None, "slices not read then: unknown, not 0"
    assert cluster_from(room).slices_free(needs, "1g.10gb") == 4 + 14 + 7
    assert cluster_from(room).mig_free == {"1g.10gb": 4 + 14 + 7 + 7, "3g.40gb": 1}
    # Nothing but fully cut nodes: still a room (no whole GPU free), not "no GPU node"
    only_cut = {**room, "nodes": [], "held": {}}
    assert cluster_from(only_cut).free_count() == 0 and cluster_from(only_cut).slices_free(needs, "1g.10gb") == 4 + 7


def test_a_mig_pod_the_actuator_writes_is_what_the_room_counts(db, tenant_a, gang, settings):
    gang("none")
    use_strategy(settings, "mixed")
    endpoint = mig_endpoint(tenant_a)
    server = ApiServer(endpoint.pk)
    actuator(server).launch(endpoint, 1)
    emitted = {"spec": {**copy.deepcopy(server.deployments[DEPLOY]["spec"]["template"]["spec"]), "nodeName": "a"}}
    room = snapshot(
        [mig_node("a", slices={"1g.10gb": 7})], [emitted], domain_labels=[], label_keys=[GPU_PRODUCT_LABEL]
    )
    assert room["held_slices"] == {"a": {"1g.10gb": 1}} and room["held"] == {}


def test_the_ledger_counts_a_mig_rows_room_in_its_profiles_free_slices(
    db, room_store, tenant_a, mig_cluster, settings
):
    small = mig_endpoint(tenant_a)
    refresh_room(api=api(mig_cluster))
    settings.INFERCAP = {**settings.INFERCAP, "AUTOSCALE_ACTUATOR": "kubernetes", "KUBERNETES_MIG_STRATEGY": "mixed"}
    ledger = capacity_ledger(endpoints=Endpoint.objects.filter(pk=small.pk), free_gpus=free_gpus())
    (row,) = ledger.endpoints
    assert (row.mig_slice, row.replica_gpus, row.whole_replicas_free) == ("1g.10gb", 1, 4 + 14 + 7)
    assert ledger.total["free_gpus"] == 3 + 8, "a slice is never a free GPU"
    assert ledger.total["free_mig_slices"]["3g.40gb"] == 1
    # A strategy that does not read leaves the row's room unknown: the launch says why, the ledger shows no figure.
    settings.INFERCAP = {**settings.INFERCAP, "KUBERNETES_MIG_STRATEGY": "both"}
    (row,) = capacity_ledger(endpoints=Endpoint.objects.filter(pk=small.pk), free_gpus=free_gpus()).endpoints
    assert row.whole_replicas_free is None


def test_a_media_extension_slice_is_named_as_the_device_plugin_spells_it(db, room_store, tenant_a):
    """A resource name takes no "+": the device plugin advertises 1g.10gb+me as nvidia.com/mig-1g.10gb.me, and the
    room reads it back as the profile's own name."""
    small = mig_endpoint(tenant_a, profile="1g.10gb+me")
    assert mig.resource_name("1g.10gb+me", "mixed") == "nvidia.com/mig-1g.10gb.me"
    assert mig.profile_of_resource("nvidia.com/mig-1g.10gb.me") == "1g.10gb+me"
    refresh_room(api=api(RoomServer([mig_node("a100-me", slices={"1g.10gb.me": 7})], [])))
    _, room = kubernetes_room()
    needs = endpoint_requirements(small.launch_options, small.hardware_profile, mig_strategy="mixed")
    assert room.slices_free(needs, "1g.10gb+me") == 7 and room.mig_free == {"1g.10gb+me": 7}
    with pytest.raises(ValueError, match="single strategy"):
        endpoint_requirements({}, small.hardware_profile, mig_strategy="single")


def test_under_single_a_sliced_nodes_gpus_are_never_whole_gpus(db, room_store, tenant_a, settings):
    """A node cut under the single strategy advertises its slices as nvidia.com/gpu: a whole-GPU profile naming no
    product would otherwise count them as free GPUs and place TP groups on them."""
    nodes = [
        node("a100-single", 56, labels={GPU_PRODUCT_LABEL: SINGLE_PRODUCT}),  # 8 GPUs of 7 slices each
        node("a100-whole", 8, labels={GPU_PRODUCT_LABEL: A100}),
    ]
    whole = HardwareProfileFactory(name="any-gpu-tp8", gpus_per_replica=8)
    small = mig_endpoint(tenant_a)  # before the room's read: it reads the product label its profile names
    refresh_room(api=api(RoomServer(nodes, [pod("small-a", "a100-single", 3)])))
    _, room = kubernetes_room()
    assert room.free_count() == 8 and room.mig_free == {"1g.10gb": 53}
    assert room.whole_groups(endpoint_requirements({}, whole), 8) == 1
    assert room.whole_groups(endpoint_requirements({}, whole), 1) == 8
    # An empty strategy setting reads as mixed, in the ledger as in the actuator.
    settings.INFERCAP = {**settings.INFERCAP, "AUTOSCALE_ACTUATOR": "kubernetes", "KUBERNETES_MIG_STRATEGY": ""}
    (row,) = capacity_ledger(endpoints=Endpoint.objects.filter(pk=small.pk), free_gpus=free_gpus()).endpoints
    assert row.whole_replicas_free == 0, "mixed: no nvidia.com/mig-1g.10gb on these nodes"
