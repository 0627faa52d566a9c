"""vLLM's ``/metrics`` exposition, read (pure): the handful of series the router and the platform need, parsed by
hand and everything else skipped (``tests/routing/test_metrics_scraper.py`` checks it against prometheus_client's
parser and measures both). The proxy's scraper (``gateway/metrics_scraper.py``) and the runtime's checks
(``capacity/runtimes/vllm.py``) read replicas through it."""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass

_GAUGES = {
    "vllm:num_requests_running": "num_running",
    "vllm:num_requests_waiting": "num_waiting",
    "vllm:kv_cache_usage_perc": "kv_usage",
    "vllm:gpu_cache_usage_perc": "kv_usage_legacy",
    "vllm:prefix_cache_queries_total": "prefix_queries",
    "vllm:prefix_cache_hits_total": "prefix_hits",
    "vllm:gpu_prefix_cache_queries_total": "prefix_queries_legacy",
    "vllm:gpu_prefix_cache_hits_total": "prefix_hits_legacy",
}
_CACHE_INFO = "vllm:cache_config_info"
# LoRA (docs/lora-serving.md): an info gauge whose value is the time it was set; the newest series is the current one.
_LORA_INFO = "vllm:lora_requests_info"


@dataclass
class ReplicaMetrics:
    """What one scrape said, and when (on the scraper's monotonic clock)."""

    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0
    prefix_queries: float = 0.0
    prefix_hits: float = 0.0
    block_size: int = 0
    num_gpu_blocks: int = 0
    scraped_at: float = 0.0
    engines: int = 0
    lora_max: int = 0  # vllm:lora_requests_info's max_lora (the engine's --max-loras); 0: LoRA off or not reported
    lora_active: frozenset = frozenset()  # adapters it shows running or waiting (so loaded there)

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0


def _labels(text: str) -> dict[str, str]:
    """Parse ``a="x",b="y"`` (no escaped quotes in the labels vLLM emits for these series)."""
    labels = {}
    for part in text.split('",'):
        key, sep, value = part.partition('="')
        if sep:
            labels[key.strip().lstrip(",")] = value.rstrip('"')
    return labels


class MetricsParseError(ValueError):
    """The body is not Prometheus text with vLLM's series (a wrong URL, an HTML error page, …)."""


# The lines the parser reads, found by one scan of the body: a 46 kB exposition has ~520 lines of which ~10 are
# these. The pattern starts with a literal (a line starting ``vllm:``), which the regular-expression engine searches
# for at C speed: 25 us a body, against 190 for a Python loop over its lines and 300 for a pattern anchored with
# ``^`` (tried at every position). Groups: the name, the labels (between the first ``{`` and the last ``}`` on the
# line), the value.
_SERIES = re.compile(
    r"\n(" + "|".join(re.escape(name) for name in (*_GAUGES, _CACHE_INFO, _LORA_INFO)) + r")(?:\{(.*)\})? +(\S+)"
)


def parse_vllm_metrics(text: str) -> ReplicaMetrics:
    """Read the router's series from a vLLM ``/metrics`` body; sums gauges over data-parallel engines."""
    sums: dict[str, float] = {}
    engines: set[str] = set()
    block_size = num_gpu_blocks = 0
    lora_labels, lora_at = None, float("-inf")
    for name, labels, raw in _SERIES.findall("\n" + text):  # the first line too
        if name == _LORA_INFO:
            with contextlib.suppress(ValueError):
                at = float(raw)
                if labels and at >= lora_at:
                    lora_labels, lora_at = labels, at
            continue
        if name == _CACHE_INFO:
            info = _labels(labels)
            with contextlib.suppress(ValueError):
                block_size = int(info.get("block_size", "0"))
            with contextlib.suppress(ValueError):
                # DP engines each hold their own blocks.
                num_gpu_blocks += int(info.get("num_gpu_blocks", "0"))
            continue
        try:
            value = float(raw)
        except ValueError:
            continue
        field_name = _GAUGES[name]
        sums[field_name] = sums.get(field_name, 0.0) + value
        if field_name == "num_running" and labels:
            engines.add(_labels(labels).get("engine", "0"))
    if "num_running" not in sums and "num_waiting" not in sums:
        raise MetricsParseError("no vllm:num_requests_running / vllm:num_requests_waiting series in the body")
    n_engines = max(len(engines), 1)
    kv = sums.get("kv_usage", sums.get("kv_usage_legacy", 0.0))
    lora_max, lora_active = _lora_info(lora_labels)
    return ReplicaMetrics(
        num_running=int(sums.get("num_running", 0)),
        num_waiting=int(sums.get("num_waiting", 0)),
        kv_usage=min(1.0, kv / n_engines),  # a fraction per engine: average, not sum
        prefix_queries=sums.get("prefix_queries", sums.get("prefix_queries_legacy", 0.0)),
        prefix_hits=sums.get("prefix_hits", sums.get("prefix_hits_legacy", 0.0)),
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        engines=n_engines,
        lora_max=lora_max,
        lora_active=lora_active,
    )


def _lora_info(labels_text: str | None) -> tuple[int, frozenset]:
    """(max_lora, adapters running or waiting) from the newest ``vllm:lora_requests_info`` series' labels."""
    if labels_text is None:
        return 0, frozenset()
    labels = _labels(labels_text)
    names = ",".join((labels.get("running_lora_adapters", ""), labels.get("waiting_lora_adapters", "")))
    try:
        slots = int(float(labels.get("max_lora", "0")))
    except ValueError:
        slots = 0
    return slots, frozenset(n for n in names.split(",") if n)
