"""What an endpoint's pods require of a node (placement/node_requirements.py), as pure functions: Kubernetes'
toleration and node selector matching with its edge cases, the checks on the operators' launch options, and the pod
template that carries exactly those requirements."""

import copy
from types import SimpleNamespace

import pytest

from placement.node_requirements import (
    GPU_PRODUCT_LABEL,
    NodeRequirements,
    Room,
    RoomNode,
    Toleration,
    carries,
    endpoint_requirements,
    requirements,
    with_requirements,
)

H100 = "NVIDIA-H100-80GB-HBM3"


def toleration(**spec) -> Toleration:
    return Toleration(tuple(spec.items()))


def taint(key: str, effect: str = "NoSchedule", value: str = "") -> dict:
    return {"key": key, "value": value, "effect": effect}


@pytest.mark.parametrize(
    ("spec", "the_taint", "tolerated"),
    [
        # operator Exists with an empty key and no effect: every taint
        ({"operator": "Exists"}, taint("dedicated", "NoExecute", "team-x"), True),
        # an empty key with Exists and an effect: every key, that effect only
        ({"operator": "Exists", "effect": "NoSchedule"}, taint("anything", "NoSchedule", "v"), True),
        ({"operator": "Exists", "effect": "NoSchedule"}, taint("anything", "NoExecute", "v"), False),
        # Exists on a key: any value of that key
        ({"key": "dedicated", "operator": "Exists"}, taint("dedicated", value="team-x"), True),
        ({"key": "dedicated", "operator": "Exists"}, taint("other", value="team-x"), False),
        # Equal (also the default operator): the same value only
        ({"key": "dedicated", "operator": "Equal", "value": "team-x"}, taint("dedicated", value="team-x"), True),
        ({"key": "dedicated", "value": "team-x"}, taint("dedicated", value="team-x"), True),
        ({"key": "dedicated", "value": "team-x"}, taint("dedicated", value="team-y"), False),
        ({"key": "dedicated"}, taint("dedicated", value=""), True),  # an empty value equals an empty value
        # an empty effect matches every effect; a set one only its own
        ({"key": "spot", "operator": "Exists"}, taint("spot", "NoExecute"), True),
        ({"key": "spot", "operator": "Exists", "effect": "NoExecute"}, taint("spot", "NoSchedule"), False),
    ],
)
def test_toleration_matching_follows_kubernetes(spec, the_taint, tolerated):
    assert toleration(**spec).tolerates(the_taint) is tolerated


def test_only_untolerated_noschedule_and_noexecute_taints_keep_a_pod_off():
    needs = NodeRequirements()
    assert needs.admits({}, [taint("dedicated", "PreferNoSchedule", "x")]), "a preference only steers"
    assert not needs.admits({}, [taint("dedicated", "NoSchedule", "x")])
    assert not needs.admits({}, [taint("spot", "NoExecute")])
    tolerant = requirements(tolerations=[{"key": "dedicated", "operator": "Exists"}])
    assert tolerant.admits({}, [taint("dedicated", "NoSchedule", "x"), taint("dedicated", "NoExecute", "y")])
    assert not tolerant.admits({}, [taint("dedicated", "NoSchedule", "x"), taint("spot", "NoSchedule")])


def test_a_gpu_pod_tolerates_the_gpu_resource_taint_as_the_api_server_gives_it():
    # GKE taints GPU nodes nvidia.com/gpu=present:NoSchedule; ExtendedResourceToleration tolerates it for GPU pods,
    # with effect NoSchedule only.
    needs = NodeRequirements()
    assert needs.admits({}, [taint("nvidia.com/gpu", "NoSchedule", "present")])
    assert not needs.admits({}, [taint("nvidia.com/gpu", "NoExecute", "present")])


def test_every_selected_label_must_match():
    needs = requirements(gpu_product=H100, node_selector={"pool": "inference"})
    assert needs.node_selector == ((GPU_PRODUCT_LABEL, H100), ("pool", "inference"))
    assert needs.admits({GPU_PRODUCT_LABEL: H100, "pool": "inference", "zone": "a"}, [])
    assert not needs.admits({GPU_PRODUCT_LABEL: "NVIDIA-L40S", "pool": "inference"}, [])
    assert not needs.admits({GPU_PRODUCT_LABEL: H100}, []), "a missing label is no match"
    assert NodeRequirements().admits({}, []), "no product, no selector: any GPU node"


