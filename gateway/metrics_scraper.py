"""Scrapes each replica's vLLM ``/metrics`` in the background and turns it into the router's ``ReplicaView`` fields.

One ``MetricsScraper`` per proxy process: ``start()`` launches an asyncio task that scrapes every target
concurrently every ``interval_s`` (50–100 ms, as llm-d's 50 ms), each scrape with its own short timeout,
so a hung replica only ages its own snapshot (and the router then treats it as saturated) and never
delays requests or the other replicas' scrapes. The request path only reads the latest snapshot
(``apply``), a dict lookup. The parser is hand-written: it reads the handful of series the router needs
and skips everything else; ``tests/routing/test_metrics_scraper.py`` checks it against prometheus_client's
parser and measures both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import httpx

from gateway.routing.base import ReplicaView

log = logging.getLogger(__name__)

# Gauges summed over data-parallel engines (label ``engine``); the older names are vLLM ≤ 0.9 aliases.
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


@dataclass
class ScrapeStats:
    scrapes: int = 0
    failures: int = 0
    rounds: int = 0
    busy_s: float = 0.0  # wall time spent starting scrape rounds on the event loop
    errors: dict[str, str] = field(default_factory=dict)  # replica id → last error


class MetricsScraper:
    """Background scraper for one process. Targets are ``{replica_id: base_url}``; replace them any time."""

    def __init__(
        self,
        *,
        interval_s: float = 0.075,
        timeout_s: float = 0.5,
        client: httpx.AsyncClient | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        if not 0.01 <= interval_s <= 10:
            raise ValueError("interval_s must lie in [0.01, 10] seconds")
        self.interval_s, self.timeout_s, self.clock = interval_s, timeout_s, clock
        self._client = client
        self._own_client = client is None
        self._targets: dict[str, str] = {}
        self._latest: dict[str, ReplicaMetrics] = {}
        self._task: asyncio.Task | None = None
        self._outstanding: dict[str, asyncio.Task] = {}
        self.stats = ScrapeStats()

    # -- the request path: reads only -------------------------------------------------------------
    def latest(self, replica_id: str) -> ReplicaMetrics | None:
        return self._latest.get(replica_id)

    def age_s(self, replica_id: str, now: float | None = None) -> float:
        metrics = self._latest.get(replica_id)
        if metrics is None:
            return float("inf")
        return (self.clock() if now is None else now) - metrics.scraped_at

    def apply(self, view: ReplicaView, now: float | None = None) -> ReplicaView:
        """A copy of ``view`` with the latest scraped fields and their age; never-scraped → infinitely stale."""
        metrics = self._latest.get(view.replica_id)
        if metrics is None:
            return replace(view, metrics_age_s=float("inf"))
        return replace(
            view,
            metrics_age_s=(self.clock() if now is None else now) - metrics.scraped_at,
            num_running=metrics.num_running,
            num_waiting=metrics.num_waiting,
            kv_usage=metrics.kv_usage,
            block_size=metrics.block_size or view.block_size,
            num_gpu_blocks=metrics.num_gpu_blocks or view.num_gpu_blocks,
        )

    # -- targets and the loop -----------------------------------------------------------------------
    def set_targets(self, targets: Mapping[str, str]) -> None:
        self._targets = {rid: url.rstrip("/") for rid, url in targets.items() if url}
        for gone in set(self._latest) - set(self._targets):
            del self._latest[gone]

    async def scrape_one(self, replica_id: str, base_url: str) -> bool:
        try:
            response = await self._http().get(f"{base_url}/metrics", timeout=self.timeout_s)
            response.raise_for_status()
            metrics = parse_vllm_metrics(response.text)
        except (httpx.HTTPError, MetricsParseError) as exc:
            self.stats.failures += 1
            self.stats.errors[replica_id] = f"{type(exc).__name__}: {exc}"[:200]
            return False
        metrics.scraped_at = self.clock()
        if replica_id in self._targets:  # it may have been removed while we waited
            self._latest[replica_id] = metrics
        self.stats.scrapes += 1
        self.stats.errors.pop(replica_id, None)
        return True

    async def scrape_all(self) -> None:
        """One round, awaited to the end (tests, one-off refreshes)."""
        started = time.perf_counter()
        targets = list(self._targets.items())
        if targets:
            await asyncio.gather(*(self.scrape_one(rid, url) for rid, url in targets))
        self.stats.rounds += 1
        self.stats.busy_s += time.perf_counter() - started

    def tick(self) -> None:
        """Start a scrape for every target that has none outstanding; never waits for any of them.

        A replica that hangs keeps one scrape outstanding until its timeout and is skipped meanwhile,
        so it cannot slow the scrape cadence of the others.
        """
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        for replica_id, url in self._targets.items():
            task = self._outstanding.get(replica_id)
            if task is None or task.done():
                self._outstanding[replica_id] = loop.create_task(self.scrape_one(replica_id, url))
        for gone in set(self._outstanding) - set(self._targets):
            self._outstanding.pop(gone).cancel()
        self.stats.rounds += 1
        self.stats.busy_s += time.perf_counter() - started

    async def run(self) -> None:
        """Tick every ``interval_s`` on the loop's clock, for ever."""
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - the loop must outlive any one bad round
                log.exception("metrics scrape round failed")
            next_at = max(next_at + self.interval_s, loop.time())
            await asyncio.sleep(next_at - loop.time())

    def start(self) -> asyncio.Task:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self.run(), name="infercap-metrics-scraper")
        return self._task

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for task in self._outstanding.values():
            task.cancel()
        await asyncio.gather(*self._outstanding.values(), return_exceptions=True)
        self._outstanding.clear()
        if self._own_client and self._client is not None:
            await self._client.aclose()
            self._client = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            # Its own small pool, so scrapes never wait behind streaming requests for a connection.
            self._client = httpx.AsyncClient(limits=httpx.Limits(max_connections=64, max_keepalive_connections=64))
        return self._client
