"""Reading vLLM's /metrics for the vertical policy: histogram diffs between scrapes and interpolated p95s."""

import math

from capacity.autoscaling import replica_metrics as rm

TEXT = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m",engine="0"} 3.0
vllm:num_requests_running{model_name="m",engine="1"} 2.0
vllm:num_requests_waiting{model_name="m",engine="0"} 1.0
vllm:gpu_cache_usage_perc{model_name="m",engine="0"} 0.5
vllm:time_to_first_token_seconds_bucket{model_name="m",engine="0",le="0.5"} 10.0
vllm:time_to_first_token_seconds_bucket{model_name="m",engine="0",le="1.0"} 18.0
vllm:time_to_first_token_seconds_bucket{model_name="m",engine="0",le="+Inf"} 20.0
vllm:time_to_first_token_seconds_count{model_name="m",engine="0"} 20.0
vllm:time_per_output_token_seconds_bucket{model_name="m",engine="0",le="0.05"} 20.0
vllm:time_per_output_token_seconds_bucket{model_name="m",engine="0",le="+Inf"} 20.0
garbage line
"""


def test_parse_sums_engines_and_reads_legacy_names():
    scrape = rm.parse(TEXT)
    assert (scrape.running, scrape.waiting, scrape.kv_usage) == (5.0, 1.0, 0.5)
    assert scrape.buckets(rm.TTFT) == {0.5: 10.0, 1.0: 18.0, math.inf: 20.0}
    assert scrape.buckets(rm.TPOT) == {0.05: 20.0, math.inf: 20.0}  # the pre-0.11 TPOT histogram


def test_quantile_interpolates_and_caps_at_the_last_finite_bound():
    assert rm.quantile({0.5: 10.0, 1.0: 20.0, math.inf: 20.0}, 0.5) == 0.5
    assert rm.quantile({0.5: 10.0, 1.0: 20.0, math.inf: 20.0}, 0.75) == 0.75
    assert rm.quantile({0.5: 10.0, 1.0: 18.0, math.inf: 20.0}, 0.95) == 1.0  # in +Inf: the highest finite bound
    assert rm.quantile({0.5: 0.0, math.inf: 0.0}) is None
    assert rm.quantile({}) is None


def test_diff_covers_one_cycle_and_survives_a_restart():
    before = {0.5: 10.0, 1.0: 18.0, math.inf: 20.0}
    now = {0.5: 12.0, 1.0: 30.0, math.inf: 40.0}
    assert rm.diff(now, before) == {0.5: 2.0, 1.0: 12.0, math.inf: 20.0}
    restarted = {0.5: 1.0, 1.0: 1.0, math.inf: 1.0}
    assert rm.diff(restarted, before) == restarted
    assert rm.merge([before, now])[math.inf] == 60.0


def test_parse_skips_non_finite_and_negative_values():
    text = "\n".join(
        [
            'vllm:num_requests_running{engine="0"} NaN',
            'vllm:num_requests_running{engine="1"} 3',
            "vllm:num_requests_waiting +Inf",
            "vllm:kv_cache_usage_perc -1",
            'vllm:time_to_first_token_seconds_bucket{le="0.5"} NaN',
            'vllm:time_to_first_token_seconds_bucket{le="+Inf"} 4',
        ]
    )
    scrape = rm.parse(text)
    # NaN made int(running + waiting) raise in the drain order; inf raised OverflowError
    assert (scrape.running, scrape.waiting, scrape.kv_usage) == (3.0, 0.0, 0.0)
    assert scrape.histograms["vllm:time_to_first_token_seconds"] == {math.inf: 4.0}


def test_computed_prompt_tokens_leave_out_local_cache_hits_and_sum_engines():
    text = (
        'vllm:prompt_tokens_total{model_name="m",engine="0"} 1000.0\n'
        'vllm:prompt_tokens_total{model_name="m",engine="1"} 500.0\n'
        'vllm:prefix_cache_hits_total{model_name="m",engine="0"} 400.0\n'
        'vllm:prompt_tokens_created{model_name="m",engine="0"} 1.7e9\n'
    )
    scrape = rm.parse(text)
    assert (scrape.prompt_tokens, scrape.prefix_cache_hits) == (1500.0, 400.0)
    assert rm.computed_prompt_tokens(scrape) == 1100.0
    assert rm.computed_prompt_tokens(rm.parse("")) == 0.0
