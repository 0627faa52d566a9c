"""Scrapes each replica's vLLM ``/metrics`` in the background and turns it into the router's ``ReplicaView`` fields.

One ``MetricsScraper`` per proxy process: ``start()`` launches an asyncio task that scrapes the replicas it is asked
about every ``interval_s`` (50–100 ms, as llm-d's 50 ms), each scrape with its own short timeout, so a hung replica
only ages its own snapshot (and the router then treats it as saturated) and never delays requests or the other
replicas' scrapes. The request path only reads the latest snapshot (``latest``, ``apply``): a dict look-up, and a
note that the replica was asked about.

What it scrapes grows with the traffic, not with the fleet (docs/request-path.md, "The replica metrics scraper"):
a replica is scraped while the request path has read it within ``idle_after_s`` (and for that long after it joins
the targets, so the first requests find its figures), and at most ``budget_per_s`` scrapes start a second, which
stretches the cadence when more replicas are wanted than the budget covers, instead of taking the event loop from
the requests. A replica nobody routes to is not scraped: its next request finds its figures stale, and the routers
fall back on the proxy's own counts (``gateway.routing.filters.eligible``) until the next scrape lands.
The parser is ``capacity/runtimes/vllm_metrics.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import httpx

from capacity.runtimes.vllm_metrics import MetricsParseError, ReplicaMetrics, parse_vllm_metrics
from gateway.routing.base import ReplicaView

log = logging.getLogger(__name__)


# Gauges summed over data-parallel engines (label ``engine``); the older names are vLLM ≤ 0.9 aliases.
IDLE_AFTER_S = 30.0  # a replica not read for this long is no longer scraped
TICKS_PER_INTERVAL = 4
BUDGET_PER_S = 1000.0  # scrapes started a second, at most (0.12-0.22 CPU-ms each: 0.1-0.2 of a core)


@dataclass
class ScrapeStats:
    scrapes: int = 0
    failures: int = 0
    rounds: int = 0
    busy_s: float = 0.0  # wall time spent starting scrape rounds on the event loop
    wanted: int = 0  # replicas scraped now (read within ``idle_after_s``, or newly added)
    interval_s: float = (
        0.0  # the cadence the replicas requests read get now: ``interval_s``, or longer over the budget
    )
    deferred: int = 0  # scrapes that were due and waited a tick for the budget
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
        idle_after_s: float = IDLE_AFTER_S,
        budget_per_s: float = BUDGET_PER_S,
    ):
        if not 0.01 <= interval_s <= 10:
            raise ValueError("interval_s must lie in [0.01, 10] seconds")
        if not (0 < idle_after_s < math.inf and 0 < budget_per_s < math.inf):
            raise ValueError("idle_after_s and budget_per_s must be positive and finite")
        self.interval_s, self.timeout_s, self.clock = interval_s, timeout_s, clock
        # Ticks come TICKS_PER_INTERVAL times an interval, each starting its share of the budget: a busy scraper's
        # work reaches the event loop in small bursts (the budget's 100 scrapes at once held requests 10 ms).
        self.tick_s = interval_s / TICKS_PER_INTERVAL
        self._credit, self._ticked_at = 0.0, -math.inf
        self.idle_after_s, self.budget_per_s = idle_after_s, budget_per_s
        self._client = client
        self._own_client = client is None
        self._targets: dict[str, str] = {}
        self._latest: dict[str, ReplicaMetrics] = {}
        self._read: set[str] = set()  # replicas the request path read since the last tick
        self._wanted: dict[str, float] = {}  # replica id → scraped until then (its last read + idle_after_s)
        self._warming: set[str] = set()  # wanted as new targets only: no request has read them yet
        self._started: dict[str, float] = {}  # replica id → when its last scrape started
        self._task: asyncio.Task | None = None
        self._outstanding: dict[str, asyncio.Task] = {}
        self.stats = ScrapeStats(interval_s=interval_s)
        self.warn_cadence_s: float | None = None  # log (once a minute) when the cadence stretches past this
        self._warned_at = -math.inf

    # -- the request path: reads only -------------------------------------------------------------
    def latest(self, replica_id: str) -> ReplicaMetrics | None:
        self._read.add(replica_id)  # asked about: scraped from the next tick on (a set add, ~40 ns)
        return self._latest.get(replica_id)

    def note(self, replica_ids) -> None:
        """Replicas a request considered without reading their figures now (full, cooling down, left out of one
        pick): keep them scraped all the same."""
        self._read.update(replica_ids)

    def age_s(self, replica_id: str, now: float | None = None) -> float:
        metrics = self._latest.get(replica_id)
        if metrics is None:
            return float("inf")
        return (self.clock() if now is None else now) - metrics.scraped_at

    def apply(self, view: ReplicaView, now: float | None = None) -> ReplicaView:
        """A copy of ``view`` with the latest scraped fields and their age; never-scraped → infinitely stale."""
        metrics = self.latest(view.replica_id)
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
        """Replace the targets. A replica new to them is scraped for ``idle_after_s`` unread, so the first requests
        routed to it find its figures (a process starting, a replica joining)."""
        old = self._targets
        self._targets = {rid: url.rstrip("/") for rid, url in targets.items() if url}
        until = self.clock() + self.idle_after_s
        for rid in self._targets.keys() - old.keys():
            self._wanted[rid] = until
            self._warming.add(rid)
        for gone in set(self._latest) - set(self._targets):
            del self._latest[gone]
        for table in (self._wanted, self._started):
            for gone in [rid for rid in table if rid not in self._targets]:
                del table[gone]
        for gone in [rid for rid in self._outstanding if rid not in self._targets]:
            self._outstanding.pop(gone).cancel()
        self._warming = {rid for rid in self._warming if rid in self._targets}
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
        """Start a scrape for every wanted replica that is due and has none outstanding, within the budget's share
        of one tick; never waits for any of them.

        A replica that hangs keeps one scrape outstanding until its timeout and is skipped meanwhile, so it cannot
        slow the scrape cadence of the others. Over the budget, the due replicas left over wait for the next tick:
        the ones requests read before the ones only warming up (new targets nobody has asked about yet), and among
        them the longest waiting first. The cadence is worked out again every tick from what is wanted now, so a
        burst of new targets stretches it only while they are wanted.
        """
        started = time.perf_counter()
        now = self.clock()
        self._note_reads(now)
        warming = self._warming
        cadence = max(self.interval_s, (len(self._wanted) - len(warming)) / self.budget_per_s)
        warm_cadence = max(self.interval_s, len(self._wanted) / self.budget_per_s)
        slack = 0.5 * self.tick_s  # due at the tick nearest ``cadence`` after the last start
        # The budget as a bucket refilled with time (at most two ticks' worth: no burst after a pause).
        burst = max(1.0, 2 * self.budget_per_s * self.tick_s)
        self._credit = min(burst, self._credit + (now - self._ticked_at) * self.budget_per_s)
        self._ticked_at = now
        allowance = int(self._credit)
        loop = asyncio.get_running_loop()
        last = self._started.get
        due = [
            rid
            for rid in self._wanted
            if now - last(rid, -math.inf) >= (warm_cadence if rid in warming else cadence) - slack
        ]
        if len(due) > allowance:
            due.sort(key=lambda rid: (rid in warming, last(rid, -math.inf)))
        deferred = 0
        for replica_id in due:
            task = self._outstanding.get(replica_id)
            if task is not None and not task.done():
                continue
            if allowance <= 0:
                deferred += 1
                continue
            allowance -= 1
            self._credit -= 1
            self._started[replica_id] = now
            self._outstanding[replica_id] = loop.create_task(self.scrape_one(replica_id, self._targets[replica_id]))
        stats = self.stats
        stats.rounds += 1
        stats.wanted, stats.interval_s, stats.deferred = len(self._wanted), cadence, stats.deferred + deferred
        stats.busy_s += time.perf_counter() - started
        if self.warn_cadence_s is not None and cadence > self.warn_cadence_s and now >= self._warned_at + 60:
            self._warned_at = now
            log.warning(
                "metrics scraper over its budget: %d replicas wanted at %.0f scrapes/s, each scraped every %.2f s "
                "(their figures near the routers' staleness limit); raise INFERCAP_PROXY_SCRAPE_BUDGET_PER_S or "
                "add proxy processes",
                len(self._wanted), self.budget_per_s, cadence,
            )  # fmt: skip

    def _note_reads(self, now: float) -> None:
        """The replicas read since the last tick are wanted for ``idle_after_s`` more; the ones past it are not."""
        read, self._read = self._read, set()
        until = now + self.idle_after_s
        for rid in read:
            if rid in self._targets:
                self._wanted[rid] = until
                self._warming.discard(rid)
        for rid in [rid for rid, until in self._wanted.items() if until < now]:
            del self._wanted[rid]
            self._warming.discard(rid)
            self._started.pop(rid, None)

    async def run(self) -> None:
        """Tick every ``tick_s`` on the loop's clock, for ever."""
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - the loop must outlive any one bad round
                log.exception("metrics scrape round failed")
            next_at = max(next_at + self.tick_s, loop.time())
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
