"""The books of LoRA adapter reservations (docs/lora.md): an adapter's reservation is MU/min sold on its endpoint
(the ledger's sold, the overcommit check, the tenant's reserved there), and a statement shows it beside the
adapter's use."""

from datetime import timedelta

import pytest
from django.utils import timezone

from billing.statements import statement_for
from capacity.ledger import capacity_ledger
from capacity.services import OvercommitRefused, reservation_sell
from endpoints.models import Adapter, ReplicaState
from tenants.models import CapacityReservation
from tests.factories import ReplicaFactory, UsageRecordFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def lora(tenant_a):
    """A's endpoint (A holds 100 MU/min for its base model there) with 2 ready replicas and A's adapter a-ft."""
    endpoint = tenant_a.endpoint
    ReplicaFactory.create_batch(2, endpoint=endpoint, state=ReplicaState.READY)
    ft = Adapter.objects.create(
        name="a-ft", owner_tenant=tenant_a.tenant, endpoint=endpoint, rank=8, artifact_path="a"
    )
    return endpoint, ft


def _rows(ledger, endpoint, tenant):
    row = next(r for r in ledger.endpoints if r.endpoint_id == endpoint.pk)
    return row, next(t for t in ledger.tenants if (t.endpoint_id, t.tenant_id) == (endpoint.pk, tenant.pk))


def test_an_adapter_reservation_is_sold_mu_on_its_endpoint(lora, tenant_a, settings):
    settings.INFERCAP = {**settings.INFERCAP, "OVERCOMMIT_LIMIT": 1.0}
    endpoint, ft = lora
    before, _ = _rows(capacity_ledger(), endpoint, tenant_a.tenant)
    assert before.sold_mu_per_min == 100.0
    reservation_sell(tenant=tenant_a.tenant, endpoint=endpoint, mu_per_min=40.0, adapter=ft)
    row, tenant_row = _rows(capacity_ledger(), endpoint, tenant_a.tenant)
    assert (
        row.sold_mu_per_min == 140.0 and row.available_to_sell_mu_per_min == before.available_to_sell_mu_per_min - 40
    )
    # One row for the tenant on the endpoint, its reserved MU/min the base model's and the adapter's together.
    assert [t.reserved_mu_per_min for t in capacity_ledger().tenants if t.endpoint_id == endpoint.pk] == [140.0]
    assert tenant_row.reserved_mu_per_min == 140.0
    # The overcommit check counts it: what is left is all another sale may take.
    shared = Adapter.objects.create(name="s-ft", owner_tenant=None, endpoint=endpoint, rank=8, artifact_path="s")
    with pytest.raises(OvercommitRefused):
        reservation_sell(
            tenant=tenant_a.tenant, endpoint=endpoint, mu_per_min=row.available_to_sell_mu_per_min + 1, adapter=shared
        )


def test_a_statement_shows_reserved_against_used_per_reserved_adapter(lora, tenant_a):
    endpoint, ft = lora
    start = timezone.now() - timedelta(hours=1)
    reservation = reservation_sell(tenant=tenant_a.tenant, endpoint=endpoint, mu_per_min=2.0, adapter=ft)
    for adapter, mu in (("a-ft", 30.0), ("a-ft", 20.0), ("other-ft", 5.0), ("", 7.0)):
        at = timezone.now() - timedelta(minutes=1)
        UsageRecordFactory(tenant=tenant_a.tenant, endpoint=endpoint, adapter=adapter, mu=mu, started_at=at,
                           finished_at=at)  # fmt: skip
    end = timezone.now()
    [line] = [line for line in statement_for(tenant=tenant_a.tenant, start=start, end=end).lines]
    minutes = (end - reservation.created_at).total_seconds() / 60
    base = CapacityReservation.objects.get(tenant=tenant_a.tenant, endpoint=endpoint, adapter__isnull=True)
    base_minutes = (end - base.created_at).total_seconds() / 60
    assert line.reserved_mu_per_min == 102.0
    assert line.reserved_mu == pytest.approx(100.0 * base_minutes + 2.0 * minutes)
    by_name = {row["adapter"]: row for row in line.adapters}
    assert by_name["a-ft"]["mu"] == 50.0 and by_name["a-ft"]["reserved_mu_per_min"] == 2.0
    assert by_name["a-ft"]["reserved_mu"] == pytest.approx(2.0 * minutes)
    assert "reserved_mu" not in by_name["other-ft"]  # used, never reserved: as before
