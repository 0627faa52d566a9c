"""The heterogeneous planner (capacity.planning.mix): its ILP, its capacity model, its errors, its API and command,
and bench economics' figures (docs/algorithms.md#the-heterogeneous-planner)."""

import json
from io import StringIO
from types import SimpleNamespace

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from capacity.hardware.profiles import get_profile
from capacity.planning.mix import (
    Bucket,
    PlanError,
    ReplicaType,
    Slo,
    best_single_type,
    bucket_capacity,
    plan_mix,
    with_capacities,
)
from tests.conftest import client_for
from tests.factories import HardwareProfileFactory

SMALL, LONG = Bucket("small", 128, 64, 40.0), Bucket("long", 6000, 256, 10.0)
# By hand: the cheap type serves 10 small/s or 0.5 long/s per replica at $1/h, the fast one 20 small or 5 long at
# $4/h. Small on cheap: 4 replicas, $4 (on fast: 2, $8). Long on fast: 2 replicas, $8 (on cheap: 20, $20).
CHEAP = ReplicaType("cheap", usd_per_gpu_hour=1.0, capacity_rps={"small": 10.0, "long": 0.5})
FAST = ReplicaType("fast", usd_per_gpu_hour=2.0, gpus_per_replica=2, capacity_rps={"small": 20.0, "long": 5.0})


def test_the_ilp_puts_small_requests_on_the_cheap_gpu_and_long_prompts_on_the_fast_one():
    plan = plan_mix([SMALL, LONG], [CHEAP, FAST])
    assert plan.replicas == {"cheap": 4, "fast": 2}
    assert plan.shares == {"small": {"cheap": 1.0}, "long": {"fast": 1.0}}
    assert plan.usd_per_hour == pytest.approx(12.0) and plan.optimal
    why = {row["bucket"]: row for row in plan.why}
    # Tokens per dollar: small on cheap 10·192·3600/1 = 6.9M vs fast 20·192·3600/4 = 3.5M.
    assert why["small"]["tokens_per_usd"] == {"cheap": 6_912_000, "fast": 3_456_000}
    assert why["small"]["cheapest_per_token"] == "cheap" and why["long"]["cheapest_per_token"] == "fast"
    name, single = best_single_type([SMALL, LONG], [CHEAP, FAST])
    assert (name, single.replicas, single.usd_per_hour) == ("fast", {"fast": 4}, pytest.approx(16.0))


def test_availability_bounds_the_cheap_type_and_the_rest_spills_over():
    bounded = ReplicaType("cheap", usd_per_gpu_hour=1.0, max_replicas=2, capacity_rps=CHEAP.capacity_rps)
    plan = plan_mix([SMALL, LONG], [bounded, FAST])
    # 2 cheap replicas take 20 small/s; the other 20 small/s (1 fast replica) and the long bucket (2) go fast.
    assert plan.replicas == {"cheap": 2, "fast": 3}
    assert plan.shares["small"] == {"cheap": 0.5, "fast": 0.5}
    assert plan.usd_per_hour == pytest.approx(14.0)


def test_bucket_capacity_follows_the_step_model_by_hand():
    engine = SimpleNamespace(
        decode_t0_s=0.01, decode_per_seq_s=0.001, decode_per_ctx_token_s=0.0, prefill_s=lambda n: 0.0,
        max_num_seqs=256, num_gpu_blocks=10_000, block_size=16, max_model_len=8192,
    )  # fmt: skip
    # B_max = (0.05 − 0.01) / 0.001 = 40; at headroom 1, tpot = 0.05 s and 40 / (100 · 0.05) = 8 requests/s.
    assert bucket_capacity(engine, Bucket("b", 100, 100, 1), Slo(1.0, 0.05), headroom=1.0) == pytest.approx(8.0)
    # Planned at headroom 0.5 of that rate: 4/s.
    assert bucket_capacity(engine, Bucket("b", 100, 100, 1), Slo(1.0, 0.05), headroom=0.5) == pytest.approx(4.0)
    assert bucket_capacity(engine, Bucket("b", 8000, 500, 1), Slo(1.0, 0.05)) == 0.0  # past max_model_len


