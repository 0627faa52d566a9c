"""The P/D planner: two pools against the best aggregated fleet, and its verdict checked in the discrete-event model."""

import math

import pytest

from capacity.hardware.profiles import get_profile
from capacity.models import HardwareProfile
from capacity.planning.barriers import Hardware, ModelShape, PlannerInputError
from capacity.planning.disaggregation import (
    PDSLO,
    PDWorkload,
    StepModel,
    mgc_wait_s,
    plan_disaggregation,
)
from simulator.pd_des import PDFleet, PDSimulation, pd_requests
from simulator.workloads import poisson_times
from tests.conftest import client_for

PROFILE = get_profile("llama-8b-h100").with_options(max_model_len=32768)
STEP = StepModel.from_profile(PROFILE)
MODEL = ModelShape(n_layers=32, n_kv_heads=8, d_head=128, dtype_bytes=2, weights_gb=16.06)
H100 = Hardware(gpu_memory_gb=80, overhead_gb=10, gpus_per_replica=1, usd_per_gpu_hour=0.0)
RAG = dict(prompt=(4096, 16384), output=(128, 512))
RAG_SLO = PDSLO(ttft_s=3.0, tpot_s=0.015)


def plan(workload, slo, **kw):
    kw.setdefault("link_gbps", 400)
    return plan_disaggregation(
        model=MODEL, hardware=kw.pop("hardware", H100), step=STEP, workload=workload, slo=slo, **kw
    )


def test_long_rag_with_a_strict_tpot_is_cheaper_disaggregated():
    result = plan(PDWorkload.uniform(8.0, RAG["prompt"], RAG["output"]), RAG_SLO)
    assert result.recommended == "disaggregated" and result.pays
    assert result.disaggregated_gpus < result.aggregated.gpus and result.gpu_ratio >= 1.3
    # The aggregated fleet must keep its prompts' chunks rare to hold the TPOT: it runs its prefill share low
    assert result.aggregated.detail["rho_prefill"] < 0.4
    assert result.prefill.ttft_s <= 3.0 and result.decode.tpot_s <= 0.015
    assert (
        "Disaggregation pays" in result.explanation
        and f"{result.aggregated.replicas} aggregated" in result.explanation
    )
    # The KV of a p90 prompt (≈15k tokens × 128 KiB) crosses a 400 Gb/s link in ≈ 40 ms
    assert result.kv_bytes_per_token == 131072
    assert 0.03 < result.transfer_s_at_percentile < 0.06


def test_short_uniform_chat_stays_aggregated():
    result = plan(PDWorkload.uniform(40.0, (128, 1024), (64, 256)), PDSLO(ttft_s=1.0, tpot_s=0.05))
    assert result.recommended == "aggregated" and not result.pays
    assert result.aggregated.gpus <= result.disaggregated_gpus
    assert "recommend aggregated" in result.explanation
    # one prefill replica takes 40 short prompts a second only because they share its steps' fixed cost
    assert result.prefill.replicas == 1 and 0.7 < result.prefill.detail["rho"] < 0.9
    assert STEP.prefill_s(576, shared=True) < STEP.prefill_s(576) - 0.01


def test_a_slow_kv_link_takes_the_gain_away():
    fast = plan(PDWorkload.uniform(8.0, RAG["prompt"], RAG["output"]), RAG_SLO, link_gbps=400)
    slow = plan(PDWorkload.uniform(8.0, RAG["prompt"], RAG["output"]), RAG_SLO, link_gbps=8)
    # 8 Gb/s: a 15k-token prompt's 2 GB take 2 s, and each link carries 4 prompts' KV a second at most
    assert slow.transfer_s_at_percentile is None or slow.transfer_s_at_percentile > 1.5
    assert slow.recommended == "aggregated" and fast.recommended == "disaggregated"


def test_uneven_prompts_queue_more_than_their_mean_says():
    # Same mean prompt, same rate: spread makes the M/G/c wait longer, so the prefill pool is no smaller
    even = plan(PDWorkload(8.0, 10240, 320, 0.0), RAG_SLO)
    uneven = plan(PDWorkload(8.0, 10240, 320, 3500.0), RAG_SLO)
    assert uneven.prefill.replicas >= even.prefill.replicas
    assert uneven.prefill.ttft_s > even.prefill.ttft_s or uneven.prefill.replicas > even.prefill.replicas
    # and the wait itself: c = 3 servers at ρ = 0.9, exponential vs deterministic service
    exp_wait = mgc_wait_s(servers=3, arrival_rate=2.7, mean_s=1.0, cs2=1.0, percentile=90)
    det_wait = mgc_wait_s(servers=3, arrival_rate=2.7, mean_s=1.0, cs2=0.0, percentile=90)
    assert det_wait == pytest.approx(exp_wait / 2)
    assert mgc_wait_s(servers=3, arrival_rate=3.0, mean_s=1.0, cs2=1.0, percentile=90) == math.inf


def test_dollars_decide_when_both_pools_have_a_price():
    cheap_prefill = Hardware(gpu_memory_gb=80, overhead_gb=10, gpus_per_replica=1, usd_per_gpu_hour=1.0)
    priced = Hardware(gpu_memory_gb=80, overhead_gb=10, gpus_per_replica=1, usd_per_gpu_hour=4.0)
    result = plan(
        PDWorkload.uniform(8.0, RAG["prompt"], RAG["output"]), RAG_SLO, hardware=priced, prefill_hardware=cheap_prefill
    )
    assert result.disaggregated_usd_per_hour == result.prefill.replicas * 1.0 + result.decode.replicas * 4.0
    assert result.aggregated.usd_per_hour == result.aggregated.replicas * 4.0
    assert result.pays and "$" in result.explanation


