"""Prometheus metrics of the proxy. Multiprocess-safe: when ``PROMETHEUS_MULTIPROC_DIR`` is set (it must be,
before start-up, for several workers) every process writes its own files and ``/metrics`` aggregates them."""

import os

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

_MULTIPROC = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
# Gauges: summed over live processes (queue depth and in-flight are per process).
_GAUGE_KW = {"multiprocess_mode": "livesum"} if _MULTIPROC else {}

# Latency buckets follow vLLM's (VLLM_CONTRACT.md), so proxy and replica histograms line up.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960)
QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

REQUESTS = Counter(
    "infercap_proxy_requests", "Proxied requests by outcome", ["endpoint", "tenant", "priority", "status"]
)
# Good = ok and within the endpoint's TTFT and TPOT SLOs (DistServe's goodput): the goodput SLO's Prometheus
# rules (manage.py export_slo_rules) divide this by infercap_proxy_requests_total.
GOOD_REQUESTS = Counter(
    "infercap_proxy_good_requests", "Requests that met every latency SLO", ["endpoint", "tenant", "priority"]
)
TTFT = Histogram(
    "infercap_proxy_ttft_seconds", "Time to first token seen by the client", ["endpoint"], buckets=TTFT_BUCKETS
)
TPOT = Histogram(
    "infercap_proxy_tpot_seconds", "Time per output token after the first", ["endpoint"], buckets=TPOT_BUCKETS
)
E2E = Histogram("infercap_proxy_e2e_seconds", "Request arrival to last byte", ["endpoint"], buckets=E2E_BUCKETS)
QUEUE_TIME = Histogram(
    "infercap_proxy_queue_seconds",
    "Time spent in the admission queue",
    ["endpoint", "priority"],
    buckets=QUEUE_BUCKETS,
)
QUEUE_DEPTH = Gauge("infercap_proxy_queue_depth", "Queued requests", ["endpoint", "priority"], **_GAUGE_KW)
SHED = Counter("infercap_proxy_shed", "Requests refused by admission", ["endpoint", "priority", "reason"])
BROWNOUT = Counter(
    "infercap_proxy_brownout",
    "Requests served shorter (degraded) or sent to the fallback, by the endpoint the client named",
    ["endpoint", "tenant", "kind"],
)
RATE_LIMITED = Counter(
    "infercap_proxy_rate_limited", "Requests refused by tenant limits", ["endpoint", "tenant", "limit"]
)
IN_FLIGHT = Gauge("infercap_proxy_in_flight", "Requests in flight per replica", ["endpoint", "replica"], **_GAUGE_KW)
IN_FLIGHT_MU = Gauge(
    "infercap_proxy_in_flight_mu", "Model units in flight per replica", ["endpoint", "replica"], **_GAUGE_KW
)
PENDING_PREFILL = Gauge(
    "infercap_proxy_pending_prefill_tokens",
    "Uncached prompt tokens sent to a replica whose first bytes have not come (the router's pending prefill)",
    ["endpoint", "replica"],
    **_GAUGE_KW,
)
PREFIX_INDEX = Counter(
    "infercap_proxy_prefix_index",
    "Routed requests by the prefix index that scored the chosen replica (precise: its KV events; approximate)",
    ["endpoint", "index"],
)
KV_EVENT_BATCHES = Counter(
    "infercap_proxy_kv_event_batches",
    "KV-cache event batches received from a replica's engine",
    ["endpoint", "replica"],
)
UPSTREAM_RETRIES = Counter(
    "infercap_proxy_upstream_retries", "Retries on another replica before the first byte", ["endpoint"]
)
STREAM_RESUMES = Counter(
    "infercap_proxy_stream_resumes",
    "Streams that broke mid-answer: resumed on another replica, or ended with an error event",
    ["endpoint", "outcome"],
)
# Prefill/decode disaggregation (docs/request-path.md): how a disaggregated endpoint served each request (split,
# decode_only, fallback), and why a prefill fell back to the decode replica (no_prefill_slot, failed, timeout).
PD_REQUESTS = Counter(
    "infercap_proxy_pd_requests", "Requests to a disaggregated endpoint by how they were served", ["endpoint", "route"]
)
PD_PREFILL_FALLBACKS = Counter(
    "infercap_proxy_pd_prefill_fallbacks",
    "Prefills that the decode replica did instead (the prefill replica failed, timed out or had no slot)",
    ["endpoint", "reason"],
)
LORA_LOADS = Counter("infercap_proxy_lora_loads", "LoRA adapters loaded on a replica by the proxy", ["endpoint"])
LORA_UNLOADS = Counter(
    "infercap_proxy_lora_unloads", "LoRA adapters unloaded from a replica to free a slot", ["endpoint"]
)
LORA_LOAD_SECONDS = Histogram(
    "infercap_proxy_lora_load_seconds",
    "Time requests waited for a LoRA adapter load (the first request for an adapter on a replica)",
    ["endpoint"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
)


def exposition() -> tuple[bytes, str]:
    if _MULTIPROC:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


_children: dict = {}


def child(metric, *labels: str):
    """``metric.labels(*labels)`` without its per-call validation and locking: the hot path calls this per request."""
    key = (id(metric), labels)
    found = _children.get(key)
    if found is None:
        found = _children[key] = metric.labels(*labels)
    return found
