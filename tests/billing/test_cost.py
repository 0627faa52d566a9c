"""Cost report arithmetic: GPU-hours from replica lifetimes, goodput per dollar, idle cost, allocation, statements."""

from datetime import UTC, datetime, timedelta

import pytest

from billing.cost import cost_csv, cost_lines, cost_reports_store, state_seconds
from billing.models import CostReport, UsageDay, UsageHour, UsageMinute
from billing.rollups import DAY, recompute_coarser
from billing.statements import statement_for
from capacity.models import HardwareProfile
from endpoints.models import ReplicaState, ReplicaTransition
from tests.factories import EndpointFactory, ReplicaFactory, ReservationFactory, TenantFactory

DAY0 = datetime(2026, 11, 28, tzinfo=UTC)
H = timedelta(hours=1)


def _moves(replica, *steps):
    """steps: (offset, from, to) transitions of a replica, offsets from DAY0."""
    for offset, from_state, to_state in steps:
        ReplicaTransition.objects.create(replica=replica, from_state=from_state, to_state=to_state, at=DAY0 + offset)


def test_state_seconds_counts_only_billed_states():
    transitions = [(DAY0 + 2 * H, "ready"), (DAY0 + 5 * H, "draining"), (DAY0 + 6 * H, "stopped")]
    billed = state_seconds(
        state_at_start="starting", transitions=transitions, start=DAY0, end=DAY0 + 24 * H, states={"ready", "draining"}
    )
    assert billed == 4 * 3600
    # A window inside the ready span, with the state carried in from before it.
    inner = state_seconds(
        state_at_start="ready", transitions=[], start=DAY0 + 3 * H, end=DAY0 + 4 * H, states={"ready", "draining"}
    )
    assert inner == 3600


@pytest.fixture
def shared(tenant_a, tenant_b):
    """A shared endpoint on 2-GPU replicas at $3/GPU-hour, 1,000 MU/min per replica, used by tenants A and B."""
    hardware = HardwareProfile.objects.create(
        name="h100x2",
        gpu_type="H100",
        gpus_per_replica=2,
        gpu_memory_gb=80,
        memory_bandwidth_gbps=3350,
        usd_per_gpu_hour=3.0,
    )
    endpoint = EndpointFactory(name="shared-13b", hardware_profile=hardware)
    endpoint.model_profile.mu_per_min = 1000.0
    endpoint.model_profile.save()
    r1 = ReplicaFactory(endpoint=endpoint, state=ReplicaState.STOPPED)
    r2 = ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY)
    # r1: ready 01:00–05:00, draining 05:00–05:30, then stopped. r2: ready from 02:00 to the end of the day.
    _moves(
        r1,
        (0 * H, "pending", "starting"),
        (1 * H, "starting", "ready"),
        (5 * H, "ready", "draining"),
        (5.5 * H, "draining", "stopped"),
    )
    _moves(r2, (1.5 * H, "pending", "starting"), (2 * H, "starting", "ready"))
    # Usage 02:00–03:00: A uses 30,000 MU, B 15,000 MU; A's requests are all good, B's half.
    for tenant, mu, good in ((tenant_a.tenant, 30_000.0, 1_000), (tenant_b.tenant, 15_000.0, 250)):
        UsageMinute.objects.create(
            endpoint=endpoint,
            tenant=tenant,
            start=DAY0 + 2 * H + timedelta(minutes=10),
            requests=500,
            ok=500,
            good=good // 4,
            mu=mu,
            output_tokens=2 * good,
            good_output_tokens=good,
            input_tokens=100,
        )
    _roll_up_day()
    return endpoint


def _roll_up_day():
    recompute_coarser(UsageHour, [(DAY0, DAY0 + DAY)])
    recompute_coarser(UsageDay, [(DAY0, DAY0 + DAY)])


def test_endpoint_and_tenant_lines(shared, tenant_a, tenant_b):
    start, end = DAY0 + 2 * H, DAY0 + 3 * H
    lines = {(ln.endpoint_id, ln.tenant_id): ln for ln in cost_lines(start=start, end=end, now=DAY0 + 30 * H)}
    line = lines[(shared.pk, None)]
    # Two replicas ready the whole hour × 2 GPUs = 4 GPU-hours at $3.
    assert line.gpu_hours == pytest.approx(4.0)
    assert line.usd == pytest.approx(12.0)
    assert line.capacity_mu == pytest.approx(2 * 60 * 1000)
    assert line.used_mu == pytest.approx(45_000)
    assert line.utilization == pytest.approx(45_000 / 120_000)
    assert line.idle_usd == pytest.approx(12.0 * (1 - 0.375))
    assert line.good_output_tokens == 1250
    assert line.good_tokens_per_usd == pytest.approx(1250 / 12.0)
    assert line.usd_per_1m_good_tokens == pytest.approx(12.0 / 1250 * 1e6)
    a, b = lines[(shared.pk, tenant_a.tenant.pk)], lines[(shared.pk, tenant_b.tenant.pk)]
    # Tenants pay their share of the capacity that was up; the idle rest stays with the operator.
    assert a.usd == pytest.approx(12.0 * 30_000 / 120_000)
    assert b.usd == pytest.approx(12.0 * 15_000 / 120_000)
    assert a.usd + b.usd + line.idle_usd == pytest.approx(line.usd)
    assert b.good_tokens_per_usd == pytest.approx(250 / b.usd)


