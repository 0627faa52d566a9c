"""vLLM's ``/metrics`` exposition, read (pure): the handful of series the router and the platform need, parsed by
hand and everything else skipped (``tests/routing/test_metrics_scraper.py`` checks it against prometheus_client's
parser and measures both). The proxy's scraper (``gateway/metrics_scraper.py``) and the runtime's checks
(``capacity/runtimes/vllm.py``) read replicas through it."""

from __future__ import annotations

import contextlib
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


def parse_vllm_metrics(text: str) -> ReplicaMetrics:
    """Read the router's series from a vLLM ``/metrics`` body; sums gauges over data-parallel engines."""
    sums: dict[str, float] = {}
    engines: set[str] = set()
    block_size = num_gpu_blocks = 0
    lora_line, lora_at = None, float("-inf")
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        brace = line.find("{")
        name_end = brace if brace != -1 else line.find(" ")
        name = line[:name_end]
        if name == _LORA_INFO and brace != -1:
            with contextlib.suppress(ValueError, IndexError):
                at = float(line[line.rfind("}") + 1 :].split()[0])
                if at >= lora_at:
                    lora_line, lora_at = line, at
            continue
        if name == _CACHE_INFO:
            labels = _labels(line[brace + 1 : line.rfind("}")])
            with contextlib.suppress(ValueError):
                block_size = int(labels.get("block_size", "0"))
            with contextlib.suppress(ValueError):
                # DP engines each hold their own blocks.
                num_gpu_blocks += int(labels.get("num_gpu_blocks", "0"))
            continue
        field_name = _GAUGES.get(name)
        if field_name is None:
            continue
        try:
            value = float(line[line.rfind(" ") + 1 :] if brace == -1 else line[line.rfind("}") + 1 :].split()[0])
        except (ValueError, IndexError):
            continue
        sums[field_name] = sums.get(field_name, 0.0) + value
        if field_name == "num_running" and brace != -1:
            engines.add(_labels(line[brace + 1 : line.rfind("}")]).get("engine", "0"))
    if "num_running" not in sums and "num_waiting" not in sums:
        raise MetricsParseError("no vllm:num_requests_running / vllm:num_requests_waiting series in the body")
    n_engines = max(len(engines), 1)
    kv = sums.get("kv_usage", sums.get("kv_usage_legacy", 0.0))
    lora_max, lora_active = _lora_info(lora_line)
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


def _lora_info(line: str | None) -> tuple[int, frozenset]:
    """(max_lora, adapters running or waiting) from the newest ``vllm:lora_requests_info`` series."""
    if line is None:
        return 0, frozenset()
    labels = _labels(line[line.find("{") + 1 : line.rfind("}")])
    names = ",".join((labels.get("running_lora_adapters", ""), labels.get("waiting_lora_adapters", "")))
    try:
        slots = int(float(labels.get("max_lora", "0")))
    except ValueError:
        slots = 0
    return slots, frozenset(n for n in names.split(",") if n)
