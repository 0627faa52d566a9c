"""A pod template the platform wrote requirements into keeps a record of them, so the next write, or a copy for
another pool or version, replaces them instead of adding to them; a toleration's value is checked as the API server
checks it (placement/node_requirements.py, docs/placement.md "In the ledger")."""

import copy

import pytest

from capacity.autoscaling.actuators.kubernetes_objects import merge_patch
from placement.node_requirements import (
    ADDED_ANNOTATION,
    GPU_PRODUCT_LABEL,
    NodeRequirements,
    endpoint_requirements,
    requirements,
    tolerations_of,
    with_requirements,
    without_requirements,
)
from tests.autoscaling.test_kubernetes_gang import merge

H100, L40S = "NVIDIA-H100-80GB-HBM3", "NVIDIA-L40S"
OWN_TOLERATION = {"key": "maintenance", "operator": "Exists"}
TEAM_X = {"key": "dedicated", "operator": "Equal", "value": "team-x", "effect": "NoSchedule"}
SPOT = {"key": "spot", "operator": "Exists"}


def operator_template() -> dict:
    """A template Deployment's pod as the operator wrote it: a selector of its own and a toleration."""
    return {
        "metadata": {"labels": {"app": "vllm"}, "annotations": {"prometheus.io/scrape": "true"}},
        "spec": {
            "nodeSelector": {"zone": "eu-1a", "pool": "own"},
            "tolerations": [OWN_TOLERATION],
            "containers": [{"name": "vllm"}],
        },
    }


ON_DEMAND = requirements(
    gpu_product=H100, node_selector={"pool": "inference", "zone": "eu-1a"}, tolerations=[TEAM_X, OWN_TOLERATION]
)
SPOT_POOL = requirements(node_selector={"karpenter.sh/capacity-type": "spot"}, tolerations=[SPOT])


def test_a_copy_of_a_written_template_gets_only_its_own_requirements():
    written = with_requirements(operator_template(), ON_DEMAND)
    assert written["spec"]["nodeSelector"] == {"zone": "eu-1a", "pool": "inference", GPU_PRODUCT_LABEL: H100}
    assert written["spec"]["tolerations"] == [OWN_TOLERATION, TEAM_X], "the template's own toleration not twice"
    spot = with_requirements(written, SPOT_POOL)
    # No H100 selector and no team-x toleration inherited; the operator's pool=own back, as in the template.
    assert spot == with_requirements(operator_template(), SPOT_POOL)
    assert spot["spec"]["nodeSelector"] == {"zone": "eu-1a", "pool": "own", "karpenter.sh/capacity-type": "spot"}
    assert spot["spec"]["tolerations"] == [OWN_TOLERATION, SPOT]


def test_writing_again_is_a_no_op_and_taking_out_gives_the_operators_template_back():
    written = with_requirements(operator_template(), ON_DEMAND)
    assert with_requirements(written, ON_DEMAND) == written, "idempotent: a from-zero launch writes nothing new"
    assert without_requirements(written) == operator_template()
    assert with_requirements(written, NodeRequirements()) == operator_template(), "options dropped: all go"
    assert (
        ADDED_ANNOTATION not in with_requirements(operator_template(), NodeRequirements())["metadata"]["annotations"]
    )


def test_a_template_that_had_no_selector_or_tolerations_gets_none_back():
    bare = {"metadata": {"labels": {"app": "vllm"}}, "spec": {"containers": [{"name": "vllm"}]}}
    assert without_requirements(with_requirements(bare, ON_DEMAND)) == bare


def test_what_an_operator_changed_since_stays_and_a_mangled_record_is_ignored():
    written = with_requirements(operator_template(), ON_DEMAND)
    written["spec"]["nodeSelector"][GPU_PRODUCT_LABEL] = L40S  # edited by hand after the platform wrote it
    assert without_requirements(written)["spec"]["nodeSelector"][GPU_PRODUCT_LABEL] == L40S
    written["metadata"]["annotations"][ADDED_ANNOTATION] = "{not json"
    stripped = without_requirements(written)
    assert ADDED_ANNOTATION not in stripped["metadata"]["annotations"]
    assert stripped["spec"]["nodeSelector"]["pool"] == "inference", "nothing readable recorded: nothing taken out"


def test_the_merge_patch_of_a_rewrite_removes_what_the_new_template_dropped():
    written = with_requirements(operator_template(), ON_DEMAND)
    bare = {"metadata": {"labels": {"app": "vllm"}}, "spec": {"containers": [{"name": "vllm"}]}}
    for before, after in (
        (written, with_requirements(written, SPOT_POOL)),
        (written, with_requirements(written, NodeRequirements())),
        (with_requirements(bare, ON_DEMAND), bare),
    ):
        patch = merge_patch(before, after)
        assert merge(copy.deepcopy(before), patch) == after
    assert merge_patch(written, with_requirements(written, ON_DEMAND)) == {}, "nothing changed: nothing sent"
    dropped = merge_patch(with_requirements(bare, ON_DEMAND), bare)
    assert dropped["spec"]["nodeSelector"] is None and dropped["metadata"] == {"annotations": None}


@pytest.mark.parametrize("value", ["x y", "team/x", "-team", "a" * 64])
def test_an_equal_tolerations_value_must_be_a_label_value(value):
    bad = {"key": "dedicated", "operator": "Equal", "value": value}
    with pytest.raises(ValueError, match="tolerations: value .* is not a label value"):
        tolerations_of([bad], option="tolerations")
    with pytest.raises(ValueError, match="spot_tolerations: value"):
        endpoint_requirements({"spot_tolerations": [{"key": "a", "value": value}]}, None, spot=True)


def test_an_equal_tolerations_label_value_or_none_passes():
    good = [TEAM_X, {"key": "dedicated", "operator": "Equal", "value": "a" * 63}, {"key": "gpu", "value": ""}]
    assert tolerations_of(good, option="tolerations") == good
