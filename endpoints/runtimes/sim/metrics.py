"""The simulated replica's ``/metrics``: vLLM's Prometheus series (VLLM_CONTRACT.md §1) with vLLM's buckets.

Latencies are in *simulated* seconds (wall-clock × the server's speed factor), so they read like a real
replica's whatever speed the tests run at. Gauges and counters are read from the engine at scrape time.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from .engine import Engine

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1,
    2.5,
    5,
    7.5,
    10,
    20,
    40,
    80,
    160,
    640,
    2560,
)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680)
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
FINISHED_REASONS = ("stop", "length", "abort", "error")


def _one_two_five(limit: int) -> tuple[int, ...]:
    """vLLM's 1-2-5 token buckets up to max_model_len."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > limit:
                return tuple(out)
            out.append(m * scale)
        scale *= 10


class _EngineCollector:
    def __init__(self, engine: Engine, model_name: str, cache_labels: dict[str, str]):
        self.engine = engine
        self.model_name = model_name
        self.cache_labels = cache_labels

    def collect(self):
        labels = ["model_name", "engine"]
        values = [self.model_name, "0"]
        engine, stats = self.engine, self.engine.stats
        for name, doc, value in (
            ("vllm:num_requests_running", "Number of requests in model execution batches.", engine.num_running),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", engine.num_waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", engine.kv_usage),
        ):
            gauge = GaugeMetricFamily(name, doc, labels=labels)
            gauge.add_metric(values, value)
            yield gauge
        for name, doc, value in (
            (
                "vllm:prefix_cache_queries",
                "Prefix cache queries, in terms of number of queried tokens.",
                stats.prefix_queries,
            ),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", stats.prefix_hits),
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", stats.prompt_tokens),
            ("vllm:generation_tokens", "Number of generation tokens processed.", stats.generation_tokens),
            ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", stats.preemptions),
        ):
            counter = CounterMetricFamily(name, doc, labels=labels)
            counter.add_metric(values, value)
            yield counter
        success = CounterMetricFamily(
            "vllm:request_success", "Count of successfully processed requests.", labels=[*labels, "finished_reason"]
        )
        for reason in FINISHED_REASONS:
            success.add_metric([*values, reason], stats.finished.get(reason, 0))
        yield success
        info = GaugeMetricFamily(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", labels=[*self.cache_labels, "engine"]
        )
        info.add_metric([*self.cache_labels.values(), "0"], 1.0)
        yield info


class ReplicaMetrics:
    def __init__(self, engine: Engine, model_name: str):
        profile = engine.profile
        self.registry = CollectorRegistry(auto_describe=True)
        cache_labels = {
            "block_size": str(profile.block_size),
            "num_gpu_blocks": str(profile.num_gpu_blocks),
            "num_cpu_blocks": "None",
            "gpu_memory_utilization": str(profile.gpu_memory_utilization),
            "enable_prefix_caching": "True",
            "prefix_caching_hash_algo": "builtin",
            "cache_dtype": "auto",
            "sliding_window": "None",
            "num_gpu_blocks_override": "None",
            "is_attention_free": "False",
        }
        self.registry.register(_EngineCollector(engine, model_name, cache_labels))
        names = ["model_name", "engine"]
        self._labels = {"model_name": model_name, "engine": "0"}
        tokens = _one_two_five(profile.max_model_len)

        def hist(name, doc, buckets):
            return Histogram(name, doc, names, buckets=buckets, registry=self.registry).labels(**self._labels)

        self.ttft = hist(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
        )
        self.itl = hist(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS
        )
        self.tpot = hist(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            ITL_BUCKETS,
        )
        self.e2e = hist(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", REQUEST_BUCKETS
        )
        self.queue = hist(
            "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase.", REQUEST_BUCKETS
        )
        self.prefill = hist(
            "vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase.", REQUEST_BUCKETS
        )
        self.decode = hist(
            "vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase.", REQUEST_BUCKETS
        )
        self.inference = hist(
            "vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase.", REQUEST_BUCKETS
        )
        self.prompt_tokens = hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens)
        self.generation_tokens = hist(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", tokens
        )
        self.max_tokens = hist(
            "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", tokens
        )
        self.iteration_tokens = hist(
            "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", ITERATION_BUCKETS
        )

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
