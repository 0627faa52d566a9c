"""/api/v1/adapters/: LoRA adapters as records (docs/lora-serving.md). The CRUD, role and isolation checks come from
APIResourceCase; the rest are the artifact and endpoint rules an attacker with a tenant's key would probe."""

import os

import pytest
from django.urls import reverse

from endpoints.adapters import ARTIFACT_REFUSED
from endpoints.models import Adapter
from tenants.models import AuditEntry
from tests.adapter_artifacts import LORA_OPTIONS, write_adapter
from tests.api.base import APIResourceCase, unique
from tests.factories import EndpointFactory, ModelProfileFactory, ReservationFactory

URL = "/api/v1/adapters/"


def side_of(world, side):
    return world.a if side == "a" else world.b


def lora_endpoint(world, side: str | None = "a", **options):
    owner = side_of(world, side).tenant if side else None
    return EndpointFactory(owner_tenant=owner, launch_options={**LORA_OPTIONS, **options})


@pytest.mark.usefixtures("lora_root")
class TestAdapters(APIResourceCase):
    basename = "adapter"
    model = Adapter

    def make(self, world, side):
        endpoint = lora_endpoint(world, side)
        return Adapter.objects.create(
            name=unique(f"ft-{side}"), owner_tenant=endpoint.owner_tenant, endpoint=endpoint, rank=8, artifact_path="x"
        )

    def tenant_of(self, obj):
        return obj.owner_tenant_id

    def create_payload(self, world):
        from django.conf import settings

        relative = unique("support")
        write_adapter(tenant_store(settings_root(settings), world.a.tenant), relative)
        return {"name": unique("support-ft"), "endpoint": lora_endpoint(world, "a").pk, "artifact_path": relative}

    def invalid_payloads(self, world):
        from django.conf import settings

        root = tenant_store(settings_root(settings), world.a.tenant)
        good = self.create_payload(world)
        write_adapter(root, "rank-32", rank=32)
        write_adapter(root, "other-base", base_model="mistralai/Mistral-7B-v0.1")
        write_adapter(root, "no-weights", weights=False)
        no_lora = EndpointFactory(owner_tenant=world.a.tenant)
        return [
            ({**good, "name": "has spaces"}, "name"),
            ({**good, "name": world.a.endpoint.name}, "name"),  # an endpoint's name: both are a request's model
            ({**good, "endpoint": world.b.endpoint.pk}, "endpoint"),  # another tenant's endpoint does not exist
            ({**good, "endpoint": no_lora.pk}, "endpoint"),  # LoRA off there
            ({**good, "artifact_path": "/etc"}, "artifact_path"),
            ({**good, "artifact_path": "../../etc"}, "artifact_path"),
            ({**good, "artifact_path": "support/../../x"}, "artifact_path"),
            ({**good, "artifact_path": "missing/dir"}, "artifact_path"),
            ({**good, "artifact_path": "no-weights"}, "artifact_path"),
            ({**good, "artifact_path": "other-base"}, "artifact_path"),
            ({**good, "artifact_path": "rank-32"}, "rank"),  # above the endpoint's max_lora_rank 16
            ({**good, "rank": 4}, "rank"),  # the config says 8
        ]

    def update_payload(self, world, obj):
        return {"name": unique("renamed-ft")}


def settings_root(settings):
    from pathlib import Path

    return Path(settings.INFERCAP["LORA_ROOT"])


def tenant_store(root, tenant):
    """A tenant's part of the LoRA root: its adapters' paths are relative to it."""
    return root / "tenants" / str(tenant.pk)


def test_symlink_out_of_the_root_is_refused(world, lora_root, tmp_path):
    store = tenant_store(lora_root, world.a.tenant)
    outside = write_adapter(tmp_path, "outside")  # a valid adapter, but not under the root
    store.mkdir(parents=True)
    os.symlink(outside, store / "escape")
    inside = write_adapter(store, "linked-config")
    (inside / "adapter_config.json").unlink()
    os.symlink(outside / "adapter_config.json", inside / "adapter_config.json")
    endpoint = lora_endpoint(world, "a")
    for path in ("escape", "linked-config"):
        body = {"name": unique("ft"), "endpoint": endpoint.pk, "artifact_path": path}
        response = world.client("a_admin").post(URL, body, format="json")
        assert response.status_code == 400, response.content
        assert response.json()["artifact_path"] == [ARTIFACT_REFUSED]  # the tenant learns nothing more
        operator = world.client("operator").post(URL, {**body, "owner_tenant": world.a.tenant.pk}, format="json")
        assert "outside the LoRA storage root" in operator.json()["artifact_path"][0]  # operators get the reason
    assert not Adapter.objects.exists()