def test_an_unreachable_tpot_is_an_answer_not_an_error():
    # A decode step alone (t0 ≈ 6.5 ms) exceeds a 5 ms TPOT: neither design can serve it
    result = plan(PDWorkload.uniform(8.0, RAG["prompt"], RAG["output"]), PDSLO(ttft_s=3.0, tpot_s=0.005))
    assert result.recommended == "aggregated" and not result.pays
    assert result.aggregated.replicas is None and result.decode.replicas is None
    assert "Neither plan meets the SLO" in result.explanation


def test_bad_input_names_the_field():
    with pytest.raises(PlannerInputError) as err:
        plan(PDWorkload(-1.0, 100, 10), PDSLO(ttft_s=1.0, tpot_s=0.05, percentile=42), link_gbps=0)
    assert {"workload.arrival_rate_per_s", "slo.percentile", "hardware.kv_link_gbps"} <= set(err.value.errors)


def _attainment(fleet, rate, seed):
    times = poisson_times(rate, count=300, seed=seed)
    requests = pd_requests(times, prompt_tokens=RAG["prompt"], output_tokens=RAG["output"], seed=seed)
    return PDSimulation(fleet).run(requests).slo_attainment(ttft_s=RAG_SLO.ttft_s, tpot_s=RAG_SLO.tpot_s)


def test_the_plan_holds_in_the_discrete_event_model():
    # Given the planner's pools for long RAG at 8 req/s, simulated on the engine model the plan's step times came from
    result = plan(PDWorkload.uniform(8.0, RAG["prompt"], RAG["output"]), RAG_SLO, link_latency_s=0.001)
    pd_fleet = PDFleet(
        profile=PROFILE, replicas=result.decode.replicas, prefill_replicas=result.prefill.replicas,
        mode="disaggregated", kv_bytes_per_token=result.kv_bytes_per_token, link_gbps=400, link_latency_s=0.001,
    )  # fmt: skip
    # Then the disaggregated plan meets the SLO for ≥ 90 % of requests, and so does the aggregated one
    assert _attainment(pd_fleet, 8.0, seed=1) >= 0.9
    n = result.aggregated.replicas
    assert _attainment(PDFleet(profile=PROFILE, replicas=n), 8.0, seed=1) >= 0.9
    # while the aggregated fleet on the disaggregated plan's GPUs does not
    assert _attainment(PDFleet(profile=PROFILE, replicas=result.disaggregated_gpus), 8.0, seed=1) < 0.9


# -- POST /api/v1/capacity/plan-disaggregation ---------------------------------------------------------------
PD_URL = "/api/v1/capacity/plan-disaggregation"
RAG_BODY = {
    "model": {"n_layers": 32, "n_kv_heads": 8, "d_head": 128, "weights_gb": 16.06},
    "engine_profile": "llama-8b-h100",
    "workload": {"arrival_rate_per_s": 8, "input_tokens": 10240, "output_tokens": 320, "input_tokens_sd": 3547},
    "slo": {"ttft_s": 3, "tpot_ms": 15},
}


@pytest.mark.django_db
def test_api_plans_on_a_stored_hardware_profile_and_its_kv_link(tenant_a):
    HardwareProfile.objects.create(
        name="h100-ib", gpu_type="H100", gpu_memory_gb=80, memory_bandwidth_gbps=3350, usd_per_gpu_hour=3.0,
        memory_overhead_gb=10, kv_link_gbps=400,
    )  # fmt: skip
    response = client_for(tenant_a.member).post(PD_URL, {**RAG_BODY, "hardware_profile": "h100-ib"}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["recommended"] == "disaggregated" and body["kv_link_gbps"] == 400
    assert body["disaggregated_usd_per_hour"] == 3.0 * body["disaggregated_gpus"]
    assert body["aggregated"]["replicas"] > body["disaggregated_gpus"]
    assert "$" in body["explanation"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "change, field",
    [
        ({"hardware": {"gpu_memory_gb": 80}}, "hardware.kv_link_gbps"),  # no link: no transfer time
        ({"hardware": {"gpu_memory_gb": 80, "kv_link_gbps": 400}, "slo": {"ttft_s": 3}}, "slo"),
        ({"hardware": {"gpu_memory_gb": 80, "kv_link_gbps": 400}, "engine_profile": "nope"}, "engine_profile"),
        ({"hardware": {"gpu_memory_gb": 80, "kv_link_gbps": -1}}, "hardware"),
        ({}, "hardware"),
    ],
)
def test_api_bad_input_is_a_400_naming_the_field(tenant_a, change, field):
    response = client_for(tenant_a.member).post(PD_URL, {**RAG_BODY, **change}, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()


@pytest.mark.django_db
def test_api_plans_for_an_endpoint_its_tenant_can_see(tenant_a, tenant_b):
    endpoint = tenant_a.endpoint
    endpoint.hardware_profile.kv_link_gbps = 200
    endpoint.hardware_profile.save()
    endpoint.ttft_slo_ms, endpoint.tpot_slo_ms = 3000, 15
    endpoint.save()
    body = {"endpoint": endpoint.pk, "engine_profile": "llama-8b-h100", "workload": RAG_BODY["workload"]}
    response = client_for(tenant_a.member).post(PD_URL, body, format="json")
    assert response.status_code == 200, response.content
    data = response.json()
    # the endpoint's profiles, link and SLO: the TTFT and TPOT figures are held to 3 s and 15 ms
    assert data["kv_link_gbps"] == 200 and data["recommended"] in ("aggregated", "disaggregated")
    assert data["prefill"]["ttft_s"] <= 3.0 and data["decode"]["tpot_s"] <= 0.015
    other = client_for(tenant_b.member).post(PD_URL, body, format="json")
    assert other.status_code == 400 and "endpoint" in other.json()
