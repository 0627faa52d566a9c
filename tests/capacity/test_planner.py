"""The three-barrier planner: the worked example (docs/algorithms.md#the-worked-example) figure by figure, queueing,
spikes, bad input."""

import dataclasses
import math

import pytest

from capacity.planning.barriers import (
    SLO,
    WORKED_EXAMPLE,
    PlannerInputError,
    SpikeInput,
    ThroughputRow,
    Workload,
    erlang_c,
    plan,
    spike_scenario,
    table_from_dicts,
    wait_at_percentile,
)


@pytest.fixture
def worked():
    return plan(**WORKED_EXAMPLE)


def test_worked_example_memory_figures(worked):
    assert worked.kv_tok_bytes == 163_840
    assert worked.m_kv_gb == 44
    assert round(worked.kv_tokens_total, -3) == 269_000  # 268,554: "≈268,000" in the source
    assert 268_000 <= worked.kv_tokens_total < 269_000


def test_worked_example_barriers(worked):
    assert worked.b_max == 64
    assert worked.w_s == pytest.approx(0.3 + 300 / 68)  # ≈ 4.7 s
    assert worked.l_in_flight == pytest.approx(94.2, abs=0.1)
    assert (worked.n_mem, worked.n_thr, worked.n_lat) == (1, 2, 2)
    assert worked.n_base == 2
    assert worked.rho_at_n_base == pytest.approx(0.69, abs=0.005)
    assert worked.n_with_headroom == 3
    assert worked.binding_barriers == ["throughput", "latency"]
    assert "bind together" in worked.explanation


def test_source_rounding_of_w_gives_the_same_n():
    # The source rounds W to 4.5 s (L = 90): TTFT 0.09 s makes W = 0.09 + 4.41 = 4.5.
    rounded = plan(**{**WORKED_EXAMPLE, "ttft_s": 4.5 - 300 / 68})
    assert rounded.l_in_flight == pytest.approx(90)
    assert (rounded.n_mem, rounded.n_thr, rounded.n_lat, rounded.n_with_headroom) == (1, 2, 2, 3)


def test_worked_example_dollars(worked):
    assert round(worked.usd_per_1m_tokens_at_b_max, 2) == 0.16
    assert round(worked.usd_per_1m_tokens_by_batch[16], 2) == 0.41
    # Three replicas at $2.5/h carrying 6,000 tok/s cost more per token than a full replica.
    assert worked.usd_per_1m_tokens_at_plan == pytest.approx(7.5 / (6000 * 3600) * 1e6)


def test_worked_example_spike(worked):
    spike = worked.spike
    assert spike.replicas_needed == 6
    assert spike.replicas_before == 3
    # Exactly: (60 − 3·4352/300 req/s)·90 s = 1,483.2 requests = 444,960 tokens.
    assert spike.backlog_tokens == pytest.approx(444_960)
    assert spike.backlog_tokens == pytest.approx(445_500, rel=0.0015)
    # The source rounds a replica's rate to 14.5 req/s; with that rate the formula gives its figures exactly.
    at_source_rate = spike_scenario(
        spike=WORKED_EXAMPLE["spike"],
        arrival_rate_per_s=20,
        output_tokens=300,
        t_dec_tok_s=4352,
        replicas_before=3,
        replica_req_s=14.5,
    )
    assert at_source_rate.backlog_tokens == pytest.approx(445_500)
    assert at_source_rate.backlog_requests == pytest.approx(1_485)
    assert spike.drain_s > 0


def test_erlang_c_matches_textbook_values():
    # Two servers, one Erlang offered: P(wait) = 1/3.
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)
    assert erlang_c(1, 0.5) == pytest.approx(0.5)  # M/M/1: P(wait) = ρ
    assert erlang_c(4, 4.0) == 1.0
    assert 0 < erlang_c(5000, 4000.0) < 1  # no overflow for large fleets