def test_roofline_profiles_make_l40s_cheapest_for_chat_and_only_h100_prefills_long_prompts_in_time():
    slo = Slo(ttft_s=1.0, tpot_s=0.05)
    chat, doc = Bucket("chat", 512, 128, 200.0), Bucket("doc", 7168, 512, 2.0)
    types = with_capacities(
        [ReplicaType("l40s", 1.861), ReplicaType("h100", 12.29)],
        {"l40s": get_profile("llama-8b-l40s"), "h100": get_profile("llama-8b-h100")},
        [chat, doc],
        slo,
    )
    l40s, h100 = types
    assert l40s.capacity_rps["doc"] == 0.0 < h100.capacity_rps["doc"]  # 7k tokens prefill in > 0.5 s on an L40S
    plan = plan_mix([chat, doc], types)
    # The H100s the documents need take what chat fits in their spare capacity; the rest of chat goes to L40S.
    assert plan.shares["doc"] == {"h100": 1.0} and plan.shares["chat"]["l40s"] > 0.8
    assert plan.usd_per_hour < best_single_type([chat, doc], types)[1].usd_per_hour


def test_no_price_names_the_profile():
    unpriced = ReplicaType("h100-unpriced", usd_per_gpu_hour=None, capacity_rps={"small": 1.0})
    with pytest.raises(PlanError) as err:
        plan_mix([SMALL], [CHEAP, unpriced])
    assert err.value.field == "usd_per_gpu_hour" and "h100-unpriced" in err.value.message


def test_a_bucket_no_profile_serves_is_named():
    with pytest.raises(PlanError) as err:
        plan_mix([SMALL, Bucket("huge", 100_000, 10, 1.0)], [CHEAP, FAST])
    assert err.value.field == "buckets" and "'huge'" in err.value.message


def test_too_little_availability_is_infeasible():
    scarce = [ReplicaType(t.name, t.usd_per_gpu_hour, t.gpus_per_replica, max_replicas=1, capacity_rps=t.capacity_rps)
              for t in (CHEAP, FAST)]  # fmt: skip
    with pytest.raises(PlanError) as err:
        plan_mix([SMALL, LONG], scarce)
    assert err.value.field == "max_replicas" and "cheap ≤ 1" in err.value.message


def test_a_solver_time_out_is_an_error():
    with pytest.raises(PlanError) as err:
        plan_mix([SMALL, LONG], [CHEAP, FAST], time_limit_s=1e-9)
    assert err.value.field == "time_limit_s" and "no plan within" in err.value.message


MIX_URL = "/api/v1/capacity/plan-mix"


def _body(*profiles, buckets=None):
    return {
        "profiles": [{"hardware_profile": p.pk, "sim_profile": s} for p, s in profiles],
        "buckets": buckets or [
            {"name": "chat", "prompt_tokens": 512, "output_tokens": 128, "rate_rps": 200},
            {"name": "doc", "prompt_tokens": 7168, "output_tokens": 512, "rate_rps": 2},
        ],
        "slo": {"ttft_s": 1.0, "tpot_s": 0.05},
    }  # fmt: skip


