"""Selective disaggregation in the P/D planner: prompts under ``min_uncached_tokens`` skip the prefill pool (the
proxy's rule), so that pool plans for fewer prompts and the decode pool carries their prefills; the plan recommends
the threshold that needs the fewest GPUs, and that recommendation holds in the discrete-event model."""

import dataclasses

import pytest

from capacity.hardware.profiles import get_profile
from capacity.planning.barriers import Hardware, ModelShape, PlannerInputError
from capacity.planning.disaggregation import PDSLO, PDWorkload, StepModel, plan_disaggregation
from simulator.pd_des import PDFleet, PDSimulation, pd_mix_requests
from simulator.workloads import poisson_times
from tests.conftest import client_for

PROFILE = get_profile("llama-8b-h100").with_options(max_model_len=32768)
STEP = StepModel.from_profile(PROFILE)
MODEL = ModelShape(n_layers=32, n_kv_heads=8, d_head=128, dtype_bytes=2, weights_gb=16.06)
H100 = Hardware(gpu_memory_gb=80, overhead_gb=10, gpus_per_replica=1, usd_per_gpu_hour=0.0)
CHAT, RAG = ((128, 1024), (64, 256)), ((4096, 16384), (128, 512))
MIX_SHAPES = [(0.7, *CHAT), (0.3, *RAG)]
MIX_SLO = PDSLO(ttft_s=3.0, tpot_s=0.025)


def mix_workload(rate: float) -> PDWorkload:
    """70 % chat, 30 % long RAG, as the proxy would see it: the prompts' ranges, their mean and spread."""
    parts = [PDWorkload.uniform(rate * w, p, o) for w, p, o in MIX_SHAPES]
    mean = sum(w * x.input_tokens for (w, _, _), x in zip(MIX_SHAPES, parts, strict=True))
    second = sum(
        w * (x.input_tokens_sd**2 + x.input_tokens**2) for (w, _, _), x in zip(MIX_SHAPES, parts, strict=True)
    )
    out = sum(w * x.output_tokens for (w, _, _), x in zip(MIX_SHAPES, parts, strict=True))
    held = sum(w * x.output_tokens * x.decode_context for (w, _, _), x in zip(MIX_SHAPES, parts, strict=True))
    ranges = tuple((w, p[0], p[1]) for w, p, _ in MIX_SHAPES)
    return PDWorkload(rate, mean, out, (second - mean**2) ** 0.5, held / out, prompt_ranges=ranges)


def plan(workload, slo, **kw):
    return plan_disaggregation(
        model=MODEL, hardware=H100, step=STEP, workload=workload, slo=slo, link_gbps=400, link_latency_s=0.001, **kw
    )


def test_the_share_under_the_threshold_skips_the_prefill_pool_and_loads_the_decode_pool():
    chat = PDWorkload.uniform(40.0, *CHAT)
    slo = PDSLO(ttft_s=1.0, tpot_s=0.05)
    every = plan(chat, slo)
    some = plan(chat, slo, min_uncached_tokens=512)
    assert (every.bypass_share, every.min_uncached_tokens) == (0.0, 0)
    assert some.bypass_share == pytest.approx((512 - 128) / (1024 - 128), abs=0.01)  # uniform prompts
    assert "43% of prompts (under 512 uncached tokens) skip the prefill pool" in some.explanation
    # The prefill pool computes fewer prompts; the decode replicas spend time on the others' prefills
    assert some.prefill.detail["rho"] < every.prefill.detail["rho"]
    assert some.decode.detail["rho_direct"] > 0 == every.decode.detail["rho_direct"]
    assert some.decode.tpot_s > every.decode.tpot_s and some.decode.detail["direct_ttft_s"] <= slo.ttft_s
    # Above every prompt, nothing goes through the prefill pool: its one replica idles, the decode pool does it all
    none = plan(chat, slo, min_uncached_tokens=4096)
    assert none.bypass_share == 1.0 and none.prefill.replicas == 1 and none.transfer_s_at_percentile == 0.0
    assert none.decode.detail["rho_direct"] > some.decode.detail["rho_direct"]


def test_long_prompts_never_bypass_and_keep_every_prompt_through_the_prefill_pool():
    result = plan(PDWorkload.uniform(8.0, *RAG), PDSLO(ttft_s=3.0, tpot_s=0.015), min_uncached_tokens=256)
    assert result.bypass_share == 0.0 and result.recommended == "disaggregated"
    assert result.threshold["recommended_min_uncached_tokens"] == 0  # a tie goes to the lowest threshold
    by_threshold = {c["min_uncached_tokens"]: c for c in result.threshold["candidates"]}
    assert by_threshold[8192]["bypass_share"] == pytest.approx(4096 / 12288, abs=0.01)
    assert by_threshold[8192]["gpus"] > by_threshold[0]["gpus"], "RAG prefills on decode replicas break its TPOT"