def test_queue_wait_grows_as_capacity_shrinks(worked):
    assert worked.queue_wait_s_at_n <= worked.queue_wait_s_at_n_base
    busy = plan(
        **{**WORKED_EXAMPLE, "workload": dataclasses.replace(WORKED_EXAMPLE["workload"], arrival_rate_per_s=26)}
    )
    assert busy.n_base == 2 and busy.rho_at_n_base > 0.85
    assert busy.queue_wait_s_at_n_base > 100 * worked.queue_wait_s_at_n_base


def test_memory_barrier_binds_for_long_contexts():
    # 268k KV tokens / 8,000-token contexts = 33 requests per replica, below B_max = 64.
    long_ctx = dataclasses.replace(WORKED_EXAMPLE["workload"], context_tokens=8000)
    result = plan(**{**WORKED_EXAMPLE, "workload": long_ctx})
    assert result.binding_barriers == ["memory"]
    assert result.n_mem == math.ceil(result.l_in_flight * 8000 / result.kv_tokens_total) == 3
    assert result.n_mem > max(result.n_thr, result.n_lat)
    assert "KV memory holds only 33 requests" in result.explanation


def test_unreachable_slo_is_explained_not_raised():
    result = plan(**{**WORKED_EXAMPLE, "slo": SLO(min_stream_tok_s=200)})
    assert result.feasible is False
    assert result.n_base is None
    assert "SLO unreachable" in result.explanation and "105" in result.explanation


def test_ttft_slo_excludes_rows():
    table = [ThroughputRow(16, 105, ttft_p95_s=0.2), ThroughputRow(64, 68, ttft_p95_s=1.5)]
    result = plan(**{**WORKED_EXAMPLE, "throughput_table": table, "slo": SLO(min_stream_tok_s=60, ttft_s=1.0)})
    assert result.b_max == 16


def test_zero_load_needs_no_replicas():
    idle = dataclasses.replace(WORKED_EXAMPLE["workload"], arrival_rate_per_s=0)
    result = plan(**{**WORKED_EXAMPLE, "workload": idle})
    assert result.n_base == 0 and result.feasible
    assert "No load" in result.explanation


@pytest.mark.parametrize(
    "override, field",
    [
        (
            {"workload": Workload(arrival_rate_per_s=-1, input_tokens=500, output_tokens=300)},
            "workload.arrival_rate_per_s",
        ),
        ({"workload": Workload(arrival_rate_per_s=1, input_tokens=500, output_tokens=0)}, "workload.output_tokens"),
        (
            {"workload": Workload(arrival_rate_per_s=math.nan, input_tokens=5, output_tokens=3)},
            "workload.arrival_rate_per_s",
        ),
        ({"slo": SLO(min_stream_tok_s=-5)}, "slo.min_stream_tok_s"),
        ({"throughput_table": []}, "throughput_table"),
        ({"throughput_table": [ThroughputRow(0, 10)]}, "throughput_table[0].batch"),
        ({"throughput_table": [ThroughputRow(8, 10), ThroughputRow(8, 12)]}, "throughput_table[1].batch"),
        ({"headroom": -0.1}, "headroom"),
        ({"spike": SpikeInput(utilization_ceiling=1.5)}, "spike.utilization_ceiling"),
        ({"hardware": dataclasses.replace(WORKED_EXAMPLE["hardware"], gpu_memory_gb=30)}, "hardware.gpu_memory_gb"),
    ],
)
def test_bad_input_names_the_field(override, field):
    with pytest.raises(PlannerInputError) as info:
        plan(**{**WORKED_EXAMPLE, **override})
    assert field in info.value.errors


def test_table_from_dicts_rejects_garbage():
    assert table_from_dicts([{"batch": 4, "per_stream_tok_s": "50"}])[0].aggregate == 200
    with pytest.raises(PlannerInputError):
        table_from_dicts([{"batch": 4}])
    with pytest.raises(PlannerInputError):
        table_from_dicts([{"batch": "x", "per_stream_tok_s": 1}])


