"""The capacity ledger: have / sold / used arithmetic with reservations, usage and replica changes; overcommit."""

from datetime import UTC, datetime, timedelta

import pytest

from capacity.ledger import capacity_ledger
from capacity.services import OvercommitRefused, reservation_resize, reservation_sell
from endpoints.models import ReplicaState
from tenants.models import AuditEntry, CapacityReservation
from tests.factories import ReplicaFactory, UsageRecordFactory

NOW = datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC)
MINUTE_END = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def _usage(tenant, endpoint, at, mu, status="ok"):
    return UsageRecordFactory(tenant=tenant, endpoint=endpoint, mu=mu, status=status, started_at=at, finished_at=at)


def _roll_up():
    try:
        from billing.rollups import usage_rollup_run
    except ImportError:  # before the rollups exist the ledger reads raw usage
        return
    usage_rollup_run(now=NOW)


@pytest.fixture
def shared(tenant_a, tenant_b):
    """Tenant A's endpoint with 2 ready replicas (+1 starting, +1 warm standby) that tenant B also buys 300 on."""
    endpoint = tenant_a.endpoint
    ready = [ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY) for _ in range(2)]
    ReplicaFactory(endpoint=endpoint, state=ReplicaState.STARTING)
    ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY, is_standby=True)
    reservation_sell(tenant=tenant_b.tenant, endpoint=endpoint, mu_per_min=300)
    a, b = tenant_a.tenant, tenant_b.tenant
    _usage(a, endpoint, MINUTE_END - timedelta(seconds=30), 30)
    _usage(a, endpoint, MINUTE_END - timedelta(seconds=10), 20)
    _usage(b, endpoint, MINUTE_END - timedelta(seconds=50), 10)
    _usage(a, endpoint, MINUTE_END - timedelta(minutes=30), 600)
    _usage(a, endpoint, MINUTE_END - timedelta(minutes=5), 0, status="rate_limited")
    _usage(b, endpoint, MINUTE_END - timedelta(minutes=5), 0, status="shed")
    _usage(b, endpoint, MINUTE_END - timedelta(minutes=6), 0, status="shed")
    # 80 earlier minutes of steady 10 MU/min: they set the day's p95 (rank 1,368 of 1,440 minutes).
    for i in range(80):
        _usage(b, endpoint, MINUTE_END - timedelta(hours=2, minutes=i), 10)
    # Usage older than a day is outside every window.
    _usage(a, endpoint, MINUTE_END - timedelta(days=1, minutes=5), 10_000)
    _roll_up()
    return endpoint, ready


def _row(ledger, endpoint):
    return next(r for r in ledger.endpoints if r.endpoint_id == endpoint.pk)


def test_have_sold_used_headroom_overcommit(shared, tenant_a, tenant_b, settings):
    settings.INFERCAP = {**settings.INFERCAP, "OVERCOMMIT_LIMIT": 1.5}
    endpoint, _ = shared
    ledger = capacity_ledger(now=NOW)
    row = _row(ledger, endpoint)
    assert row.replica_mu_per_min == endpoint.model_profile.mu_per_min == 1000
    assert row.ready_replicas == 2  # starting and standby replicas are not capacity
    assert row.have_mu_per_min == 2000
    assert row.sold_mu_per_min == 100 + 300
    assert row.used_mu_per_min_1m == pytest.approx(60)
    assert row.used_mu_per_min_1h == pytest.approx((60 + 600) / 60)
    assert row.used_mu_per_min_p95_1d == pytest.approx(10)
    assert row.headroom_mu_per_min == pytest.approx(2000 - 60)
    assert row.unsold_mu_per_min == pytest.approx(1600)
    assert row.overcommit_ratio == pytest.approx(0.2)
    assert row.available_to_sell_mu_per_min == pytest.approx(1.5 * 2000 - 400)  # OVERCOMMIT_LIMIT 1.5
    assert (row.throttled_1h, row.shed_1h) == (1, 2)
    # The other endpoint (tenant B's own, no replicas) adds sold but no capacity.
    assert ledger.total["have_mu_per_min"] == 2000
    assert ledger.total["sold_mu_per_min"] == 500
    assert ledger.total["overcommit_ratio"] == pytest.approx(0.25)


def test_replica_changes_move_have_and_headroom(shared):
    endpoint, ready = shared
    ready[0].state = ReplicaState.DRAINING
    ready[0].save()
    row = _row(capacity_ledger(now=NOW), endpoint)
    assert row.have_mu_per_min == 1000
    assert row.headroom_mu_per_min == pytest.approx(940)
    assert row.overcommit_ratio == pytest.approx(0.4)
    ready[1].state = ReplicaState.FAILED
    ready[1].save()
    row = _row(capacity_ledger(now=NOW), endpoint)
    assert row.have_mu_per_min == 0 and row.overcommit_ratio is None and row.utilization_1h is None