def test_gpu_hours_over_the_whole_day_follow_replica_lifetimes(shared):
    lines = cost_lines(start=DAY0, end=DAY0 + 24 * H, now=DAY0 + 30 * H)
    line = next(ln for ln in lines if ln.endpoint_id == shared.pk and ln.tenant_id is None)
    # r1: 4 h ready + 0.5 h draining; r2: 22 h ready. × 2 GPUs.
    assert line.gpu_hours == pytest.approx((4.5 + 22) * 2)
    assert line.capacity_mu == pytest.approx((4 + 22) * 60 * 1000)  # draining is billed but is not capacity


def test_dedicated_endpoint_owner_pays_everything(tenant_a):
    endpoint = tenant_a.endpoint  # owned by tenant A
    replica = ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY)
    _moves(replica, (0 * H, "starting", "ready"))
    UsageMinute.objects.create(endpoint=endpoint, tenant=tenant_a.tenant, start=DAY0 + timedelta(minutes=5), mu=600.0)
    _roll_up_day()
    lines = cost_lines(start=DAY0, end=DAY0 + H, endpoints=[endpoint], now=DAY0 + 30 * H)
    endpoint_line, owner_line = lines
    assert endpoint_line.usd == pytest.approx(2.5)  # factory hardware: 1 GPU at $2.5
    assert owner_line.usd == pytest.approx(2.5)
    assert owner_line.idle_usd == pytest.approx(endpoint_line.idle_usd) and owner_line.idle_usd > 0


def test_reports_are_stored_idempotently_and_export_as_csv(shared):
    # Three endpoints (the actors' two and the shared one) plus the shared one's two tenants.
    assert cost_reports_store(granularity="hour", start=DAY0 + 2 * H + timedelta(minutes=20), now=DAY0 + 30 * H) == 5
    assert cost_reports_store(granularity="hour", start=DAY0 + 2 * H, now=DAY0 + 30 * H) == 5
    stored = CostReport.objects.filter(granularity="hour", start=DAY0 + 2 * H, endpoint=shared)
    assert stored.count() == 3
    assert stored.get(tenant__isnull=True).usd == pytest.approx(12.0)
    csv_text = cost_csv(cost_lines(start=DAY0, end=DAY0 + H, now=DAY0 + 30 * H))
    header, *rows = csv_text.strip().splitlines()
    assert header.startswith("endpoint_id,endpoint,tenant_id,tenant,start,end,gpu_hours,usd")
    assert rows


def test_statement_with_overage(shared, tenant_a, tenant_b, settings):
    settings.INFERCAP = {**settings.INFERCAP, "RESERVED_USD_PER_1K_MU": 0.01, "OVERAGE_USD_PER_1K_MU": 0.04}
    ReservationFactory(tenant=tenant_a.tenant, endpoint=shared, mu_per_min=200.0, created_at=DAY0 - 10 * H)
    start, end = DAY0, DAY0 + 24 * H
    statement = statement_for(tenant=tenant_a.tenant, start=start, end=end, now=DAY0 + 30 * H)
    line = next(ln for ln in statement.lines if ln.endpoint_id == shared.pk)
    assert line.reserved_mu == pytest.approx(200 * 1440)
    assert line.used_mu == pytest.approx(30_000)
    assert line.overage_mu == 0
    # Tenant B has no reservation on the shared endpoint: all of its use is overage.
    b_line = next(
        ln for ln in statement_for(tenant=tenant_b.tenant, start=start, end=end).lines if ln.endpoint_id == shared.pk
    )
    assert b_line.reserved_mu == 0 and b_line.overage_mu == pytest.approx(15_000)
    assert b_line.overage_usd == pytest.approx(15 * 0.04)
    # A reservation bought halfway through the period counts only from then on.
    late = TenantFactory()
    ReservationFactory(tenant=late, endpoint=shared, mu_per_min=10.0, created_at=DAY0 + 12 * H)
    UsageMinute.objects.create(endpoint=shared, tenant=late, start=DAY0 + 13 * H, mu=10_000.0)
    _roll_up_day()
    late_line = statement_for(tenant=late, start=start, end=end, now=DAY0 + 30 * H).lines[0]
    assert late_line.reserved_mu == pytest.approx(10 * 720)
    assert late_line.overage_mu == pytest.approx(10_000 - 7_200)
    assert late_line.reserved_usd == pytest.approx(7.2 * 0.01)
    assert late_line.overage_usd == pytest.approx(2.8 * 0.04)


def test_bad_ranges_are_refused(shared):
    with pytest.raises(ValueError):
        cost_lines(start=DAY0, end=DAY0)
