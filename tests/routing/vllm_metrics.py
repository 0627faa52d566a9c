"""A vLLM-shaped /metrics body rendered by prometheus_client itself, and a tiny aiohttp replica for tests."""

import asyncio

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest

TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80]


def vllm_metrics_body(
    *, running=(3,), waiting=(2,), kv=(0.5,), hits=(4096,), queries=(8192,), num_gpu_blocks=27305, model="llama-13b"
) -> str:
    """One entry per data-parallel engine, exposed the way vLLM's prometheus_client registry does."""
    registry = CollectorRegistry()
    labels = ["model_name", "engine"]
    g_running = Gauge("vllm:num_requests_running", "running", labels, registry=registry)
    g_waiting = Gauge("vllm:num_requests_waiting", "waiting", labels, registry=registry)
    g_kv = Gauge("vllm:kv_cache_usage_perc", "kv", labels, registry=registry)
    c_queries = Counter("vllm:prefix_cache_queries", "q", labels, registry=registry)
    c_hits = Counter("vllm:prefix_cache_hits", "h", labels, registry=registry)
    h_ttft = Histogram("vllm:time_to_first_token_seconds", "ttft", labels, buckets=TTFT_BUCKETS, registry=registry)
    c_success = Counter("vllm:request_success", "ok", labels + ["finished_reason"], registry=registry)
    info = Info("vllm:cache_config", "cache", ["engine"], registry=registry)
    for engine in range(len(running)):
        lv = (model, str(engine))
        g_running.labels(*lv).set(running[engine])
        g_waiting.labels(*lv).set(waiting[engine])
        g_kv.labels(*lv).set(kv[engine])
        c_queries.labels(*lv).inc(queries[engine])
        c_hits.labels(*lv).inc(hits[engine])
        for i in range(50):
            h_ttft.labels(*lv).observe(0.01 * i)
        for reason in ("stop", "length", "abort"):
            c_success.labels(*lv, reason).inc(7)
        info.labels(str(engine)).info(
            {
                "block_size": "16",
                "num_gpu_blocks": str(num_gpu_blocks),
                "enable_prefix_caching": "True",
                "gpu_memory_utilization": "0.9",
                "cache_dtype": "auto",
                "sliding_window": "None",
            }
        )
    return generate_latest(registry).decode()


class FakeReplica:
    """Serves /metrics from a mutable body; ``hang`` makes every request wait until the server stops."""

    def __init__(self, body: str):
        self.body, self.hang, self.requests = body, False, 0
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def _metrics(self, request):
        self.requests += 1
        if self.hang:
            await asyncio.sleep(3600)
        return web.Response(text=self.body, content_type="text/plain")

    async def start(self) -> "FakeReplica":
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
