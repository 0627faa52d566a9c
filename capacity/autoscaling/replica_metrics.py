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
_HISTOGRAMS = (*TTFT, *TPOT)
# Every series read, by sample name: what a scrape asks the replica for (``name[]``) and all the parser looks at.
SERIES = (*_GAUGES, *_COUNTERS, *(f"{name}_bucket" for name in _HISTOGRAMS))


# One search over the text for the lines of those series (vLLM's exposition holds ~520 lines, of which these are
# ~50), the regex engine skipping from one line's ``vllm:`` to the next, a bucket's bound read by the same search:
# a Python loop over every line cost 0.68 ms a scrape, 7 CPU-s a tick at 10,000 replicas; two searches (the values,
# then the buckets) 85 µs. A name must be followed by its labels or the value (``…_waiting`` is not
# ``…_waiting_by_reason``). The scrape's bytes are searched as they came when they are ASCII, as vLLM's are (a
# search of bytes costs four fifths of one of text, and nothing is decoded); other text is decoded and searched
# as text, where ``\S`` and ``\b`` know every script's spaces and letters.
def _names(names) -> str:
    return "|".join(re.escape(name.removeprefix("vllm:")) for name in sorted(names, key=len, reverse=True))


_LINE = (
    r"\nvllm:(?:(" + _names([*_GAUGES, *_COUNTERS]) + r")(?:\{[^}\n]*\})?[ \t]+(\S+)"
    r"|(" + _names(_HISTOGRAMS) + r')_bucket\{[^}\n]*?\ble="([^"\n]*)"[^}\n]*\}[ \t]+(\S+))'
)
_TEXT_LINE, _BYTES_LINE = re.compile(_LINE), re.compile(_LINE.encode())
_FIELDS = {name.removeprefix("vllm:"): attr for name, attr in {**_GAUGES, **_COUNTERS}.items()}
_FIELDS |= {short.encode(): attr for short, attr in _FIELDS.items()}
_HISTOGRAM_NAMES = {name.removeprefix("vllm:"): name for name in _HISTOGRAMS}
_HISTOGRAM_NAMES |= {short.encode(): name for short, name in _HISTOGRAM_NAMES.items()}
_BOUNDS: dict = {}  # a bucket's ``le`` → its bound or None (vLLM's bounds are the same on every scrape)
_BOUNDS_KEPT = 4096
_UNSEEN = object()


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


def parse(text: str | bytes) -> Scrape:
    """The series the policies read from a ``/metrics`` exposition (text, or its bytes as a scrape received them)."""
    scrape, sums, histograms = Scrape(), {}, {}
    if isinstance(text, bytes) and text.isascii():
        lines = _BYTES_LINE.findall(b"\n" + text)
    else:
        text = text.decode("utf-8", "replace") if isinstance(text, bytes | bytearray) else text
        lines = _TEXT_LINE.findall("\n" + text)
    # A NaN or infinite gauge or count (a confused exporter) crashed the drain's int() and made the vertical
    # decision's JSON unstorable; these series are never negative either: such a line is skipped.
    for short, raw, histogram, le, count in lines:  # _count and _bound inlined: ~50 lines a scrape
        try:
            value = float(raw or count)
        except ValueError:
            continue
        if not 0.0 <= value < math.inf:
            continue
        if short:
            attr = _FIELDS[short]
            sums[attr] = sums.get(attr, 0.0) + value
            continue
        bound = _BOUNDS.get(le, _UNSEEN)
        if bound is _UNSEEN:
            bound = _bound(le)
        if bound is not None:
            counts = histograms.setdefault(_HISTOGRAM_NAMES[histogram], {})
            counts[bound] = counts.get(bound, 0.0) + value
    for attr, value in sums.items():
        setattr(scrape, attr, value)
    scrape.histograms = histograms
    return scrape


def _bound(le) -> float | None:
    """A bucket's upper bound ("+Inf" reads as infinity); None for one that is not a number."""
    try:
        return _BOUNDS[le]
    except KeyError:
        pass
    try:
        bound = float(le)
    except ValueError:
        bound = None
    if bound is not None and math.isnan(bound):
        bound = None
    if len(_BOUNDS) < _BOUNDS_KEPT:
        _BOUNDS[le] = bound
    return bound


def _count(raw) -> float | None:
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if 0.0 <= value < math.inf else None


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