# The 13B profile's table for 2,048-token prompts and 128-token answers (bench planner's RAG row, measured closed-loop
# on the simulated engine): TTFT p95 doubles from batch 4 on, where prompts start to meet each other's chunks.
RAG_TABLE = [
    ThroughputRow(batch=1, per_stream_tok_s=59.5, aggregate_tok_s=51.0, ttft_p50_s=0.363, ttft_p95_s=0.363),
    ThroughputRow(batch=4, per_stream_tok_s=38.9, aggregate_tok_s=128.0, ttft_p50_s=0.386, ttft_p95_s=0.727),
    ThroughputRow(batch=6, per_stream_tok_s=30.8, aggregate_tok_s=170.0, ttft_p50_s=0.388, ttft_p95_s=0.727),
    ThroughputRow(batch=8, per_stream_tok_s=26.0, aggregate_tok_s=182.0, ttft_p50_s=0.390, ttft_p95_s=0.754),
]


def test_a_ttft_slo_adds_the_slot_wait_of_long_prefills():
    # Given 6 req/s of 2,048/128 at ≥ 30 tok/s per stream: the throughput barrier asks 5 replicas (ρ = 0.90)
    without = plan(
        model=WORKED_EXAMPLE["model"], hardware=WORKED_EXAMPLE["hardware"], workload=Workload(6.0, 2048, 128),
        slo=SLO(min_stream_tok_s=30.0), throughput_table=RAG_TABLE,
    )  # fmt: skip
    assert (without.b_max, without.n_base, without.n_ttft) == (6, 5, None)
    # With a 2 s TTFT SLO, 30 slots held 4.2 s each at 6 req/s are often all busy: the p95 wait (1.3 s) plus the TTFT
    # p95 at B_max (0.73 s) exceeds 2 s at 5 replicas (the simulation measured 2.38 s), so the plan takes 6
    result = plan(
        model=WORKED_EXAMPLE["model"], hardware=WORKED_EXAMPLE["hardware"], workload=Workload(6.0, 2048, 128),
        slo=SLO(min_stream_tok_s=30.0, ttft_s=2.0), throughput_table=RAG_TABLE, headroom=0.5,
    )  # fmt: skip
    assert (result.n_thr, result.n_ttft, result.n_base, result.n_with_headroom) == (5, 6, 6, 9)
    assert result.binding_barriers == ["ttft"] and "N_ttft = 6" in result.explanation
    assert result.ttft_p95_at_n_base <= 2.0
    assert result.rho_at_n_base == pytest.approx(6 * 128 / (6 * 170.0))
    # A looser TTFT is met as soon as the slots are stable (4 replicas' 24 slots are not: 25 Erlangs offered), so it
    # binds together with throughput
    loose = plan(
        model=WORKED_EXAMPLE["model"], hardware=WORKED_EXAMPLE["hardware"], workload=Workload(6.0, 2048, 128),
        slo=SLO(min_stream_tok_s=30.0, ttft_s=5.0), throughput_table=RAG_TABLE,
    )  # fmt: skip
    assert (loose.n_base, loose.n_ttft) == (5, 5) and loose.binding_barriers == ["throughput", "latency", "ttft"]


def test_wait_at_percentile_is_mm1_exactly():
    # M/M/1: P(wait > t) = ρ·exp(−(μ − λ)·t)
    lam, mu = 0.8, 1.0
    assert wait_at_percentile(servers=1, arrival_rate=lam, mean_s=1 / mu, percentile=95) == pytest.approx(
        math.log(0.8 / 0.05) / (mu - lam)
    )
    assert wait_at_percentile(servers=1, arrival_rate=0.04, mean_s=1.0, percentile=95) == 0.0  # few ever wait
    assert wait_at_percentile(servers=2, arrival_rate=2.0, mean_s=1.0, percentile=95) == math.inf
