"""The split by hardware profile and capacity type, as pure arithmetic over plain rows (no database)."""

import pytest

from billing.cost_split import (
    Profile,
    ProfileSeconds,
    ServedUsage,
    allocate_int,
    endpoint_profile_costs,
    fleet_breakdown,
    gpu_hours_mix,
    split_amount,
    statement_parts,
    tenant_profile_costs,
    usage_by_profile,
)

ON_DEMAND = Profile(profile_id=1, name="a100-od", capacity_type="on_demand", gpus_per_replica=2, usd_per_gpu_hour=2.5)
SPOT = Profile(profile_id=2, name="h100-spot", capacity_type="spot", gpus_per_replica=1, usd_per_gpu_hour=1.2)
PROFILES = {1: ON_DEMAND, 2: SPOT}
EP, TA, TB = 10, 100, 200


def _usage(requests, good, out, good_out, mu):
    return {"requests": requests, "good": good, "output_tokens": out, "good_output_tokens": good_out, "mu": mu}


def test_allocations_keep_their_totals():
    assert allocate_int(10, [1, 1, 1]) == [4, 3, 3]  # the remainder goes to the earliest tie
    assert allocate_int(7, [0, 0]) == [4, 3]  # no weight: equal shares
    assert sum(allocate_int(1_000_003, [0.1, 0.7, 0.2])) == 1_000_003
    # Money: thirds of a cent-odd amount still sum to the rounded total, in micro-dollars.
    parts = split_amount(1.0000005, [1, 1, 1])
    assert sum(round(p * 1e6) for p in parts) == round(1.0000005 * 1e6)
    assert max(parts) - min(parts) == pytest.approx(1e-6)


@pytest.fixture
def fleet():
    """One endpoint for one hour: one 2-GPU on-demand replica and two 1-GPU spot ones."""
    seconds = [
        ProfileSeconds(endpoint_id=EP, profile_id=1, billed_s=3600, ready_s=3600),
        ProfileSeconds(endpoint_id=EP, profile_id=2, billed_s=2 * 3600, ready_s=2 * 3600),
    ]
    totals = {(EP, TA): _usage(30, 20, 3000, 2000, 900.0), (EP, TB): _usage(11, 11, 1100, 1100, 330.0)}
    served = [
        ServedUsage(endpoint_id=EP, tenant_id=TA, profile_id=1, sums=_usage(20, 10, 2000, 1000, 600.0)),
        ServedUsage(endpoint_id=EP, tenant_id=TA, profile_id=2, sums=_usage(10, 10, 1000, 1000, 300.0)),
        # B's records: 7 name a spot replica; 4 (say, refused before routing) name none.
        ServedUsage(endpoint_id=EP, tenant_id=TB, profile_id=2, sums=_usage(7, 7, 700, 700, 210.0)),
    ]
    return seconds, totals, served


def test_usage_goes_to_the_replica_that_served_it_and_the_rest_by_gpu_hours(fleet):
    seconds, totals, served = fleet
    mix = gpu_hours_mix(seconds, PROFILES)
    assert mix == {EP: {1: 2.0, 2: 2.0}}  # 1 replica × 2 GPUs, 2 replicas × 1 GPU
    split = usage_by_profile(totals=totals, served=served, mix=mix)
    assert split[(EP, TA)][1]["requests"] == 20 and split[(EP, TA)][2]["good_output_tokens"] == 1000
    # B's 4 unattributed requests (and 120 MU) go half and half, by the GPU-hour mix.
    assert split[(EP, TB)][1]["requests"] == 2 and split[(EP, TB)][2]["requests"] == 9
    assert split[(EP, TB)][1]["mu"] == pytest.approx(60.0)
    for key, sums in totals.items():
        for counter, total in sums.items():
            assert sum(p[counter] for p in split[key].values()) == pytest.approx(total), (key, counter)


def test_records_ahead_of_the_rollups_are_scaled_to_them():
    """Raw records not yet rolled up must not make the split exceed the unsplit figure."""
    served = [ServedUsage(endpoint_id=EP, tenant_id=TA, profile_id=1, sums=_usage(6, 6, 60, 60, 6.0))]
    split = usage_by_profile(totals={(EP, TA): _usage(3, 3, 30, 30, 3.0)}, served=served, mix={EP: {2: 1.0}})
    assert split[(EP, TA)][1]["requests"] == 3 and split[(EP, TA)][2]["requests"] == 0


