"""A real Prometheus (Debian's, loopback only) scraping a real proxy and a simulated vLLM replica, its recording
rules' burn rates set beside the platform's evaluator's on the same traffic.

The world: an endpoint with one simulated replica that fails a share of requests (``error_rate``), a tenant key,
an availability SLO; the proxy is a uvicorn process on config.asgi. Prometheus scrapes the proxy's /metrics (with
the metrics token) and the replica every second and evaluates ``export_slo_rules``' rules every second. The
traffic runs after Prometheus has the proxy's counters at their first values (a warm-up of at least
``WARMUP_EACH`` requests of each outcome, sent before it starts; Prometheus counts no increment of those, so the
platform's sums leave them out too). Then the usage records are rolled up and the evaluator runs (``billing.alerts``), and the 5 m
error ratio of each side is compared: relative error = |prometheus − platform| / platform.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path

import httpx
import yaml
from django.conf import settings
from django.core.management import call_command
from django.db.models import Count

from billing.alerts import slo_evaluate_all
from billing.models import SLO, SLOStatus, UsageRecord
from billing.rollups import usage_rollup_run
from capacity.runtimes.processes import (
    ProcessGroup,
    database_url,
    free_port,
    sim_replica_argv,
    uvicorn_argv,
)
from endpoints.models import Replica, ReplicaState

METRICS_TOKEN = "prometheus-check-token"
# Each outcome's counter starts the comparison at least this high: rate() extrapolates a window's start towards a
# counter's zero when its first value is small next to its increase, so counters that start near zero would each
# be stretched by a different fraction of a scrape interval.
WARMUP_EACH = 30


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


def prometheus_start(procs: ProcessGroup, config: Path, workdir: Path) -> str:
    """A Prometheus process on ``config``, its data under ``workdir``; its URL once it listens."""
    port = free_port()
    procs.spawn(
        [prometheus_binary(), f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        port=port,
    )  # fmt: skip
    return f"http://127.0.0.1:{port}"


def _prometheus_config(workdir: Path, proxy_port: int, replica_port: int) -> Path:
    (workdir / "token").write_text(METRICS_TOKEN)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": ["rules.yml"],
        "scrape_configs": [
            {
                "job_name": "infercap-proxy",
                "authorization": {"credentials_file": str(workdir / "token")},
                "static_configs": [{"targets": [f"127.0.0.1:{proxy_port}"]}],
            },
            {"job_name": "vllm", "static_configs": [{"targets": [f"127.0.0.1:{replica_port}"]}]},
        ],
    }
    path = workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


async def _send(base: str, key: str, model: str, count: int, concurrency: int = 16) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": False}
    semaphore = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=30, headers={"Authorization": f"Bearer {key}"}) as client:

        async def one():
            async with semaphore:
                await client.post(base + "/v1/chat/completions", json=body)

        await asyncio.gather(*(one() for _ in range(count)))


def _counter(exposition: str, status: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in exposition.splitlines()
        if line.startswith("infercap_proxy_requests_total{") and f'status="{status}"' in line
    )


def query(prometheus: str, expr: str) -> list[dict]:
    """The query's result; empty while Prometheus answers anything but 200 (it says "Service Unavailable" until
    its storage is ready, which on a busy machine comes after /-/ready), so the callers' waits go on."""
    response = httpx.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=10)
    if response.status_code != 200:
        return []
    return response.json()["data"]["result"]


def wait_until(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.25)
    raise TimeoutError(f"{what} within {timeout:.0f} s")


def _start(procs: ProcessGroup, endpoint, *, error_rate: float) -> tuple[str, int, int]:
    replica_port, proxy_port = free_port(), free_port()
    procs.spawn(
        sim_replica_argv(
            replica_port, speed=50, served_model_name=endpoint.name, extra=["--fault", f"error_rate={error_rate}"]
        ),
        port=replica_port,
    )
    Replica.objects.create(endpoint=endpoint, name="prom-r1", url=f"http://127.0.0.1:{replica_port}",
                           state=ReplicaState.READY, concurrency_limit=64)  # fmt: skip
    env = {
        "DJANGO_SETTINGS_MODULE": settings.SETTINGS_MODULE,
        "DATABASE_URL": database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "INFERCAP_METRICS_TOKEN": METRICS_TOKEN,
        "INFERCAP_SNAPSHOT_POLL_S": "0.1",
    }
    procs.spawn(uvicorn_argv("config.asgi:application", proxy_port), env=env, port=proxy_port)
    return f"http://127.0.0.1:{proxy_port}", proxy_port, replica_port


