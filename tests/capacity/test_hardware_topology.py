"""A hardware profile knows its shape (docs/placement.md, "Hardware that knows its shape"): GPUs per node, the
interconnect domain's size and the node label naming it, and whether a replica's group fits one domain."""

import pytest
from django.core.exceptions import ValidationError

from capacity.models import HardwareProfile
from tests.factories import HardwareProfileFactory

pytestmark = pytest.mark.django_db


def test_an_hgx_profile_holds_eight_gpus_on_one_node_and_no_more():
    profile = HardwareProfileFactory(gpus_per_replica=8)
    assert (profile.gpus_per_node, profile.interconnect_domain_gpus) == (8, 8)
    assert profile.domain_node_label == "kubernetes.io/hostname"
    assert profile.replica_fit().fits and profile.replica_fit().nodes == 1
    assert not profile.replica_fit(16).fits


def test_an_nvl72_profile_spans_whole_nodes_of_its_rack():
    profile = HardwareProfileFactory(
        name="gb200-nvl72", gpus_per_node=4, interconnect_domain_gpus=72, domain_node_label="nvidia.com/gpu.clique"
    )
    profile.full_clean()
    profile.refresh_from_db()
    assert profile.replica_fit(16).nodes == 4 and profile.replica_fit(4).nodes == 1
    assert not profile.replica_fit(76).fits
    assert profile.replica_fit(6).nodes == 2  # 3 GPUs on each of two nodes: the rack's NVLink reaches them all


def test_nvlink_pairs_on_a_pcie_node_hold_tp2_and_not_tp4():
    profile = HardwareProfileFactory(name="l40s-pairs", gpus_per_node=8, interconnect_domain_gpus=2)
    assert profile.replica_fit(2).fits and not profile.replica_fit(4).fits


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"gpus_per_node": 8, "interconnect_domain_gpus": 12}, "interconnect_domain_gpus"),
        ({"domain_node_label": "not a label!"}, "domain_node_label"),
        ({"gpus_per_node": 0}, "gpus_per_node"),
    ],
)
def test_a_shape_that_cannot_be_is_a_field_error(fields, error):
    profile = HardwareProfile(name="bad", gpu_type="X", gpu_memory_gb=80, memory_bandwidth_gbps=1000, **fields)
    with pytest.raises(ValidationError) as raised:
        profile.full_clean()
    assert error in raised.value.message_dict
