"""Who may say where an endpoint's pods land: the node selectors and tolerations (launch options) and the GPU model
(a hardware profile's ``gpu_product``) are the operators'. A tenant, by session or key, is refused each with a field
error, never a 500, and nothing changes (docs/placement.md, "In the ledger")."""

import pytest
from django.urls import reverse

from capacity.models import HardwareProfile
from endpoints.models import Endpoint
from tests.factories import HardwareProfileFactory, ModelProfileFactory

pytestmark = pytest.mark.django_db

RESERVED = {"key": "dedicated", "operator": "Equal", "value": "team-x", "effect": "NoSchedule"}
PLACEMENT = [
    {"node_selector": {"pool": "reserved"}},
    {"tolerations": [RESERVED]},
    {"tolerations": [{"operator": "Exists"}]},  # every taint
    {"spot_node_selector": {"pool": "reserved"}},
    {"spot_tolerations": [RESERVED]},
]


@pytest.mark.parametrize("options", PLACEMENT, ids=lambda o: next(iter(o)))
def test_a_tenant_cannot_set_node_selectors_or_tolerations(world, options):
    mine = world.a.endpoint
    for who in ("a_admin", "a_write_key"):
        client = world.client(who)
        for field in ("launch_options", "prefill_launch_options"):
            patched = client.patch(reverse("endpoint-detail", args=[mine.pk]), {field: options}, format="json")
            assert patched.status_code == 400, (who, field, patched.content)
            assert f"only operators may set {next(iter(options))}" in str(patched.json()[field])
        created = client.post(
            reverse("endpoint-list"),
            {
                "name": "placement-probe",
                "model_profile": ModelProfileFactory().pk,
                "hardware_profile": HardwareProfileFactory().pk,
                "runtime": "vllm",
                "launch_options": options,
            },
            format="json",
        )
        assert created.status_code == 400 and "launch_options" in created.json(), (who, created.content)
    mine.refresh_from_db()
    assert mine.launch_options == {} and not Endpoint.objects.filter(name="placement-probe").exists()


def test_a_tenant_keeps_but_cannot_drop_or_widen_the_operators_tolerations(world):
    mine = world.a.endpoint
    Endpoint.objects.filter(pk=mine.pk).update(launch_options={"tolerations": [RESERVED]})
    client = world.client("a_admin")
    url = reverse("endpoint-detail", args=[mine.pk])
    resent = client.patch(url, {"launch_options": {"tolerations": [RESERVED], "max_num_seqs": 64}}, format="json")
    assert resent.status_code == 200, resent.content
    widened = {"tolerations": [RESERVED, {"operator": "Exists"}], "max_num_seqs": 64}
    assert client.patch(url, {"launch_options": widened}, format="json").status_code == 400
    assert client.patch(url, {"launch_options": {"max_num_seqs": 64}}, format="json").status_code == 400
    mine.refresh_from_db()
    assert mine.launch_options["tolerations"] == [RESERVED]


def test_only_operators_set_a_profiles_gpu_product(world):
    profile = HardwareProfileFactory(name="h100")
    url = reverse("hardware-profile-detail", args=[profile.pk])
    for who in ("a_admin", "a_write_key", "a_member"):
        response = world.client(who).patch(url, {"gpu_product": "NVIDIA-H100-80GB-HBM3"}, format="json")
        assert response.status_code == 403, (who, response.content)
        created = world.client(who).post(
            reverse("hardware-profile-list"),
            {"name": "mine", "gpu_type": "H100", "gpu_memory_gb": 80, "memory_bandwidth_gbps": 3350,
             "gpu_product": "NVIDIA-H100-80GB-HBM3"},
            format="json",
        )  # fmt: skip
        assert created.status_code == 403, (who, created.content)
    assert HardwareProfile.objects.get(pk=profile.pk).gpu_product == ""
    operator = world.client("operator")
    bad = operator.patch(url, {"gpu_product": "NVIDIA H100 80GB"}, format="json")
    assert bad.status_code == 400 and "gpu_product" in bad.json()
    bad_label = operator.patch(url, {"gpu_product_label": "not a label!"}, format="json")
    assert bad_label.status_code == 400 and "gpu_product_label" in bad_label.json()
    ok = operator.patch(url, {"gpu_product": "NVIDIA-H100-80GB-HBM3"}, format="json")
    assert ok.status_code == 200 and ok.json()["gpu_product"] == "NVIDIA-H100-80GB-HBM3"
    assert ok.json()["gpu_product_label"] == "nvidia.com/gpu.product"