def compare(
    *, endpoint, raw_key: str, slo: SLO, requests: int = 2000, error_rate: float = 0.1, progress=print
) -> dict:
    """Runs the world above; returns the two 5 m error ratios and their relative error."""
    workdir = Path(tempfile.mkdtemp(prefix="infercap-prometheus-"))
    with ProcessGroup() as procs:
        base, proxy_port, replica_port = _start(procs, endpoint, error_rate=error_rate)
        wait_until(lambda: httpx.get(base + "/health", timeout=5).status_code == 200, 30, "the proxy did not start")
        # Every outcome's series exists before Prometheus' first scrape (see the module's docstring).
        metrics, sent = {"Authorization": f"Bearer {METRICS_TOKEN}"}, [0]

        def both_outcomes_seen() -> bool:
            asyncio.run(_send(base, raw_key, endpoint.name, 50))
            sent[0] += 50
            text = httpx.get(base + "/metrics", headers=metrics, timeout=10).text
            return all(_counter(text, status) >= WARMUP_EACH for status in ("ok", "upstream_error"))

        wait_until(both_outcomes_seen, 60, "no failed and no served request in the warm-up")
        metered = UsageRecord.objects.filter(endpoint=endpoint).count
        wait_until(lambda: metered() >= sent[0], 30, "warm-up not metered")
        warmup_ids = set(UsageRecord.objects.filter(endpoint=endpoint).values_list("pk", flat=True))
        call_command("export_slo_rules", "--slo", str(slo.pk), "--output", str(workdir / "rules.yml"))
        prometheus = prometheus_start(procs, _prometheus_config(workdir, proxy_port, replica_port), workdir)
        requests_series = f'infercap_proxy_requests_total{{endpoint="{endpoint.name}"}}'
        wait_until(lambda: query(prometheus, requests_series), 60, "Prometheus scraped nothing")
        time.sleep(2)  # two more scrapes at the warm-up's values: the traffic's increments start after them
        progress(f"prometheus up; sending {requests} requests ({error_rate:.0%} failing upstream)")
        asyncio.run(_send(base, raw_key, endpoint.name, requests))
        total = len(warmup_ids) + requests
        wait_until(lambda: UsageRecord.objects.filter(endpoint=endpoint).count() >= total, 60, "traffic not metered")
        time.sleep(3)  # scrapes and rule evaluations after the last request
        record = f'slo:sli_error:ratio_rate5m{{slo_id="{slo.pk}"}}'
        prometheus_ratio = float(
            wait_until(lambda: query(prometheus, record), 30, "no recording rule value")[0]["value"][1]
        )
        raw = {
            r["metric"]["status"]: (float(r["values"][0][1]), float(r["values"][-1][1]), len(r["values"]))
            for r in query(prometheus, requests_series + "[10m]")
        }
        # The platform's evaluator, on the records Prometheus saw the increments of.
        UsageRecord.objects.filter(pk__in=warmup_ids).delete()
        usage_rollup_run()
        slo_evaluate_all()
        status = SLOStatus.objects.get(slo=slo)
        platform_ratio = status.burn_rates["5m"] * (1 - slo.objective)
    shutil.rmtree(workdir, ignore_errors=True)
    error = abs(prometheus_ratio - platform_ratio) / platform_ratio if platform_ratio else float("inf")
    return {
        "prometheus_error_ratio_5m": prometheus_ratio,
        "platform_error_ratio_5m": platform_ratio,
        "relative_error": error,
        "requests": requests,
        "platform_window_counts_5m": status.window_counts["5m"],
        "prometheus_samples": raw,
        "records": dict(UsageRecord.objects.filter(endpoint=endpoint).values_list("status").annotate(n=Count("pk"))),
    }
