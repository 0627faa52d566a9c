"""Scrapes each replica's vLLM ``/metrics`` in the background and turns it into the router's ``ReplicaView`` fields.

One ``MetricsScraper`` per proxy process: ``start()`` launches an asyncio task that scrapes every target
concurrently every ``interval_s`` (50–100 ms, as llm-d's 50 ms), each scrape with its own short timeout,
so a hung replica only ages its own snapshot (and the router then treats it as saturated) and never
delays requests or the other replicas' scrapes. The request path only reads the latest snapshot
(``apply``), a dict lookup. The parser is ``capacity/runtimes/vllm_metrics.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import httpx

from capacity.runtimes.vllm_metrics import MetricsParseError, ReplicaMetrics, parse_vllm_metrics
from gateway.routing.base import ReplicaView

log = logging.getLogger(__name__)


# Gauges summed over data-parallel engines (label ``engine``); the older names are vLLM ≤ 0.9 aliases.
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
        forget = getattr(self._client, "forget", None)  # a client that keeps connections closes the others'
        if forget is not None:
            forget(f"{url}/metrics" for url in self._targets.values())

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
