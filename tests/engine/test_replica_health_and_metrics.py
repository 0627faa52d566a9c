"""The platform's readers of a replica against the real engine: the metrics scraper sees a busy engine's queue and
cache shape; the blackbox health check keeps a busy replica ready and fails a SIGSTOPped one (then SIGCONTs it)."""

from __future__ import annotations

import asyncio
import os
import signal

import httpx
import pytest

from capacity.autoscaling import replica_metrics, replica_scrapes
from endpoints.health import CYCLE_LOCK_KEY, HealthConfig, health_check_cycle
from endpoints.models import ReplicaState
from gateway.metrics_scraper import MetricsScraper
from gateway.routing.base import ReplicaView
from tests.engine.load import StreamingLoad
from tests.waiting import wait_for, wait_for_async

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BLOCK_TOKENS = 128  # the CPU backend's KV block


def test_the_metrics_scraper_reads_a_busy_real_replica(engine):
    async def scenario():
        scraper = MetricsScraper(interval_s=0.1, timeout_s=5.0)  # one event loop: its HTTP client lives in it
        scraper.set_targets({"real": engine.url})

        async def scrape():
            await scraper.scrape_all()
            return scraper.latest("real")

        try:
            idle = await scrape()
            assert idle is not None, scraper.stats.errors
            with StreamingLoad(engine.url, engine.model, streams=3) as load:
                busy = await wait_for_async(
                    lambda: _when(scrape(), lambda m: m is not None and m.num_running >= 2), 60, interval=0.2
                )
            # What the router gets: the scraped fields on its view of the replica, fresh.
            return idle, busy, load, scraper.apply(ReplicaView(replica_id="real")), scraper.stats
        finally:
            await scraper.stop()

    idle, busy, load, view, stats = asyncio.run(scenario())
    assert idle.block_size == BLOCK_TOKENS and idle.num_gpu_blocks > 0 and idle.engines == 1
    assert not load.errors, load.errors
    assert busy.kv_usage > 0.0 and busy.prefix_queries >= idle.prefix_queries
    assert view.num_running == busy.num_running and view.kv_usage == busy.kv_usage
    assert view.metrics_age_s < 60 and view.block_size == BLOCK_TOKENS and view.num_gpu_blocks == busy.num_gpu_blocks
    assert stats.failures == 0, stats.errors


def test_the_vertical_ticks_scrape_reads_the_real_engine(engine):
    """The vertical tick's own client (a bare HTTP/1.0 exchange) reads the engine's whole exposition, and the parser
    finds its series there; a ``name[]`` query would not have shortened it: the engine answers the whole one."""
    [text] = replica_scrapes.fetch_many([engine.url], timeout_s=5.0)
    assert text is not None and "vllm:num_requests_running" in text
    scrape = replica_metrics.parse(text)
    assert scrape.buckets(replica_metrics.TTFT) and scrape.kv_usage >= 0.0
    restricted = httpx.get(f"{engine.url}/metrics", params={"name[]": "vllm:num_requests_running"}, timeout=10).text
    assert "vllm:kv_cache_usage_perc" in restricted  # the engine ignored the restriction


async def _when(pending, predicate):
    value = await pending
    return value if predicate(value) else None


@pytest.mark.django_db
def test_the_health_check_keeps_a_busy_real_replica_and_fails_a_stopped_one(engine, engine_endpoint, clean_redis):
    if engine.pid is None:
        pytest.skip("INFERCAP_ENGINE_URL: no process of ours to stop")
    endpoint, replica = engine_endpoint
    busy_config = HealthConfig(idle_after_s=0.5, failures_to_fail=1, ttft_timeout_s=20.0)

    # Busy: several long streams at once. Each cycle either sees the engine's token counter grow (no probe) or
    # probes it at the highest priority, ahead of the streams; none may fail it.
    with StreamingLoad(engine.url, engine.model, streams=4) as load:
        wait_for(lambda: _running(engine.url) >= 2, 60, interval=0.2)
        reports = [health_check_cycle(config=busy_config, endpoint_ids=[endpoint.pk]) for _ in range(3)]
    assert not load.errors, load.errors
    checks = [check for report in reports for check in report.checks]
    assert len(checks) == 3 and not any(check.marked_failed for check in checks)
    assert all(check.result.ok for check in checks if check.probed), [c.result for c in checks if c.probed]
    replica.refresh_from_db()
    assert replica.state == ReplicaState.READY and replica.consecutive_probe_failures == 0
    # On a loaded host a busy cycle's release of its overlap lock can time out on every try (a fresh-clone CI run:
    # Redis answered none of three within 0.5 s each); the lock then expires with its TTL, as designed. The release
    # itself is tested in tests/routing/test_health.py; here the stopped cycle must not be skipped for it.
    wait_for(lambda: not clean_redis.exists(CYCLE_LOCK_KEY), 60, interval=0.5, message="the busy cycles' lock is gone")

    # Stopped: the kernel still accepts connections, nothing answers; one failed probe fails it (K = 1 here).
    stopped_config = HealthConfig(idle_after_s=0.0, failures_to_fail=1, ttft_timeout_s=3.0, metrics_timeout_s=1.0)
    os.killpg(engine.pid, signal.SIGSTOP)
    try:
        report = health_check_cycle(config=stopped_config, endpoint_ids=[endpoint.pk])
    finally:
        os.killpg(engine.pid, signal.SIGCONT)
    assert not report.skipped, report.skipped  # another holder of the lock would skip it (no check at all)
    (check,) = report.checks
    assert check.probed and not check.result.ok and check.marked_failed
    assert "no first token within 3 s" in check.result.error
    replica.refresh_from_db()
    assert replica.state == ReplicaState.FAILED and replica.failure_reason.startswith("health: 1 consecutive")
    assert check.restart.startswith("unavailable: an attached replica")  # not the platform's to restart
    # SIGCONT: the engine serves again (the next tests share it).
    wait_for(lambda: _health(engine.url) == 200, 60, interval=0.2)


def _running(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:num_requests_running")
    )


def _health(url: str) -> int | None:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code
    except httpx.HTTPError:
        return None