def test_per_tenant_reserved_vs_used(shared, tenant_a, tenant_b):
    endpoint, _ = shared
    rows = {(r.tenant_id, r.endpoint_id): r for r in capacity_ledger(now=NOW).tenants}
    a = rows[(tenant_a.tenant.pk, endpoint.pk)]
    b = rows[(tenant_b.tenant.pk, endpoint.pk)]
    assert (a.reserved_mu_per_min, a.used_mu_per_min_1m) == (100, pytest.approx(50))
    assert a.used_mu_per_min_1h == pytest.approx(650 / 60)
    assert (a.throttled_1h, a.shed_1h) == (1, 0)
    assert (b.reserved_mu_per_min, b.used_mu_per_min_1m, b.shed_1h) == (300, pytest.approx(10), 2)
    assert b.reservation_use_1h == pytest.approx(10 / 60 / 300)


def test_tenant_view_holds_only_its_own_rows(shared, tenant_a, tenant_b):
    ledger = capacity_ledger(now=NOW, tenant_id=tenant_b.tenant.pk)
    assert ledger.endpoints == [] and ledger.total == {}
    assert {r.tenant_id for r in ledger.tenants} == {tenant_b.tenant.pk}


@pytest.fixture
def two_replicas(tenant_a, settings):
    settings.INFERCAP = {**settings.INFERCAP, "OVERCOMMIT_LIMIT": 1.5}
    for _ in range(2):
        ReplicaFactory(endpoint=tenant_a.endpoint, state=ReplicaState.READY)
    return tenant_a.endpoint  # capacity 2 × 1000 MU/min, 100 already sold to tenant A


def test_selling_up_to_the_limit_then_refused(two_replicas, tenant_b, operator):
    endpoint = two_replicas
    sold = reservation_sell(tenant=tenant_b.tenant, endpoint=endpoint, mu_per_min=2900, actor=operator)
    assert AuditEntry.objects.filter(action="reservation.create", object_id=str(sold.pk)).exists()
    sold.delete()
    with pytest.raises(OvercommitRefused) as info:
        reservation_sell(tenant=tenant_b.tenant, endpoint=endpoint, mu_per_min=2901, actor=operator)
    message = info.value.message_dict["mu_per_min"][0]
    assert "overcommit limit is 1.5×" in message and "at most 2900 MU/min" in message
    assert not CapacityReservation.objects.filter(tenant=tenant_b.tenant, endpoint=endpoint).exists()


def test_resize_checks_growth_only(two_replicas, tenant_a):
    reservation = CapacityReservation.objects.get(tenant=tenant_a.tenant, endpoint=two_replicas)
    reservation_resize(reservation=reservation, mu_per_min=3000)
    with pytest.raises(OvercommitRefused):
        reservation_resize(reservation=reservation, mu_per_min=3001)
    reservation.refresh_from_db()
    assert reservation.mu_per_min == 3000
    reservation_resize(reservation=reservation, mu_per_min=50)
    assert AuditEntry.objects.filter(action="reservation.resize").count() == 2


def test_no_capacity_means_nothing_to_sell(tenant_a, tenant_b):
    endpoint = tenant_a.endpoint
    endpoint.min_replicas = 0
    endpoint.save()
    with pytest.raises(OvercommitRefused, match="no capacity to sell"):
        reservation_sell(tenant=tenant_b.tenant, endpoint=endpoint, mu_per_min=1)


def test_tenants_service_delegates_to_the_overcommit_check(two_replicas, tenant_b):
    from capacity.services import reservation_create

    with pytest.raises(OvercommitRefused):
        reservation_create(tenant=tenant_b.tenant, endpoint=two_replicas, mu_per_min=10_000)


def test_ledger_queries_do_not_grow_with_endpoints(shared, django_assert_max_num_queries):
    from tests.factories import EndpointFactory, ReservationFactory

    for _ in range(5):
        ReservationFactory(endpoint=EndpointFactory())
    with django_assert_max_num_queries(10):
        ledger = capacity_ledger(now=NOW)
    assert len(ledger.endpoints) == 7


def test_raw_usage_fallback_gives_the_same_ledger(shared, monkeypatch):
    from capacity import ledger as ledger_module

    from_rollups = capacity_ledger(now=NOW)
    monkeypatch.setattr(ledger_module, "_rollup_model", lambda: None)
    from_raw = capacity_ledger(now=NOW)
    assert from_raw.as_dict() == from_rollups.as_dict()
    assert from_raw.total["used_mu_per_min_1h"] > 0