def test_the_endpoints_requirements_come_from_its_profile_and_the_operators_options():
    h100 = SimpleNamespace(gpu_product=H100, gpu_product_label=GPU_PRODUCT_LABEL)
    gke = SimpleNamespace(gpu_product="nvidia-h100-80gb", gpu_product_label="cloud.google.com/gke-accelerator")
    any_gpu = SimpleNamespace(gpu_product="", gpu_product_label=GPU_PRODUCT_LABEL)
    assert endpoint_requirements({}, any_gpu) == NodeRequirements() == endpoint_requirements({}, None)
    assert endpoint_requirements({}, gke).node_selector == (("cloud.google.com/gke-accelerator", "nvidia-h100-80gb"),)
    # The profile's product wins over a selector on its label: the pods and the room both ask for the profile's GPU.
    options = {"node_selector": {GPU_PRODUCT_LABEL: "NVIDIA-L40S", "pool": "a"}, "tolerations": [{"key": "t"}]}
    needs = endpoint_requirements(options, h100)
    assert dict(needs.node_selector) == {GPU_PRODUCT_LABEL: H100, "pool": "a"}
    assert [t.spec for t in needs.tolerations] == [{"key": "t"}]
    # A spot pod adds the spot selector (Karpenter's by default) and the spot tolerations; an on-demand one does not.
    spot_options = {**options, "spot_tolerations": [{"key": "spot", "operator": "Exists"}]}
    spot = endpoint_requirements(spot_options, h100, spot=True)
    assert dict(spot.node_selector)["karpenter.sh/capacity-type"] == "spot"
    assert [t.spec for t in spot.tolerations] == [{"key": "t"}, {"key": "spot", "operator": "Exists"}]
    assert endpoint_requirements(spot_options, h100) == needs
    # Equal requirements are one key: endpoints that share them share one room computation.
    assert hash(endpoint_requirements(copy.deepcopy(options), h100)) == hash(needs)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"node_selector": ["pool=a"]}, "node_selector"),
        ({"node_selector": {"pool": 1}}, "node_selector"),
        ({"node_selector": {"pool": "a b"}}, "node_selector"),
        ({"node_selector": {"-bad": "a"}}, "node_selector"),
        ({"tolerations": {"key": "a"}}, "tolerations"),
        ({"tolerations": [{"key": "a", "operator": "Exists", "value": "x"}]}, "operator Exists has no value"),
        ({"tolerations": [{"operator": "Equal", "value": "x"}]}, "without a key must have operator Exists"),
        ({"tolerations": [{"key": "a", "operator": "In"}]}, "must be Exists or Equal"),
        ({"tolerations": [{"key": "a", "effect": "Sometimes"}]}, "effect"),
        ({"tolerations": [{"key": "a", "tolerationSeconds": 30}]}, "NoExecute only"),
        ({"tolerations": [{"key": "a", "nodeName": "n"}]}, "tolerations"),
        ({"spot_node_selector": {}}, "spot_node_selector"),
    ],
)
def test_bad_scheduling_options_are_a_clear_error_naming_the_option(options, named):
    with pytest.raises(ValueError, match=named):
        endpoint_requirements(options, None, spot=True)


def test_the_pod_template_carries_the_requirements_merged_into_its_own():
    template = {
        "metadata": {"labels": {"app": "vllm"}},
        "spec": {
            "nodeSelector": {"zone": "a", GPU_PRODUCT_LABEL: "NVIDIA-L40S"},
            "tolerations": [{"key": "t"}],
            "containers": [{"name": "vllm"}],
        },
    }
    needs = requirements(gpu_product=H100, tolerations=[{"key": "t"}, {"key": "dedicated", "operator": "Exists"}])
    pod = with_requirements(template, needs)
    assert pod["spec"]["nodeSelector"] == {"zone": "a", GPU_PRODUCT_LABEL: H100}
    assert pod["spec"]["tolerations"] == [{"key": "t"}, {"key": "dedicated", "operator": "Exists"}], "none twice"
    assert carries(pod, needs) and not carries(template, needs)
    assert template["spec"]["nodeSelector"][GPU_PRODUCT_LABEL] == "NVIDIA-L40S", "the input is not changed"
    assert with_requirements(template, NodeRequirements()) == template, "nothing to add: the template as it was"


def test_a_room_counts_each_requirement_set_on_its_own_nodes_once():
    nodes = [
        RoomNode("h100-a", 8, labels={GPU_PRODUCT_LABEL: H100}),
        RoomNode("h100-b", 8, labels={GPU_PRODUCT_LABEL: H100}, taints=[taint("dedicated", value="team-x")]),
        RoomNode("l40s-a", 8, labels={GPU_PRODUCT_LABEL: "NVIDIA-L40S"}),
    ]
    room = Room(nodes, {"h100-a": 4}, label_keys=[GPU_PRODUCT_LABEL])
    h100 = requirements(gpu_product=H100)
    assert room.free_count() == 20, "as a cluster: every schedulable GPU node"
    assert room.whole_groups(h100, 4) == 1, "h100-a's 4 free; h100-b is tainted, l40s-a another model"
    assert room.whole_groups(requirements(), 4) == 3, "any GPU node: h100-a and l40s-a"
    assert room.whole_groups(requirements(gpu_product="NVIDIA-B200"), 1) == 0, "no node of that model: none"
    assert room.whole_groups(requirements(node_selector={"zone": "a"}), 1) is None, "a label not read: unknown"
    assert room.whole_groups(h100, 4) == 1 and room.computations == 4, "asked again: not computed again"
