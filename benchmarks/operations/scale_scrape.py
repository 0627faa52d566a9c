"""``bench scale``'s scrape loops: one proxy process's replica metrics scraper (``gateway.metrics_scraper`` with the
proxy's ``KeepAliveScrapeClient``, on uvloop as deployed) holding a fleet of ``size`` replicas, their ``/metrics``
answered by local servers in their own processes (``metrics_servers.py``: the simulator's whole exposition), so the
CPU measured is the scraper's.

- ``proxy_scrape``: 20 of the replicas take traffic (two endpoints of 10, each replica of both read every 10 ms, as
  ``EndpointRuntime._views`` reads an endpoint's replicas for a request), the rest none: the cost must follow the
  traffic, not the fleet.
- ``proxy_scrape_busy``: every replica takes traffic, each on its own port (one kept-alive connection each, as
  replicas on their own hosts): the scraper's budget (``INFERCAP_PROXY_SCRAPE_BUDGET_PER_S``) is what bounds it.

Each size: the targets set, the new targets' warm-up left to pass (the bench's ``idle_after_s`` is ``IDLE_S``, not the
product's 30 s: the steady state is the same, the wait shorter), then ``MEASURE_S`` measured: the process's CPU a
second (``seconds`` and ``cpu_s`` are both CPU-seconds a second here), scrapes a second, the cadence the scraper
settled on, the traffic replicas' figures' age when read (99th percentile), and the event loop's lateness (a 10-ms
sleep's overshoot, 99th percentile): what a request arriving meanwhile waits. ``--opt scrape_budget=N`` and
``--opt scrape_idle=S`` set the scraper's budget and idle time (``scrape_measure=S`` the measured time) (``scrape_idle=1e9 scrape_budget=1e9``: every
replica scraped every interval whether read or not, as before the scraper followed the traffic).
"""

from __future__ import annotations

import asyncio
import time

import uvloop

from benchmarks.operations.scale_vertical import metrics_servers
from capacity.percentiles import percentile
from gateway.metrics_scraper import BUDGET_PER_S, MetricsScraper
from gateway.proxy.scrape_client import KeepAliveScrapeClient

TRAFFIC_REPLICAS = 20
INTERVAL_S = 0.1  # the proxy's default (INFERCAP_PROXY_SCRAPE_INTERVAL_S)
IDLE_S = 2.0
MEASURE_S = 6.0
READ_EVERY_S = 0.01


def proxy_scrape(size: int, *, progress, **knobs) -> dict:
    """The scraper holding ``size`` replicas, 20 of them taking traffic."""
    traffic = min(TRAFFIC_REPLICAS, size)
    with metrics_servers(ports=traffic) as (ports, _):
        urls = [f"http://127.0.0.1:{ports[i % len(ports)]}" for i in range(size)]
        out = _measure(urls, traffic, **knobs)
    _say(f"{size:,} replicas, {traffic} taking traffic", out, progress)
    return out


def proxy_scrape_busy(size: int, *, progress, **knobs) -> dict:
    """The scraper holding ``size`` replicas, every one taking traffic, each on its own port."""
    with metrics_servers(ports=size) as (ports, _):
        out = _measure([f"http://127.0.0.1:{port}" for port in ports], size, **knobs)
    _say(f"{size:,} replicas, all taking traffic", out, progress)
    return out


def _measure(urls: list[str], traffic: int, budget: float = BUDGET_PER_S, idle_s: float = IDLE_S, measure_s=MEASURE_S):
    return uvloop.run(_scrape(urls, traffic, budget, idle_s, measure_s))


async def _scrape(urls: list[str], traffic: int, budget: float, idle_s: float, measure_s: float) -> dict:
    client = KeepAliveScrapeClient()
    scraper = MetricsScraper(interval_s=INTERVAL_S, client=client, idle_after_s=idle_s, budget_per_s=budget)
    ids = [f"r{i}" for i in range(len(urls))]
    read = ids[:traffic]
    scraper.set_targets(dict(zip(ids, urls, strict=True)))
    scraper.start()
    try:
        # The warm-up: every new target scraped unread for ``idle_s``; by then the traffic's reads keep theirs.
        warm_until = time.perf_counter() + min(idle_s, 30.0) + 1.0
        while time.perf_counter() < warm_until:
            await asyncio.sleep(READ_EVERY_S)
            for rid in read:
                scraper.latest(rid)
        scrapes, cpu, started = scraper.stats.scrapes, time.process_time(), time.perf_counter()
        lateness, ages = [], []
        while (now := time.perf_counter()) - started < measure_s:
            await asyncio.sleep(READ_EVERY_S)
            lateness.append(time.perf_counter() - now - READ_EVERY_S)
            clock = scraper.clock()
            for rid in read:
                metrics = scraper.latest(rid)
                ages.append(clock - metrics.scraped_at if metrics is not None else float("inf"))
        wall = time.perf_counter() - started
        cpu = time.process_time() - cpu
        scrapes = scraper.stats.scrapes - scrapes
    finally:
        await scraper.stop()
        await client.aclose()
    cpu_per_s = cpu / wall
    return {
        "seconds": cpu_per_s,
        "cpu_s": round(cpu_per_s, 4),
        "replicas": len(urls),
        "taking_traffic": traffic,
        "scrapes_per_s": round(scrapes / wall, 1),
        "cpu_ms_per_scrape": round(cpu / scrapes * 1e3, 3) if scrapes else None,
        "wanted": scraper.stats.wanted,
        "cadence_s": round(scraper.stats.interval_s, 3),
        "figure_age_p99_s": round(percentile(ages, 99), 3),
        "loop_lateness_p99_ms": round(percentile(lateness, 99) * 1e3, 2),
        "failures": scraper.stats.failures,
        "budget_per_s": budget,
        "idle_after_s": idle_s,
    }


def _say(what: str, out: dict, progress) -> None:
    progress(
        f"  scrape: {what}: {out['cpu_s']:.3f} CPU-s a second, {out['scrapes_per_s']:,.0f} scrapes a second "
        f"({out['cpu_ms_per_scrape']} CPU-ms each), {out['wanted']:,} wanted every {out['cadence_s']} s; figures "
        f"read {out['figure_age_p99_s']} s old (p99), the loop {out['loop_lateness_p99_ms']} ms late (p99); "
        f"{out['failures']} failed"
    )
