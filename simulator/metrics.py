"""The simulated replica's ``/metrics``: vLLM 0.32's ``vllm:*`` series, labels and buckets.

Every family a CPU vLLM 0.32 engine exposes is here (``tests/engine/test_contract.py`` compares names, types and
label sets); series of features the simulator has no counterpart for (KV connectors, multi-modal cache, MFU
estimates, admission queue limits) stay at zero, as on an engine that does not use them. Labels come in vLLM's
order (``engine`` before ``model_name``). Latencies are in *simulated* seconds (wall-clock × the server's speed
factor), so they read like a real replica's whatever speed the tests run at. Gauges and counters are read from the
engine at scrape time; prefix-cache counters count tokens, at each request's first admission.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from simulator.engine import Engine

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
N_BUCKETS = (1, 2, 5, 10, 20)
PREEMPTION_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
LABELS = ("engine", "model_name")


def _one_two_five(limit: int) -> tuple[int, ...]:
    """vLLM's 1-2-5 token buckets up to max_model_len."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > limit:
                return tuple(out)
            out.append(m * scale)
        scale *= 10


def cache_config_labels(profile) -> dict[str, str]:
    """``vllm:cache_config_info``'s labels, as a 0.32 engine with prefix caching sets them."""
    tokens = profile.num_gpu_blocks * profile.block_size
    return {
        "_block_size_resolved": "True",
        "block_size": str(profile.block_size),
        "cache_dtype": "auto",
        "cache_hit_alignment_tokens": "None",
        "effective_attention_block_size": str(profile.block_size),
        "enable_mamba_shared_prefix_checkpoint": "False",
        "enable_prefix_caching": "True",
        "gpu_memory_utilization": str(profile.gpu_memory_utilization),
        "hash_block_size": "None",
        "is_attention_free": "False",
        "kv_cache_dtype_skip_layers": "[]",
        "kv_cache_layout": "None",
        "kv_cache_max_concurrency": str(round(tokens / profile.max_model_len, 2)),
        "kv_cache_memory_bytes": "None",
        "kv_cache_size_tokens": str(tokens),
        "kv_offloading_backend": "native",
        "kv_offloading_size": "None",
        "kv_sharing_fast_prefill": "False",
        "mamba_block_size": "None",
        "mamba_cache_dtype": "auto",
        "mamba_cache_mode": "none",
        "mamba_page_size_padded": "None",
        "mamba_ssm_cache_dtype": "float32",
        "num_cpu_blocks": "None",
        "num_gpu_blocks": str(profile.num_gpu_blocks),
        "num_gpu_blocks_override": "None",
        "prefix_cache_retention_interval": "0",
        "prefix_caching_hash_algo": "sha256",
        "prefix_match_unit": "None",
        "replayssm_buffer_len": "16",
        "skip_page_size_padded": "None",
        "sliding_window": "None",
        "swa_bounded_replay": "True",
        "use_kda_recoverssm": "False",
        "use_replayssm": "False",
        "user_specified_block_size": "False",
    }