@pytest.mark.django_db
def test_api_plans_a_mix_over_stored_profiles(tenant_a):
    l40s = HardwareProfileFactory(name="l40s", gpu_type="L40S", usd_per_gpu_hour=1.861)
    h100 = HardwareProfileFactory(name="h100", gpu_type="H100", usd_per_gpu_hour=12.29, max_replicas=8)
    response = client_for(tenant_a.member).post(
        MIX_URL, _body((l40s, "llama-8b-l40s"), (h100, "llama-8b-h100")), format="json"
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["shares"]["doc"] == {"h100": 1.0} and body["shares"]["chat"]["l40s"] > 0.8
    assert body["replicas"]["h100"] <= 8 and body["capacity_rps"]["l40s"]["doc"] == 0.0
    # H100 alone would need more than the 8 the market offers, and L40S cannot prefill the documents in time.
    assert body["best_single_type"] == {
        "type": None,
        "reason": "no single profile can serve every bucket within the SLO",
    }
    # What an endpoint's cost_aware router routes by: L40S cannot take the documents (batch 0), the shares follow.
    from gateway.routing.cost_aware import plan_figures

    routing = plan_figures(body["routing_plan"])
    assert routing["figures"]["l40s"].batch["doc"] == 0 and routing["figures"]["h100"].batch["doc"] >= 1
    assert routing["shares"] == body["shares"] and [b.name for b in routing["buckets"]] == ["chat", "doc"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "change, field, words",
    [
        ("unpriced", "usd_per_gpu_hour", "'h100'"),
        ("unservable", "buckets", "'doc'"),
        ("bad-sim-profile", "profiles", ""),
        ("duplicate-bucket", "buckets", "unique"),
        ("negative-rate", "buckets", ""),
    ],
)
def test_api_field_errors(tenant_a, change, field, words):
    l40s = HardwareProfileFactory(name="l40s", gpu_type="L40S", usd_per_gpu_hour=1.861)
    h100 = HardwareProfileFactory(name="h100", gpu_type="H100", usd_per_gpu_hour=None if change == "unpriced" else 9.0)
    pairs = [(l40s, "llama-8b-l40s"), (h100, "nope" if change == "bad-sim-profile" else "llama-8b-h100")]
    body = _body(*(pairs[:1] if change == "unservable" else pairs))
    if change == "duplicate-bucket":
        body["buckets"].append(dict(body["buckets"][0]))
    if change == "negative-rate":
        body["buckets"][0]["rate_rps"] = -1
    response = client_for(tenant_a.member).post(MIX_URL, body, format="json")
    assert response.status_code == 400, response.content
    errors = response.json()
    assert field in json.dumps(errors) and words in json.dumps(errors, ensure_ascii=False)


@pytest.mark.django_db
def test_command_plans_and_reports_errors():
    HardwareProfileFactory(name="l40s", gpu_type="L40S", usd_per_gpu_hour=1.861)
    HardwareProfileFactory(name="h100", gpu_type="H100", usd_per_gpu_hour=None)
    out = StringIO()
    call_command("plan_mix", "--profile", "l40s:llama-8b-l40s", "--bucket", "chat:512:128:20", stdout=out)
    assert json.loads(out.getvalue())["replicas"]["l40s"] >= 1
    with pytest.raises(CommandError, match="'h100' has no price"):
        call_command("plan_mix", "--profile", "l40s:llama-8b-l40s", "--profile", "h100:llama-8b-h100",
                     "--workload", "mixed")  # fmt: skip


def test_bench_economics_figures_and_the_simulator_check():
    from benchmarks.capacity import economics

    # Notices of 10-30 s, shorter than a long answer takes, so the drains leave streams to cut and resume.
    figures = economics.run(
        quick=True, progress=lambda message: None, duration_s=8, period_s=2400, peak_rps=8, notice_min_s=10,
        notice_max_s=30, seed=1, ttft_shares="0.5,1.0", headrooms="0.8",
    )  # fmt: skip
    assert set(figures["workloads"]) == {"short_chat", "long_docs", "mixed"} and figures["seeds"] == [1]
    for name, row in figures["workloads"].items():
        assert {"single_type_usd", "mixed_usd", "mixed_vs_single", "slo_attainment"} <= set(row), name
        assert {"best_single_type", "mixed_vs_best_single", "single_types", "milp_optimum_vs_single"} <= set(row)
        assert row["mixed_usd"] <= row["single_type_usd"] + 1e-9
        assert row["mixed_vs_single"] == pytest.approx(row["mixed_usd"] / row["single_type_usd"], abs=1e-3)
        assert sum(row["one_removed_replicas"].values()) == sum(row["mixed_replicas"].values()) - 1
        # The mix and every single type meet 99 % in the discrete-event simulator, and one replica fewer misses.
        assert row["slo_attainment"] >= 0.99 > row["one_removed_attainment"], name
        for rtype, single in row["single_types"].items():
            if single["replicas"] is not None:
                assert single["slo_attainment"] >= 0.99 > single["one_fewer_attainment"], (name, rtype)
        best = row["single_types"][row["best_single_type"]]
        assert best["usd"] == min(s["usd"] for s in row["single_types"].values() if s["replicas"] is not None)
        assert row["mixed_vs_best_single"] == pytest.approx(row["mixed_usd"] / best["usd"], abs=1e-3)
        assert row["milp_optimum_vs_single"] <= 1.0  # the program's optimum never costs more than one type alone
        # Routed by request size and cost (what a proxy knows), the mix does as well as by the plan's own buckets,
        # and better than a load balancer blind to both.
        routing = row["routing"]
        assert routing["cost_aware"] >= routing["plan"] - 0.005 and routing["cost_aware"] >= routing["least_request"]
    # Mixed: greedy cheapest-first spills chats onto the H100s the 7k documents need; the plan's shares do not.
    assert (
        figures["workloads"]["mixed"]["routing"]["cheapest_first"]
        < figures["workloads"]["mixed"]["routing"]["cost_aware"]
    )
    # Short chat's 6k-token pastes keep the planner's default single-type plan on H100 (a prefill over half the TTFT
    # SLO gets a type no capacity); sized in simulation, L40S alone meets the SLO for less.
    chat = figures["workloads"]["short_chat"]
    assert chat["single_type"] == "h100" and chat["planner_default"]["replicas"]["l40s"] > 0
    assert chat["best_single_type"] == "l40s" and chat["best_single_type_usd"] < chat["single_type_usd"]
    spot = figures["spot"]
    assert {"on_demand_usd", "with_spot_usd", "savings", "slo_attainment", "lost_requests", "preemptions"} <= set(spot)
    runs = spot["runs"]
    assert runs["on_demand"]["gpu_hours_spot"] == 0 and runs["with_spot"]["gpu_hours_spot"] > 0
    assert spot["with_spot_usd"] < spot["on_demand_usd"]  # spot at 65 % off carries the burst
    assert spot["savings"] == pytest.approx(1 - spot["with_spot_usd"] / spot["on_demand_usd"], abs=1e-3)
    # The same fleet bought on-demand costs more than with spot, and it is never reclaimed.
    same = runs["on_demand_headroom"]
    assert same["preemptions"] == 0 and same["lost_requests"] == 0 and same["resumed_requests"] == 0
    assert spot["same_fleet_on_demand_usd"] > spot["with_spot_usd"] and spot["savings_same_fleet"] > 0
    # Cut streams are resumed elsewhere: none is lost; without resumption the reclaims cut some.
    assert spot["lost_requests"] == 0 and spot["resumed_requests"] >= 1 and spot["no_resume_lost_requests"] >= 1
    assert runs["spot_no_resume"]["resumed_requests"] == 0
    assert runs["with_spot_outage"]["spot_launches_refused"] > 0  # the outage refused launches: the fallback ran
    # At the SLO: each arm at the highest target utilization that meets 99 %, and the savings between those two.
    od, with_spot = spot["on_demand_at_slo"], spot["with_spot_at_slo"]
    for arm in (od, with_spot):
        assert arm["met"] == (arm["slo_attainment"] >= 0.99) and arm["target_utilization"] <= 0.5
    assert spot["savings_vs_on_demand_at_slo"] == pytest.approx(1 - with_spot["usd"] / od["usd"], abs=1e-3)


@pytest.mark.django_db
def test_console_mix_page_plans_and_names_a_missing_price(client, operator):
    HardwareProfileFactory(name="l40s", gpu_type="L40S", usd_per_gpu_hour=1.861)
    HardwareProfileFactory(name="h100", gpu_type="H100", usd_per_gpu_hour=12.29)
    client.force_login(operator)
    form = {
        "profiles": "l40s llama-8b-l40s\nh100 llama-8b-h100",
        "buckets": "chat 512 128 200\ndoc 7168 512 2",
        "ttft_s": "1",
        "tpot_s": "0.05",
    }
    page = client.post("/console/planner/mix/", form)
    assert page.status_code == 200, page.content.decode()[:2000]
    html = page.content.decode()
    assert "Mix: $" in html and "× l40s" in html and "× h100" in html and "not within the SLO on l40s" in html
    HardwareProfileFactory(name="a100", gpu_type="A100", usd_per_gpu_hour=None)
    page = client.post("/console/planner/mix/", {**form, "profiles": "l40s llama-8b-l40s\na100 llama-8b-a100"})
    assert page.status_code == 400 and "has no price per GPU-hour" in page.content.decode()