def test_a_tenant_cannot_reach_another_tenants_artifacts_and_every_refusal_reads_alike(world, lora_root):
    root_b = tenant_store(lora_root, world.b.tenant)
    write_adapter(root_b, "ft-secret")
    write_adapter(root_b, "no-config").joinpath("adapter_config.json").unlink()
    write_adapter(tenant_store(lora_root, world.a.tenant), "other-base", base_model="mistralai/Mistral-7B-v0.1")
    endpoint = lora_endpoint(world, "a")
    paths = [
        f"tenants/{world.b.tenant.pk}/ft-secret",  # B's directory, spelled from the root, exists
        f"tenants/{world.b.tenant.pk}/no-config",  # exists, no config
        f"../{world.b.tenant.pk}/ft-secret",  # out of A's directory
        "ft-secret",  # B's name, in A's directory: absent
        "missing",
        "other-base",  # A's own, another base model: not echoed either
        "/etc",
    ]
    answers = set()
    for path in paths:
        body = {"name": unique("ft"), "endpoint": endpoint.pk, "artifact_path": path}
        response = world.client("a_admin").post(URL, body, format="json")
        assert response.status_code == 400, (path, response.content)
        answers.add(response.content)
    assert len(answers) == 1 and not Adapter.objects.exists()


def test_tenant_registers_private_adapters_only_and_operator_shared_ones(world, lora_root):
    write_adapter(lora_root / "shared", "shared/base-ft")
    shared_endpoint = lora_endpoint(world, None)
    for side in (world.a, world.b):  # a tenant sees a shared endpoint it reserves on
        ReservationFactory(tenant=side.tenant, endpoint=shared_endpoint)
    body = {"name": "shared-ft", "endpoint": shared_endpoint.pk, "artifact_path": "shared/base-ft"}
    refused = world.client("a_admin").post(URL, {**body, "owner_tenant": None}, format="json")
    assert refused.status_code == 400 and "owner_tenant" in refused.json()
    other = world.client("a_admin").post(URL, {**body, "owner_tenant": world.b.tenant.pk}, format="json")
    assert other.status_code == 400 and "owner_tenant" in other.json()  # B does not exist for A
    created = world.client("operator").post(URL, body, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["owner_tenant"] is None and created.json()["base_model"] == "llama-13b"
    # Shared adapters on a shared endpoint are listed for tenants, read-only.
    adapter = Adapter.objects.get(name="shared-ft")
    assert world.client("b_admin").get(URL).json()["results"][0]["name"] == "shared-ft"
    assert world.client("a_admin").delete(f"{URL}{adapter.pk}/").status_code == 403


def test_shared_adapter_cannot_open_a_private_endpoint(world, lora_root):
    write_adapter(lora_root / "shared", "ft")
    body = {"name": "leak-ft", "endpoint": lora_endpoint(world, "a").pk, "artifact_path": "ft"}
    response = world.client("operator").post(URL, {**body, "owner_tenant": None}, format="json")
    assert response.status_code == 400 and "endpoint" in response.json()


def test_rank_comes_from_the_config_and_registration_is_audited(world, lora_root):
    write_adapter(tenant_store(lora_root, world.a.tenant), "ft8", rank=8)
    endpoint = lora_endpoint(world, "a")
    response = world.client("a_admin").post(
        URL, {"name": "ft8", "endpoint": endpoint.pk, "artifact_path": "ft8"}, format="json"
    )
    assert response.status_code == 201, response.content
    assert response.json()["rank"] == 8 and response.json()["endpoint_name"] == endpoint.name
    entry = AuditEntry.objects.get(action="adapter.create")
    assert entry.tenant_id == world.a.tenant.pk and entry.detail["path"] == "ft8"
    # The artifact and endpoint are fixed: another artifact is another adapter.
    adapter = Adapter.objects.get(name="ft8")
    patch = world.client("a_admin").patch(f"{URL}{adapter.pk}/", {"artifact_path": "elsewhere"}, format="json")
    assert patch.status_code == 400 and "artifact_path" in patch.json()


def test_endpoint_cannot_take_an_adapters_name(world, lora_root):
    write_adapter(tenant_store(lora_root, world.a.tenant), "ft")
    endpoint = lora_endpoint(world, "a")
    world.client("a_admin").post(
        URL, {"name": "taken-ft", "endpoint": endpoint.pk, "artifact_path": "ft"}, format="json"
    )
    response = world.client("a_admin").patch(reverse("endpoint-detail", args=[endpoint.pk]), {"name": "taken-ft"})
    assert response.status_code == 400 and "name" in response.json()


def test_base_model_matches_a_local_directory_of_the_same_name(world, lora_root):
    profile = ModelProfileFactory(name="tiny-llama")
    endpoint = EndpointFactory(owner_tenant=world.a.tenant, model_profile=profile, launch_options=LORA_OPTIONS)
    write_adapter(tenant_store(lora_root, world.a.tenant), "tiny", base_model="/models/tiny-llama")
    body = {"name": "tiny-ft", "endpoint": endpoint.pk, "artifact_path": "tiny"}
    assert world.client("a_admin").post(URL, body, format="json").status_code == 201
