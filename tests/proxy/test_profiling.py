"""The proxy worker's CPU profile (gateway/proxy/profiling.py) and the proxy bench's reading of it."""

import asyncio
import pstats

from benchmarks.serving.proxy import _module_of, profile_summary
from gateway.proxy import profiling


def test_off_unless_asked(monkeypatch):
    monkeypatch.delenv(profiling.ENV, raising=False)
    assert profiling.start_from_env() is None


def test_the_worker_writes_its_totals_as_it_runs_and_the_bench_sums_them_per_module(monkeypatch, tmp_path):
    path = tmp_path / "proxy.prof"
    monkeypatch.setenv(profiling.ENV, str(path))
    monkeypatch.setattr(profiling, "WRITE_EVERY_S", 0.05)

    async def worker():
        profile = profiling.start_from_env()
        writer = asyncio.get_running_loop().create_task(profiling.keep_writing(profile))
        for _ in range(200):
            sum(i * i for i in range(200))
            await asyncio.sleep(0)
        await asyncio.sleep(0.2)
        writer.cancel()
        profile.disable()

    asyncio.run(worker())
    assert path.exists() and not (tmp_path / "proxy.prof.tmp").exists()  # whole files only
    assert pstats.Stats(str(path)).total_calls > 0
    summary = profile_summary(str(path), progress=lambda _: None)
    assert summary["total_s"] > 0 and abs(sum(summary["by_module"].values()) - 1.0) < 0.2
    assert (tmp_path / "proxy.prof.txt").read_text().strip()


def test_modules_are_named_by_the_platforms_path_or_the_library():
    assert _module_of("/srv/app/gateway/proxy/relay.py") == "gateway/proxy/relay.py"
    assert _module_of("/v/lib/python3.11/site-packages/aiohttp/client.py") == "aiohttp"
    assert _module_of("~") == "~ (built-ins)"