class _EngineCollector:
    def __init__(self, engine: Engine, model_name: str):
        self.engine = engine
        self.model_name = model_name
        self.cache_labels = cache_config_labels(engine.profile)
        self.created = time.time()  # counters carry their creation time (the ``_created`` series), as vLLM's

    def collect(self):
        yield from self._flops_counters()
        yield from self._scheduler_gauges()
        yield from self._token_counters()
        yield from self._front_end_and_config()

    def _single(self, kind, name: str, doc: str, value: float):
        family = kind(name, doc, labels=list(LABELS))
        created = {"created": self.created} if kind is CounterMetricFamily else {}
        family.add_metric(["0", self.model_name], value, **created)
        return family

    def _by(self, kind, name: str, doc: str, label: str, points: dict[str, float]):
        names = sorted([*LABELS, label])
        family = kind(name, doc, labels=names)
        created = {"created": self.created} if kind is CounterMetricFamily else {}
        for key, value in points.items():
            labels = {"engine": "0", "model_name": self.model_name, label: key}
            family.add_metric([labels[n] for n in names], value, **created)
        return family

    def _flops_counters(self):
        zero_counters = (
            (
                "vllm:estimated_flops_per_gpu",
                "Estimated number of floating point operations per GPU (for Model Flops Utilization calculations).",
            ),
            (
                "vllm:estimated_read_bytes_per_gpu",
                "Estimated number of bytes read from memory per GPU (for Model Flops Utilization calculations).",
            ),
            (
                "vllm:estimated_write_bytes_per_gpu",
                "Estimated number of bytes written to memory per GPU (for Model Flops Utilization calculations).",
            ),
        )
        for name, doc in zero_counters:
            yield self._single(CounterMetricFamily, name, doc, 0)

    def _scheduler_gauges(self):
        engine = self.engine
        yield self._single(
            GaugeMetricFamily,
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            engine.num_running,
        )
        yield self._single(
            GaugeMetricFamily,
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            engine.num_waiting,
        )
        # The simulator defers nothing (no LoRA budget, no KV transfer): every waiting request waits for capacity.
        yield self._by(
            GaugeMetricFamily,
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; "
            "'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). Sum of all "
            "reasons equals vllm:num_requests_waiting.",
            "reason",
            {"capacity": engine.num_waiting, "deferred": 0},
        )
        yield self._by(
            GaugeMetricFamily,
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
            "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
            "sleep_state",
            {"awake": 1, "weights_offloaded": 0, "discard_all": 0},
        )
        yield self._single(
            GaugeMetricFamily,
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            engine.kv_usage,
        )

    def _token_counters(self):
        stats = self.engine.stats
        hits = stats.prefix_hits
        for name, doc, value in (
            (
                "vllm:prefix_cache_queries",
                "Prefix cache queries, in terms of number of queried tokens.",
                stats.prefix_queries,
            ),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", hits),
            (
                "vllm:external_prefix_cache_queries",
                "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of queried tokens.",
                stats.external_queries,
            ),
            (
                "vllm:external_prefix_cache_hits",
                "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached tokens.",
                stats.external_hits,
            ),
            ("vllm:mm_cache_queries", "Multi-modal cache queries, in terms of number of queried items.", 0),
            ("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.", 0),
            ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", stats.preemptions),
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", stats.prompt_tokens),
        ):
            yield self._single(CounterMetricFamily, name, doc, value)
        yield self._by(
            CounterMetricFamily,
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            "source",
            {
                "local_compute": stats.prompt_tokens - stats.prompt_cached,
                "local_cache_hit": stats.prompt_cached - stats.prompt_external,
                "external_kv_transfer": stats.prompt_external,
            },
        )
        yield self._single(
            CounterMetricFamily,
            "vllm:prompt_tokens_cached",
            "Number of cached prompt tokens (local + external).",
            stats.prompt_cached,
        )
        yield self._by(
            CounterMetricFamily,
            "vllm:prompt_tokens_cached_by_source",
            "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host (offloaded to "
            "DRAM), disk, p2p (transferred from another vLLM instance) or external_unspecified. Counted at "
            "admission; sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.",
            "source",
            {"device": hits, "host": 0, "p2p": 0, "disk": 0, "external_unspecified": stats.external_hits},
        )
        yield self._single(
            CounterMetricFamily,
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            stats.generation_tokens,
        )
        yield self._by(
            CounterMetricFamily,
            "vllm:request_success",
            "Count of successfully processed requests.",
            "finished_reason",
            {reason: stats.finished.get(reason, 0) for reason in FINISHED_REASONS},
        )

    def _front_end_and_config(self):
        # No engine label on this one, as in vLLM: the front end counts it.
        rejections = CounterMetricFamily(
            "vllm:admission_rejections",
            "Number of admission attempts rejected by a queue limit, by reason.",
            labels=["model_name", "reason"],
        )
        for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):
            rejections.add_metric([self.model_name, reason], 0, created=self.created)
        yield rejections
        names = sorted([*self.cache_labels, "engine"])
        info = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", labels=names)
        labels = {**self.cache_labels, "engine": "0"}
        info.add_metric([labels[n] for n in names], 1.0)
        yield info


class ReplicaMetrics:
    def __init__(self, engine: Engine, model_name: str):
        profile = engine.profile
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_EngineCollector(engine, model_name))
        self._labels = {"engine": "0", "model_name": model_name}
        tokens = _one_two_five(profile.max_model_len)

        def hist(name, doc, buckets):
            return Histogram(name, doc, list(LABELS), buckets=buckets, registry=self.registry).labels(**self._labels)

        self.prompt_tokens = hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens)
        self.generation_tokens = hist(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", tokens
        )
        self.iteration_tokens = hist(
            "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", ITERATION_BUCKETS
        )
        self.max_generation_tokens = hist(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            tokens,
        )
        self.params_n = hist("vllm:request_params_n", "Histogram of the n request parameter.", N_BUCKETS)
        self.max_tokens = hist(
            "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", tokens
        )
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
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_BUCKETS,
        )
        self.inference = hist(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            REQUEST_BUCKETS,
        )
        self.prefill = hist(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_BUCKETS,
        )
        self.decode = hist(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            REQUEST_BUCKETS,
        )
        self.num_preemptions = hist(
            "vllm:request_num_preemptions",
            "Histogram of the number of times a request was preempted.",
            PREEMPTION_BUCKETS,
        )
        self.prefill_kv_computed = hist(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            tokens,
        )

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
