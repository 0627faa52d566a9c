"""What the vertical policy and the drain read from a replica's ``/metrics`` (pure: no Django).

Latency p95s come from vLLM's own histograms, diffed between two scrapes so they cover the last cycle only:
TTFT ``vllm:time_to_first_token_seconds`` and TPOT ``vllm:inter_token_latency_seconds`` (older releases:
``vllm:time_per_output_token_seconds``). Gauges: running, waiting, KV-cache usage (``gpu_cache_usage_perc`` is
the older name). Histogram series are summed over ``model_name``/``engine`` labels.
"""

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfINFNa]+)")
_LE = re.compile(r'le="([^"]+)"')
TTFT = ("vllm:time_to_first_token_seconds",)
TPOT = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
_GAUGES = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_usage",
    "vllm:gpu_cache_usage_perc": "kv_usage",
}
# Counters the prefill pool's policy diffs into a rate: prompt tokens computed = processed − found in the local
# prefix cache (``vllm:prompt_tokens_total`` counts the whole prompt, cached part included).
_COUNTERS = {
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:prefix_cache_hits_total": "prefix_cache_hits",
}


@dataclass
class Scrape:
    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    prompt_tokens: float = 0.0
    prefix_cache_hits: float = 0.0
    # histogram name → {upper bound → cumulative count}
    histograms: dict[str, dict[float, float]] = field(default_factory=dict)

    def buckets(self, names: Iterable[str]) -> dict[float, float]:
        for name in names:
            if self.histograms.get(name):
                return self.histograms[name]
        return {}


def parse(text: str) -> Scrape:
    scrape = Scrape()
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _LINE.match(line)
        if not m:
            continue
        name, labels, raw = m.group(1), m.group(2) or "", m.group(3)
        try:
            value = float(raw)
        except ValueError:
            continue
        if not math.isfinite(value) or value < 0:
            # A NaN or infinite gauge or count (a confused exporter) crashed the drain's int() and made the vertical
            # decision's JSON unstorable; these series are never negative either
            continue
        if name in _GAUGES or name in _COUNTERS:
            attr = _GAUGES.get(name) or _COUNTERS[name]
            setattr(scrape, attr, getattr(scrape, attr) + value)
        elif name.endswith("_bucket"):
            le = _LE.search(labels)
            if le:
                bound = math.inf if le.group(1) in ("+Inf", "inf") else float(le.group(1))
                hist = scrape.histograms.setdefault(name[: -len("_bucket")], {})
                hist[bound] = hist.get(bound, 0.0) + value
    return scrape


def computed_prompt_tokens(scrape: Scrape) -> float:
    """Prompt tokens the replica computed (not served from its own prefix cache) since it started."""
    return max(0.0, scrape.prompt_tokens - scrape.prefix_cache_hits)


def diff(now: Mapping[float, float], before: Mapping[float, float] | None) -> dict[float, float]:
    """Cumulative counts observed between two scrapes; a counter reset (replica restart) keeps the new counts."""
    if not before:
        return dict(now)
    delta = {b: c - before.get(b, 0.0) for b, c in now.items()}
    return dict(now) if any(v < 0 for v in delta.values()) else delta


def merge(histograms: Iterable[Mapping[float, float]]) -> dict[float, float]:
    out: dict[float, float] = {}
    for h in histograms:
        for b, c in h.items():
            out[b] = out.get(b, 0.0) + c
    return out


def quantile(cumulative: Mapping[float, float], q: float = 0.95) -> float | None:
    """Prometheus' ``histogram_quantile``: linear interpolation inside the bucket holding the q-quantile (the first
    bucket starts at 0; a quantile in the +Inf bucket reads as the highest finite bound). None without samples."""
    bounds = sorted(cumulative)
    if not bounds:
        return None
    total = cumulative[bounds[-1]]
    if total <= 0:
        return None
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for b in bounds:
        count = cumulative[b]
        if count >= rank:
            if not math.isfinite(b):
                return lower_bound
            if count == lower_count:
                return b
            return lower_bound + (b - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = b, count
    return None
