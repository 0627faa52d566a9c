"""Cost reports and statements split by hardware profile and capacity type, from real replica lifetimes and usage
records: totals, tenant isolation, the API fields and the console tables."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from billing.api.schemas import ProfileCostSerializer, StatementPartSerializer
from billing.cost import cost_lines
from billing.models import UsageStatus
from billing.rollups import usage_rollup_run
from billing.statements import statement_for
from capacity.models import HardwareProfile
from endpoints.models import EndpointVersion, ReplicaState, ReplicaTransition
from tests.conftest import client_for
from tests.factories import EndpointFactory, ReplicaFactory, ReservationFactory, UsageRecordFactory


def _profile(name: str, gpu: str, memory_gb: float, bandwidth_gbps: float, usd: float, **extra) -> HardwareProfile:
    return HardwareProfile.objects.create(
        name=name, gpu_type=gpu, gpus_per_replica=1, gpu_memory_gb=memory_gb, memory_bandwidth_gbps=bandwidth_gbps,
        usd_per_gpu_hour=usd, **extra,
    )  # fmt: skip


@pytest.fixture
def mixed(tenant_a, tenant_b):
    """A shared endpoint mid-rollout from on-demand A100s (v1) to spot H100s (v2): one replica of each, ready for
    the last two hours; tenant A's requests ran on both, tenant B's on the spot one (plus one that named no replica).
    """
    now = timezone.now().replace(microsecond=0)
    od = _profile("a100-od", "A100", 80, 2039, 2.5)
    spot = _profile("h100-spot", "H100", 80, 3350, 1.2, capacity_type=HardwareProfile.CapacityType.SPOT)
    endpoint = EndpointFactory(name="mixed-13b", hardware_profile=spot)
    v1, v2 = (
        EndpointVersion.objects.create(endpoint=endpoint, number=n, model_profile=endpoint.model_profile, hardware_profile=hw)
        for n, hw in ((1, od), (2, spot))
    )  # fmt: skip
    endpoint.current_version = v2
    endpoint.save()
    old = ReplicaFactory(endpoint=endpoint, version=v1, state=ReplicaState.READY)
    new = ReplicaFactory(endpoint=endpoint, version=v2, state=ReplicaState.READY)
    for replica in (old, new):
        ReplicaTransition.objects.create(
            replica=replica, from_state="starting", to_state="ready", at=now - 2 * timedelta(hours=1)
        )
    for tenant in (tenant_a.tenant, tenant_b.tenant):
        ReservationFactory(tenant=tenant, endpoint=endpoint, mu_per_min=1.0, created_at=now - timedelta(days=40))

    def served(tenant, replica, n, *, good, mu=50.0, status=UsageStatus.OK):
        for i in range(n):
            at = now - timedelta(minutes=1 + i % 4)
            UsageRecordFactory(
                tenant=tenant, endpoint=endpoint, replica=replica, output_tokens=100, mu=mu, slo_met=i < good,
                status=status, started_at=at - timedelta(seconds=2), finished_at=at,
            )  # fmt: skip

    served(tenant_a.tenant, old, 10, good=8)
    served(tenant_a.tenant, new, 6, good=6)
    served(tenant_b.tenant, new, 4, good=2)
    served(tenant_b.tenant, None, 1, good=0, mu=0.0, status=UsageStatus.RATE_LIMITED)
    usage_rollup_run(now=now)
    return {"endpoint": endpoint, "od": od, "spot": spot, "now": now}


def _by_name(rows):
    return {r.profile if hasattr(r, "profile") else r["profile"]: r for r in rows}


def test_endpoint_line_split_by_hardware_and_capacity_type(mixed, tenant_a, tenant_b):
    now, endpoint = mixed["now"], mixed["endpoint"]
    lines = cost_lines(start=now - 2 * timedelta(hours=1), end=now, endpoints=[endpoint], now=now)
    line = lines[0]
    assert line.tenant_id is None
    rows = _by_name(line.by_hardware)
    od, spot = rows["a100-od"], rows["h100-spot"]
    assert (od.capacity_type, spot.capacity_type) == ("on_demand", "spot")
    # Each replica at its own version's hardware rate: 2 h × $2.5 + 2 h × $1.2.
    assert od.usd == pytest.approx(5.0) and spot.usd == pytest.approx(2.4)
    assert line.usd == pytest.approx(7.4) and line.gpu_hours == pytest.approx(4.0)
    # 10 served by the A100; the one request without a replica went by the GPU-hour mix (1:1, a tie: to the profile
    # created first).
    assert (od.requests, od.good_requests, od.good_output_tokens) == (11, 8, 800)
    assert spot.requests == 10 and line.requests == 21
    assert spot.good_output_tokens == 600 + 200
    assert spot.good_tokens_per_usd == pytest.approx(800 / 2.4) and od.good_tokens_per_usd == pytest.approx(800 / 5)
    for name in ("gpu_hours", "usd", "used_mu", "good_output_tokens", "output_tokens", "requests"):
        assert sum(getattr(r, name) for r in line.by_hardware) == pytest.approx(getattr(line, name)), name
    for tenant_line in lines[1:]:
        assert sum(r.usd for r in tenant_line.by_hardware) == pytest.approx(tenant_line.usd)
        assert sum(r.requests for r in tenant_line.by_hardware) == tenant_line.requests
    b_line = next(ln for ln in lines if ln.tenant_id == tenant_b.tenant.pk)
    assert {r.profile for r in b_line.by_hardware if r.used_mu} == {"h100-spot"}


def test_statement_parts_total_the_line(mixed, tenant_a, settings):
    settings.INFERCAP = {**settings.INFERCAP, "RESERVED_USD_PER_1K_MU": 0.0123457, "OVERAGE_USD_PER_1K_MU": 0.0987651}
    now = mixed["now"]
    statement = statement_for(tenant=tenant_a.tenant, start=now - timedelta(days=3), end=now, now=now)
    line = next(ln for ln in statement.lines if ln.endpoint_id == mixed["endpoint"].pk)
    parts = _by_name(line.by_hardware)
    assert parts["a100-od"].used_mu == pytest.approx(500) and parts["h100-spot"].used_mu == pytest.approx(300)
    assert parts["a100-od"].share == pytest.approx(500 / 800)
    body = statement.as_dict()
    body_line = next(ln for ln in body["lines"] if ln["endpoint_id"] == mixed["endpoint"].pk)
    # The unsplit figure as the API rounds it, and the parts in micro-dollars: equal, rounding included.
    assert sum(round(p["total_usd"] * 1e6) for p in body_line["by_hardware"]) == round(body_line["total_usd"] * 1e6)
    assert sum(round(p["reserved_usd"] * 1e6) for p in body_line["by_hardware"]) == round(line.reserved_usd * 1e6)
    assert round(sum(r["total_usd"] for r in body["by_hardware"]), 6) == body["total_usd"]


def test_api_fields_and_tenant_isolation(mixed, tenant_a, tenant_b, operator):
    now = mixed["now"]
    window = f"start={(now - timedelta(hours=2)).isoformat()}&end={now.isoformat()}".replace("+", "%2B")
    fleet = client_for(operator).get(f"/api/v1/cost-reports/by-hardware/?{window}").json()
    assert fleet["scope"] == "fleet"
    profiles = _by_name(fleet["by_profile"])
    assert set(ProfileCostSerializer().fields) == set(profiles["h100-spot"])
    assert profiles["a100-od"]["usd"] == pytest.approx(5.0) and profiles["h100-spot"]["capacity_type"] == "spot"
    assert {t["capacity_type"] for t in fleet["by_capacity_type"]} >= {"on_demand", "spot"}
    live = client_for(tenant_a.member).get(f"/api/v1/cost-reports/live/?{window}").json()
    mine = [ln for ln in live if ln["endpoint"] == "mixed-13b"]
    assert mine and all(ln["tenant"] == "tenant-a" for ln in mine)  # not the endpoint's line, not B's
    assert set(ProfileCostSerializer().fields) == set(mine[0]["by_hardware"][0])
    # Tenant B's breakdown holds its own use only (5 requests), never tenant A's (16).
    b = client_for(tenant_b.member).get(f"/api/v1/cost-reports/by-hardware/?{window}").json()
    assert b["scope"] == "tenant" and sum(p["requests"] for p in b["by_profile"]) == 5
    statement = client_for(tenant_a.member).get("/api/v1/statements/").json()
    line = next(ln for ln in statement["lines"] if ln["endpoint"] == "mixed-13b")
    assert set(StatementPartSerializer().fields) == set(line["by_hardware"][0])
    assert client_for(tenant_b.member).get(f"/api/v1/statements/?tenant={tenant_a.tenant.pk}").status_code == 404
    b_statement = client_for(tenant_b.member).get("/api/v1/statements/").json()
    assert b_statement["tenant"] == "tenant-b"
    b_line = next(ln for ln in b_statement["lines"] if ln["endpoint"] == "mixed-13b")
    assert {p["profile"] for p in b_line["by_hardware"] if p["used_mu"]} == {"h100-spot"}


def test_console_pages_show_the_hardware_tables(client, mixed, tenant_a, tenant_b, operator):
    client.force_login(operator)
    page = client.get(reverse("console:cost")).content.decode()
    table = page[page.index('id="by-hardware"') :]
    assert "a100-od" in table and "h100-spot" in table and "All spot" in table
    client.force_login(tenant_b.member)
    statement = client.get(reverse("console:statement")).content.decode()
    table = statement[statement.index('id="by-hardware"') :]
    assert "mixed-13b" in table and "h100-spot" in table


def test_a_mig_slice_hour_is_its_share_of_a_gpu_hour_at_the_slice_price(tenant_a):
    """Two 1g.10gb replicas and one whole A100, each ready for two hours: dollars at each profile's own price (a
    slice's per slice-hour), GPU-hours counting a slice as 1/7 of a GPU, so seven slices of one GPU are one GPU."""
    now = timezone.now().replace(microsecond=0)
    whole = _profile("a100-whole", "A100", 80, 2039, 2.8)
    slice_ = _profile("a100-1g", "A100", 10, 255, 0.45, mig_profile="1g.10gb")
    assert (whole.gpu_share(), slice_.gpu_share()) == (1.0, pytest.approx(1 / 7))
    endpoint = EndpointFactory(name="small-on-slices", hardware_profile=slice_)
    v1, v2 = (
        EndpointVersion.objects.create(endpoint=endpoint, number=n, model_profile=endpoint.model_profile, hardware_profile=hw)
        for n, hw in ((1, whole), (2, slice_))
    )  # fmt: skip
    replicas = [ReplicaFactory(endpoint=endpoint, version=v, state=ReplicaState.READY) for v in (v1, v2, v2)]
    for replica in replicas:
        ReplicaTransition.objects.create(
            replica=replica, from_state="starting", to_state="ready", at=now - timedelta(hours=2)
        )
    line = cost_lines(start=now - timedelta(hours=2), end=now, endpoints=[endpoint], now=now)[0]
    rows = _by_name(line.by_hardware)
    assert rows["a100-1g"].usd == pytest.approx(2 * 2 * 0.45)  # 4 slice-hours at the slice's price
    assert rows["a100-1g"].gpu_hours == pytest.approx(4 / 7)
    assert rows["a100-whole"].usd == pytest.approx(5.6) and rows["a100-whole"].gpu_hours == pytest.approx(2.0)
    assert line.gpu_hours == pytest.approx(2 + 4 / 7) and line.usd == pytest.approx(5.6 + 1.8)
