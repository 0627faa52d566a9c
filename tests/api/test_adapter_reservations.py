"""Reservations per LoRA adapter (docs/lora.md): an operator sells capacity for one adapter apart from the tenant's
base-model reservation on its endpoint. Only the tenant's own or a shared adapter on that endpoint; one reservation
per adapter and one base-model one per endpoint (the database holds both rules); another tenant's private adapter
is never revealed to a tenant; a reserved adapter is not deleted from under its reservation."""

import pytest
from django.db import IntegrityError, transaction
from django.urls import reverse

from endpoints.models import Adapter, Endpoint
from tenants.models import AuditEntry, CapacityReservation
from tests.factories import EndpointFactory, ModelProfileFactory, ReplicaFactory, ReservationFactory

LIST = reverse("reservation-list")


@pytest.fixture
def shared(world):
    """A shared endpoint with capacity to sell, and on it A's private adapter, B's private adapter and a shared one;
    a second shared endpoint with its own adapter."""
    endpoint = EndpointFactory(owner_tenant=None, model_profile=ModelProfileFactory(name="m-resv", mu_per_min=1000.0))
    ReplicaFactory.create_batch(2, endpoint=endpoint, state="ready")
    elsewhere = EndpointFactory(owner_tenant=None)

    def adapter(name, owner, on=endpoint):
        return Adapter.objects.create(name=name, owner_tenant=owner, endpoint=on, rank=8, artifact_path=name)

    return {
        "endpoint": endpoint,
        "a_ft": adapter("a-ft", world.a.tenant),
        "b_ft": adapter("b-ft", world.b.tenant),
        "s_ft": adapter("s-ft", None),
        "other_ft": adapter("other-ft", None, on=elsewhere),
    }


def sell(world, shared, adapter=None, *, tenant=None, mu_per_min=50, **fields):
    payload = {"tenant": (tenant or world.a.tenant).pk, "endpoint": shared["endpoint"].pk, "mu_per_min": mu_per_min}
    if adapter is not None:
        payload["adapter"] = adapter.pk
    return world.client("operator").post(LIST, {**payload, **fields}, format="json")


def test_an_adapter_reservation_stands_beside_the_base_model_one_and_is_audited(world, shared):
    base = sell(world, shared, priority="standard")
    own = sell(world, shared, shared["a_ft"], mu_per_min=30, priority="critical")
    shared_one = sell(world, shared, shared["s_ft"], mu_per_min=20)
    assert (base.status_code, own.status_code, shared_one.status_code) == (201, 201, 201), own.content
    body = own.json()
    assert (body["adapter"], body["adapter_name"], body["mu_per_min"]) == (shared["a_ft"].pk, "a-ft", 30)
    assert base.json()["adapter"] is None and base.json()["adapter_name"] is None
    entry = AuditEntry.objects.get(action="reservation.create", object_id=str(body["id"]))
    assert entry.detail["adapter"] == "a-ft" and entry.tenant_id == world.a.tenant.pk

    # One per adapter, one base-model one per endpoint: each refused on its own field.
    again = sell(world, shared, shared["a_ft"])
    assert again.status_code == 400 and "adapter" in again.json(), again.content
    base_again = sell(world, shared)
    assert base_again.status_code == 400 and "endpoint" in base_again.json()
    # Another tenant may reserve the same shared adapter.
    assert sell(world, shared, shared["s_ft"], tenant=world.b.tenant).status_code == 201


def test_only_the_tenants_own_or_a_shared_adapter_on_that_endpoint(world, shared):
    foreign = sell(world, shared, shared["b_ft"])
    assert foreign.status_code == 400
    assert foreign.json()["adapter"] == ["adapter `b-ft` is private to another tenant; this tenant cannot use it"]
    elsewhere = sell(world, shared, shared["other_ft"])
    assert elsewhere.status_code == 400
    assert elsewhere.json()["adapter"] == ["adapter `other-ft` is not served on this endpoint"]
    missing = sell(world, shared, Adapter(pk=999_999))
    assert missing.status_code == 400 and "adapter" in missing.json()
    assert not CapacityReservation.objects.filter(adapter__isnull=False).exists()


def test_the_database_holds_both_uniqueness_rules(world, shared):
    tenant, endpoint = world.a.tenant, shared["endpoint"]
    ReservationFactory(tenant=tenant, endpoint=endpoint)
    ReservationFactory(tenant=tenant, endpoint=endpoint, adapter=shared["a_ft"])
    ReservationFactory(tenant=tenant, endpoint=endpoint, adapter=shared["s_ft"])
    for adapter in (None, shared["a_ft"]):
        with pytest.raises(IntegrityError), transaction.atomic():
            CapacityReservation.objects.create(tenant=tenant, endpoint=endpoint, adapter=adapter, mu_per_min=1)


def test_a_tenant_reads_and_filters_its_adapter_reservations_and_learns_nothing_of_others(world, shared):
    mine = ReservationFactory(tenant=world.a.tenant, endpoint=shared["endpoint"], adapter=shared["a_ft"])
    ReservationFactory(tenant=world.b.tenant, endpoint=shared["endpoint"], adapter=shared["b_ft"])
    client = world.client("a_member")
    rows = client.get(LIST, {"adapter": shared["a_ft"].pk}).json()["results"]
    assert [(r["id"], r["adapter_name"]) for r in rows] == [(mine.pk, "a-ft")]
    base_only = client.get(LIST, {"adapter__isnull": "true"}).json()["results"]
    assert base_only and all(r["adapter"] is None for r in base_only)
    # B's private adapter, which holds B's reservation, answers exactly as an adapter that does not exist.
    foreign, missing = client.get(LIST, {"adapter": shared["b_ft"].pk}), client.get(LIST, {"adapter": 999_999})
    assert (foreign.status_code, foreign.json()) == (missing.status_code, missing.json()) == (200, foreign.json())
    assert foreign.json()["results"] == []
    # Tenants do not sell, whatever they name.
    assert world.client("a_admin").post(LIST, {"adapter": shared["a_ft"].pk}, format="json").status_code == 403


def test_the_adapter_is_fixed_and_a_reserved_adapter_is_not_deleted_from_under_it(world, shared):
    held = ReservationFactory(tenant=world.a.tenant, endpoint=shared["endpoint"], adapter=shared["s_ft"])
    operator = world.client("operator")
    url = reverse("reservation-detail", args=[held.pk])
    moved = operator.patch(url, {"adapter": shared["a_ft"].pk}, format="json")
    assert moved.status_code == 400 and "adapter" in moved.json()
    assert operator.patch(url, {"rpm_limit": 60}, format="json").status_code == 200

    gone = operator.delete(reverse("adapter-detail", args=[shared["s_ft"].pk]))
    assert gone.status_code == 409 and Adapter.objects.filter(pk=shared["s_ft"].pk).exists()
    # Made private to B while A holds a reservation on it: refused, A's reservation would be stranded.
    owner = operator.patch(reverse("adapter-detail", args=[shared["s_ft"].pk]), {"owner_tenant": world.b.tenant.pk})
    assert owner.status_code == 400 and "owner_tenant" in owner.json(), owner.content

    # RESTRICT, not PROTECT: deleting the endpoint still takes its adapters and their reservations along.
    Endpoint.objects.get(pk=shared["endpoint"].pk).delete()
    assert not CapacityReservation.objects.filter(pk=held.pk).exists()