def test_two_profiles_one_spot_cost_and_goodput_per_dollar(fleet):
    seconds, totals, served = fleet
    split = usage_by_profile(totals=totals, served=served, mix=gpu_hours_mix(seconds, PROFILES))
    rows = endpoint_profile_costs(seconds=seconds, profiles=PROFILES, usage=split)[EP]
    od, spot = rows
    assert (od.profile, od.capacity_type, spot.capacity_type) == ("a100-od", "on_demand", "spot")
    assert od.gpu_hours == pytest.approx(2.0) and od.usd == pytest.approx(5.0)
    assert spot.gpu_hours == pytest.approx(2.0) and spot.usd == pytest.approx(2.4)
    assert od.good_output_tokens == 1000 + 200 and spot.good_output_tokens == 1000 + 900
    assert od.good_requests == 10 + 2 and spot.good_requests == 10 + 9
    assert od.good_tokens_per_usd == pytest.approx(1200 / 5.0)
    assert spot.good_tokens_per_usd == pytest.approx(1900 / 2.4)
    assert spot.usd_per_1m_good_tokens == pytest.approx(2.4 / 1900 * 1e6)
    by_profile, by_type = fleet_breakdown(rows)
    assert [t.capacity_type for t in by_type] == ["on_demand", "spot"]
    assert by_type[1].usd == pytest.approx(2.4) and by_type[1].good_tokens_per_usd == pytest.approx(1900 / 2.4)
    # A tenant's split keeps its line's totals, weighted by its part of each profile's use.
    a_rows = tenant_profile_costs(
        endpoint_rows=rows, tenant_usage=split[(EP, TA)], gpu_hours=1.5, usd=3.0, pays_all=False
    )
    assert sum(r.usd for r in a_rows) == pytest.approx(3.0) and sum(r.gpu_hours for r in a_rows) == pytest.approx(1.5)
    a_od = next(r for r in a_rows if r.profile_id == 1)
    # A used 600 of the 660 on-demand MU and 300 of the 570 spot MU: weights 600/660 × $5 and 300/570 × $2.4.
    w_od, w_spot = 600 / 660 * 5.0, 300 / 570 * 2.4
    assert a_od.usd == pytest.approx(3.0 * w_od / (w_od + w_spot))
    owner = tenant_profile_costs(endpoint_rows=rows, tenant_usage={}, gpu_hours=4.0, usd=7.4, pays_all=True)
    assert [r.usd for r in owner] == pytest.approx([5.0, 2.4])  # the owner of a dedicated endpoint pays each as it ran


def test_statement_parts_sum_to_the_line_to_the_micro_dollar():
    usage = {1: _usage(1, 1, 1, 1, 1.0), 2: _usage(1, 1, 1, 1, 1.0), 3: _usage(1, 1, 1, 1, 1.0)}
    profiles = PROFILES | {3: Profile(3, "l40s-spot", "spot", 1, 0.9)}
    reserved, overage = 0.1234567, 2.0000001
    parts = statement_parts(reserved_usd=reserved, overage_usd=overage, usage=usage, mix={}, profiles=profiles)
    assert len(parts) == 3 and sum(p.share for p in parts) == pytest.approx(1.0)
    assert sum(round(p.total_usd * 1e6) for p in parts) == round((reserved + overage) * 1e6)
    assert sum(round(p.reserved_usd * 1e6) for p in parts) == round(reserved * 1e6)
    assert round(sum(p.total_usd for p in parts), 6) == round(reserved + overage, 6)
    for p in parts:
        assert p.reserved_usd + p.overage_usd == pytest.approx(p.total_usd, abs=1e-9)
    # No use at all (a reservation only): by the endpoint's GPU-hour mix.
    idle = statement_parts(reserved_usd=3.0, overage_usd=0.0, usage={}, mix={1: 3.0, 2: 1.0}, profiles=profiles)
    assert [(p.profile, p.total_usd) for p in idle] == [("a100-od", 2.25), ("h100-spot", 0.75)]
