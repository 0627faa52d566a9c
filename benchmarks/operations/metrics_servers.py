"""Replicas' ``/metrics`` for ``bench scale``'s vertical loop: a few local HTTP servers, run as their own process so
the bench's CPU figures count the tick that scrapes them, not the servers.

Each port answers as a vLLM replica does: the simulator's whole exposition (``simulator.metrics``: vLLM's families,
labels and buckets, 46 kB with latency histograms filled), whatever the query (vLLM ignores ``name[]``). ``POST /advance
moves every replica one cycle on: a cycle's worth of TTFT and inter-token observations added to the histograms, so
the tick's per-cycle diffs see new counts. Idle connections close after 5 s, as uvicorn's (vLLM's server) do.

    python -m benchmarks.operations.metrics_servers PORT [PORT ...]
"""

from __future__ import annotations

import asyncio
import random
import sys

from aiohttp import web

from capacity.hardware.profiles import get_profile
from simulator.engine import Engine
from simulator.metrics import ReplicaMetrics

OBSERVATIONS_PER_CYCLE = 300  # requests a replica finishes in 30 s at a batch of ~40 and ~4 s a request
KEEPALIVE_S = 5.0  # uvicorn's --timeout-keep-alive default


class Replicas:
    """One simulated replica's series, served on every port (the bench's replicas differ in URL only)."""

    def __init__(self) -> None:
        profile = get_profile()
        self.engine = Engine(profile)
        self.metrics = ReplicaMetrics(self.engine, profile.model_name)
        self.rng = random.Random(7)
        self.body = b""
        self.advance()

    def advance(self) -> None:
        for _ in range(OBSERVATIONS_PER_CYCLE):
            self.metrics.ttft.observe(self.rng.lognormvariate(-1.6, 0.8))  # median 0.2 s
            self.metrics.itl.observe(self.rng.lognormvariate(-3.5, 0.4))  # median 30 ms
        self.body = self.metrics.exposition()


async def serve(ports: list[int]) -> None:
    replicas = Replicas()

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=replicas.body, content_type="text/plain", charset="utf-8")

    async def advance(request: web.Request) -> web.Response:
        replicas.advance()
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/advance", advance)
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=KEEPALIVE_S)
    await runner.setup()
    for port in ports:
        await web.TCPSite(runner, "127.0.0.1", port, backlog=2048).start()
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(serve([int(p) for p in sys.argv[1:]]))
