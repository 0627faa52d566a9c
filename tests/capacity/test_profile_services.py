"""capacity.services profile writes: the model's own validation runs (field errors, over the API a 400), one audit
entry per write, and nothing is saved or audited when a write is refused."""

import pytest
from django.core.exceptions import ValidationError

from capacity.models import HardwareProfile, ModelProfile
from capacity.services import profile_create, profile_delete, profile_update
from tenants.models import AuditEntry
from tests.conftest import client_for

HARDWARE = {
    "name": "h100", "gpu_type": "H100-80GB", "gpus_per_replica": 1, "gpu_memory_gb": 80,
    "memory_bandwidth_gbps": 3350, "usd_per_gpu_hour": 4.0,
}  # fmt: skip


def test_profile_create_update_delete_are_audited(operator):
    hardware = profile_create(model=HardwareProfile, actor=operator, **HARDWARE)
    profile_update(profile=hardware, usd_per_gpu_hour=3.5, actor=operator)
    hardware.refresh_from_db()
    assert hardware.usd_per_gpu_hour == 3.5
    profile_delete(profile=hardware, actor=operator)
    assert not HardwareProfile.objects.filter(name="h100").exists()
    actions = list(AuditEntry.objects.order_by("pk").values_list("action", "tenant", "detail"))
    assert actions == [
        ("hardwareprofile.create", None, {}),
        ("hardwareprofile.update", None, {"fields": ["usd_per_gpu_hour"]}),
        ("hardwareprofile.delete", None, {}),
    ]


def test_the_models_own_validation_runs_on_create_and_update(operator):
    with pytest.raises(ValidationError) as caught:
        profile_create(model=HardwareProfile, actor=operator, **(HARDWARE | {"gpu_memory_gb": 0.5, "gpu_type": ""}))
    assert set(caught.value.message_dict) == {"gpu_memory_gb", "gpu_type"}
    # memory_overhead_gb is not on the API; the service still checks it.
    with pytest.raises(ValidationError) as caught:
        profile_create(model=HardwareProfile, actor=operator, **(HARDWARE | {"memory_overhead_gb": -1}))
    assert set(caught.value.message_dict) == {"memory_overhead_gb"}

    model = profile_create(
        model=ModelProfile, actor=operator, name="tiny", parameters_b=1, n_layers=2, n_kv_heads=2, d_head=64,
        weights_gb=2,
    )  # fmt: skip
    with pytest.raises(ValidationError) as caught:
        profile_update(profile=model, n_layers=0, actor=operator)
    assert set(caught.value.message_dict) == {"n_layers"}
    model.refresh_from_db()
    assert model.n_layers == 2
    assert not HardwareProfile.objects.filter(name="h100").exists()
    assert list(AuditEntry.objects.values_list("action", flat=True)) == ["modelprofile.create"]


@pytest.mark.parametrize(
    "url, body, field",
    [
        ("/api/v1/hardware-profiles/", HARDWARE | {"gpu_memory_gb": 0}, "gpu_memory_gb"),
        ("/api/v1/hardware-profiles/", HARDWARE | {"name": "a100-80g"}, "name"),
        (
            "/api/v1/model-profiles/",
            {"name": "m", "parameters_b": 1, "n_layers": 0, "n_kv_heads": 1, "d_head": 64, "weights_gb": 1},
            "n_layers",
        ),
    ],
)
def test_a_bad_profile_over_the_api_is_a_field_error(operator, tenant_a, url, body, field):
    response = client_for(operator).post(url, body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()
    assert not AuditEntry.objects.filter(action__endswith="profile.create").exists()


def test_a_profile_an_endpoint_uses_is_not_deleted_and_its_audit_entry_is_rolled_back(operator, tenant_a):
    hardware = tenant_a.endpoint.hardware_profile
    response = client_for(operator).delete(f"/api/v1/hardware-profiles/{hardware.pk}/")
    assert response.status_code == 409
    assert HardwareProfile.objects.filter(pk=hardware.pk).exists()
    assert not AuditEntry.objects.filter(action="hardwareprofile.delete").exists()