def test_a_bad_threshold_names_the_field():
    with pytest.raises(PlannerInputError) as exc:
        plan(PDWorkload.uniform(8.0, *RAG), PDSLO(ttft_s=3.0, tpot_s=0.015), min_uncached_tokens=-1)
    assert "min_uncached_tokens" in exc.value.errors


def _mix_attainment(prefill: int, decode: int, threshold: int, *, rate: float, seed: int) -> float:
    fleet = PDFleet(
        profile=PROFILE, replicas=decode, prefill_replicas=prefill, mode="disaggregated", kv_bytes_per_token=131072,
        link_gbps=400, link_latency_s=0.001, min_uncached_tokens=threshold,
    )  # fmt: skip
    duration = (
        90.0  # near the prefill pool's saturation a shorter window flatters (docs/experiments/disaggregation.md)
    )
    times = [t / rate for t in poisson_times(1.0, count=round(rate * duration), seed=seed)]
    result = PDSimulation(fleet).run(pd_mix_requests(times, shapes=MIX_SHAPES, seed=seed, prefix="mix"))
    counted = result.subset(lambda r: r.arrival_s >= duration / 3)
    return counted.slo_attainment(ttft_s=MIX_SLO.ttft_s, tpot_s=MIX_SLO.tpot_s)


def test_on_the_mix_the_recommended_threshold_saves_a_gpu_and_holds_in_the_discrete_event_model():
    # Given the mix at 16 req/s with every prompt through the prefill pool
    result = plan(mix_workload(16.0), MIX_SLO)
    threshold = result.threshold
    best = threshold["recommended_min_uncached_tokens"]
    # Then sending the chat prompts straight to decode needs fewer GPUs than the split of every prompt
    assert 0 < best <= 2048 and threshold["bypass_share"] == pytest.approx(0.7, abs=0.01)
    assert threshold["gpus"] < result.disaggregated_gpus
    assert f"A pd_min_uncached_tokens of {best}" in result.explanation
    [row] = [c for c in threshold["candidates"] if c["min_uncached_tokens"] == best]
    # and in simulation those pools meet the SLO with the threshold, and miss it without
    assert _mix_attainment(row["prefill_replicas"], row["decode_replicas"], best, rate=16.0, seed=1) >= 0.9
    assert _mix_attainment(row["prefill_replicas"], row["decode_replicas"], 0, rate=16.0, seed=1) < 0.9


def test_the_ranges_decide_the_share_not_the_mean_and_spread_alone():
    mix = mix_workload(16.0)
    share, direct, through = mix.split_at(2048)
    assert share == pytest.approx(0.7) and direct.input_tokens == pytest.approx(576)
    assert through.input_tokens == pytest.approx(10240) and through.arrival_rate_per_s == pytest.approx(16 * 0.3)
    # Without its ranges the same mean and spread read as one wide uniform range: a different share
    assert dataclasses.replace(mix, prompt_ranges=None).split_at(2048)[0] != pytest.approx(0.7, abs=0.05)


@pytest.mark.django_db
def test_the_api_plans_with_the_endpoints_threshold_and_recommends_one(tenant_a):
    endpoint = tenant_a.endpoint
    endpoint.hardware_profile.kv_link_gbps = 400
    endpoint.hardware_profile.save()
    endpoint.ttft_slo_ms, endpoint.tpot_slo_ms, endpoint.pd_min_uncached_tokens = 1000, 50, 512
    endpoint.save()
    workload = {"arrival_rate_per_s": 40, "input_tokens": 576, "output_tokens": 160, "input_tokens_sd": 258.7}
    body = {"endpoint": endpoint.pk, "engine_profile": "llama-8b-h100", "workload": workload}
    data = client_for(tenant_a.member).post("/api/v1/capacity/plan-disaggregation", body, format="json").json()
    assert data["min_uncached_tokens"] == 512 and data["bypass_share"] == pytest.approx(0.43, abs=0.01)
    assert data["threshold"]["recommended_min_uncached_tokens"] is not None and data["threshold"]["candidates"]
    given = client_for(tenant_a.member).post(
        "/api/v1/capacity/plan-disaggregation", body | {"min_uncached_tokens": 0}, format="json"
    )
    assert given.json()["bypass_share"] == 0.0
