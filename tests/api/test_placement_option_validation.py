"""An operator's node selectors and tolerations are checked when written, with the check the Kubernetes actuator runs
at scale-up: a bad shape is a 400 naming the field (``launch_options`` or ``prefill_launch_options``), never a
launch that fails later nor a 500, and nothing is stored (docs/placement.md, "In the ledger")."""

import pytest
from django.urls import reverse

from endpoints.models import Endpoint
from placement.node_requirements import endpoint_requirements
from tests.factories import HardwareProfileFactory, ModelProfileFactory

pytestmark = pytest.mark.django_db

RESERVED = {"key": "dedicated", "operator": "Equal", "value": "team-x", "effect": "NoSchedule"}
GOOD = {
    "node_selector": {"pool": "reserved", "topology.kubernetes.io/zone": "us-east-1a"},
    "tolerations": [RESERVED, {"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}],
    "spot_node_selector": {"cloud.google.com/gke-spot": "true"},
    "spot_tolerations": [{"key": "cloud.google.com/gke-spot", "operator": "Exists"}],
}
# (options, the words the field error must carry)
BAD = {
    "selector-not-a-mapping": ({"node_selector": ["pool=reserved"]}, "node_selector must be an object"),
    "selector-value-not-a-string": ({"node_selector": {"pool": 3}}, "must map a node label name to a string"),
    "selector-bad-label-key": ({"node_selector": {"not a label": "x"}}, "must map a node label name"),
    "selector-bad-label-value": ({"node_selector": {"pool": "a b"}}, "is not a label value"),
    "selector-null": ({"node_selector": None}, "node_selector must be an object"),
    "tolerations-not-a-list": ({"tolerations": RESERVED}, "tolerations must be a list"),
    "toleration-unknown-operator": ({"tolerations": [{"key": "k", "operator": "In"}]}, "operator 'In'"),
    "toleration-unknown-effect": ({"tolerations": [{**RESERVED, "effect": "NoRun"}]}, "effect 'NoRun'"),
    "toleration-unknown-field": ({"tolerations": [{**RESERVED, "weight": 1}]}, "each must be an object of"),
    "toleration-seconds-without-noexecute": (
        {"tolerations": [{**RESERVED, "tolerationSeconds": 5}]},
        "tolerationSeconds is a whole number",
    ),
    "spot-selector-empty": ({"spot_node_selector": {}}, "spot_node_selector must be a non-empty object"),
    "spot-tolerations-not-a-list": ({"spot_tolerations": "dedicated"}, "spot_tolerations must be a list"),
}


def _create(world, **fields):
    body = {
        "name": "placed",
        "model_profile": ModelProfileFactory().pk,
        "hardware_profile": HardwareProfileFactory().pk,
        "runtime": "vllm",
        **fields,
    }
    return world.client("operator").post(reverse("endpoint-list"), body, format="json")


def _patch(world, endpoint, **body):
    return world.client("operator").patch(reverse("endpoint-detail", args=[endpoint.pk]), body, format="json")


@pytest.mark.parametrize(("options", "says"), BAD.values(), ids=BAD.keys())
def test_an_operators_bad_placement_option_is_a_field_error_when_written(world, options, says):
    created = _create(world, launch_options=options)
    assert created.status_code == 400, created.content
    assert says in str(created.json()["launch_options"]), created.json()
    assert not Endpoint.objects.filter(name="placed").exists()

    endpoint = world.a.endpoint
    versions = endpoint.versions.count()
    for field in ("launch_options", "prefill_launch_options"):
        patched = _patch(world, endpoint, **{field: options})
        assert patched.status_code == 400, (field, patched.content)
        assert says in str(patched.json()[field]), (field, patched.json())
    endpoint.refresh_from_db()
    assert (endpoint.launch_options, endpoint.prefill_launch_options) == ({}, {})
    assert endpoint.versions.count() == versions  # no version of the refused options


def test_each_bad_placement_option_is_named(world):
    options = {"node_selector": {"pool": 3}, "tolerations": [{"key": "k", "operator": "In"}], "max_num_seqs": 8}
    errors = _create(world, launch_options=options).json()["launch_options"]
    assert any("node_selector" in e for e in errors) and any("tolerations" in e for e in errors), errors


def test_good_placement_options_are_accepted_and_are_what_the_pods_carry(world):
    created = _create(world, launch_options=GOOD, prefill_launch_options=GOOD)
    assert created.status_code == 201, created.content
    endpoint = Endpoint.objects.get(name="placed")
    assert endpoint.launch_options == GOOD and endpoint.prefill_launch_options == GOOD
    needs = endpoint_requirements(endpoint.launch_options, None, spot=True)
    assert dict(needs.node_selector) == {**GOOD["node_selector"], **GOOD["spot_node_selector"]}

    other = world.a.endpoint
    assert _patch(world, other, launch_options={"node_selector": {"pool": "reserved"}}).status_code == 200
    assert _patch(world, other, prefill_launch_options={"tolerations": [RESERVED]}).status_code == 200
    other.refresh_from_db()
    assert other.prefill_launch_options == {"tolerations": [RESERVED]}
    assert other.versions.latest("number").launch_options == {"node_selector": {"pool": "reserved"}}


def test_stored_prefill_options_do_not_block_a_live_edit_of_another_field(world):
    endpoint = world.a.endpoint
    stale = {"tolerations": [{"key": "k", "operator": "In"}]}  # written before the check existed
    Endpoint.objects.filter(pk=endpoint.pk).update(prefill_launch_options=stale)
    endpoint.refresh_from_db()
    assert _patch(world, endpoint, max_replicas=endpoint.max_replicas + 1).status_code == 200
    refused = _patch(world, endpoint, prefill_launch_options={**stale, "cpus": 2})
    assert refused.status_code == 400 and "operator 'In'" in str(refused.json()["prefill_launch_options"])
