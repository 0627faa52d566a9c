"""Every Grafana panel's query, run by a real Prometheus configured from the shipped platform/prometheus/scrape.yml
against a running platform (a proxy on config.asgi and simulated vLLM replicas).

Debian's Prometheus has no Kubernetes discovery, so each discovered job gets static targets carrying the meta
labels the discovery would give the shipped objects (platform/kubernetes/base: pod template labels, container port
names, service labels, the namespace): the shipped jobs keep, drop and relabel them with their own rules, paths and
token. Only the timings change (every scrape and rule evaluation each second) and the laptop jobs (static targets on
127.0.0.1:8000) are left out. The rules are the shipped dashboard-rules.yml and ``export_slo_rules``' file.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import httpx
import yaml
from django.conf import settings
from django.core.management import call_command
from django.utils import timezone

from benchmarks.operations.prometheus_check import (
    METRICS_TOKEN,
    prometheus_start,
    query,
    wait_until,
)
from billing.cost import cost_reports_store
from billing.models import CostReport, UsageRecord
from billing.rollups import usage_rollup_run
from capacity.runtimes.processes import ProcessGroup, database_url, free_port, sim_replica_argv, uvicorn_argv
from endpoints.models import Replica, ReplicaState
from workers import observability as obs

SCRAPE_FILE = obs.ROOT / "platform" / "prometheus" / "scrape.yml"
MANIFESTS = obs.ROOT / "platform" / "kubernetes" / "base"
# Where discovery would find a pod or service this world does not run (worker, beat): nothing listens there, so a
# job that failed to drop them would show a target down.
NOWHERE = "127.0.0.1:9"
# Grafana's own interval variables, as a small window over 1 s scrapes.
INTERVALS = {"$__rate_interval": "15s", "$__interval": "15s", "$__range": "1m"}

# Panels that cannot show data in a minute-old world, each with why and the query that shows its wiring instead.
EXEMPT: dict[str, tuple[str, str]] = {
    'ALERTS{alertname="InfercapSLOBurnRate",alertstate="firing",endpoint="$endpoint"}': (
        "a burn-rate alert fires only after its `for:` (1 m for a page, billing.slo.ALERT_FOR_S) of burning",
        'ALERTS{alertname="InfercapSLOBurnRate",alertstate="pending",endpoint="$endpoint"}',
    ),
}


@dataclass(frozen=True)
class PanelQuery:
    panel: str
    expr: str  # as the dashboard has it
    promql: str  # variables substituted (the exempt panels' substitute query)
    legend_labels: tuple[str, ...]  # the labels its legend names: each answer must carry them
    exempt: str | None = None


def kubernetes_label(prefix: str, label: str) -> str:
    """The meta label Prometheus' Kubernetes discovery gives an object's label (invalid characters as _)."""
    return prefix + re.sub(r"[^a-zA-Z0-9_]", "_", label)


def shipped_objects(kind: str) -> list[dict]:
    """The base manifests' objects of one kind (Deployment, Service)."""
    found = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        found += [doc for doc in yaml.safe_load_all(path.read_text()) if doc and doc["kind"] == kind]
    return found


def _pod_targets(namespace: str, addresses: dict[str, list[tuple[str, str]]]) -> list[dict]:
    """One target per container port of each shipped Deployment's pods, as pod discovery lists them.
    ``addresses``: Deployment name -> [(address, endpoint id)] of the pods running here (others: NOWHERE)."""
    groups = []
    for deployment in shipped_objects("Deployment"):
        template = deployment["spec"]["template"]
        name = deployment["metadata"]["name"]
        for i, (address, endpoint_id) in enumerate(addresses.get(name, [(NOWHERE, "")])):
            meta = {"__meta_kubernetes_namespace": namespace, "__meta_kubernetes_pod_name": f"{name}-{i}"}
            for label, value in template["metadata"]["labels"].items():
                meta[kubernetes_label("__meta_kubernetes_pod_label_", label)] = value
            # The replica template's placeholder, as the copy per endpoint fills it in.
            meta = {k: v.replace("ENDPOINT_ID", endpoint_id) for k, v in meta.items()}
            for container in template["spec"]["containers"]:
                for port in container.get("ports") or [{}]:
                    labels = {**meta, "__meta_kubernetes_pod_container_name": container["name"]}
                    if port.get("name"):
                        labels["__meta_kubernetes_pod_container_port_name"] = port["name"]
                    groups.append({"targets": [address], "labels": labels})
    return groups


def _service_targets(namespace: str, addresses: dict[str, str]) -> list[dict]:
    groups = []
    for service in shipped_objects("Service"):
        name = service["metadata"]["name"]
        for port in service["spec"]["ports"]:
            labels = {"__meta_kubernetes_namespace": namespace, "__meta_kubernetes_service_name": name}
            for label, value in service["metadata"]["labels"].items():
                labels[kubernetes_label("__meta_kubernetes_service_label_", label)] = value
            if port.get("name"):
                labels["__meta_kubernetes_service_port_name"] = port["name"]
            groups.append({"targets": [addresses.get(name, NOWHERE)], "labels": labels})
    return groups


def discovered_scrape_config(
    workdir: Path, *, pods: dict[str, list[tuple[str, str]]], services: dict[str, str]
) -> dict:
    """The shipped scrape.yml with static targets in place of Kubernetes discovery (see the module's docstring)."""
    config = yaml.safe_load(SCRAPE_FILE.read_text())
    config["global"] = {**config.get("global", {}), "scrape_interval": "1s", "evaluation_interval": "1s"}
    (workdir / "token").write_text(METRICS_TOKEN)
    jobs = []
    for job in config["scrape_configs"]:
        discovery = job.pop("kubernetes_sd_configs", None)
        if discovery is None:
            continue  # the laptop jobs
        (sd,) = discovery
        namespace = sd["namespaces"]["names"][0]
        job["static_configs"] = (
            _pod_targets(namespace, pods) if sd["role"] == "pod" else _service_targets(namespace, services)
        )
        job.pop("scrape_interval", None)
        if "credentials_file" in job.get("authorization", {}):
            job["authorization"]["credentials_file"] = str(workdir / "token")
        jobs.append(job)
    config["scrape_configs"] = jobs
    return config


def write_rules(workdir: Path) -> None:
    """The shipped dashboard rules (evaluated every second) and every enabled SLO's rules, as scrape.yml names them."""
    rules = yaml.safe_load((obs.ROOT / obs.RULES_FILE).read_text())
    for group in rules["groups"]:
        group["interval"] = "1s"
    (workdir / Path(obs.RULES_FILE).name).write_text(yaml.safe_dump(rules, sort_keys=False))
    call_command("export_slo_rules", "--output", str(workdir / "slo-rules.yml"))


def _substitute(expr: str, variables: dict[str, str]) -> str:
    substitutions = {**INTERVALS, **{f"${name}": value for name, value in variables.items()}}
    for name in sorted(substitutions, key=len, reverse=True):
        expr = expr.replace(name, substitutions[name])
    return expr


def _dashboard() -> dict:
    return json.loads((obs.ROOT / obs.DASHBOARD_FILE).read_text())


def panel_queries(variables: dict[str, str]) -> list[PanelQuery]:
    """Every target of the shipped dashboard, its Grafana variables replaced by ``variables`` (name -> value)."""
    found = []
    for panel in _dashboard()["panels"]:
        for target in panel.get("targets", []):
            reason, instead = EXEMPT.get(target["expr"], (None, target["expr"]))
            legend = tuple(re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")))
            found.append(PanelQuery(panel["title"], target["expr"], _substitute(instead, variables), legend, reason))
    return found


def variable_values(prometheus: str, variables: dict[str, str]) -> dict[str, list[str]]:
    """What each of the dashboard's ``label_values(series, label)`` variables lists, its own variables substituted."""
    found = {}
    for variable in _dashboard()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        selector, label = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variable["query"]["query"]).groups()
        response = httpx.get(f"{prometheus}/api/v1/label/{label}/values",
                             params={"match[]": _substitute(selector, variables)}, timeout=10)  # fmt: skip
        found[variable["name"]] = response.json()["data"] if response.status_code == 200 else []
    return found


def _chat(base: str, key: str, model: str, *, count: int, stream: bool, concurrency: int = 32) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "stream": stream}

    async def run():
        semaphore = asyncio.Semaphore(concurrency)
        async with httpx.AsyncClient(timeout=30, headers={"Authorization": f"Bearer {key}"}) as client:

            async def one():
                async with semaphore:
                    async with client.stream("POST", base + "/v1/chat/completions", json=body) as response:
                        await response.aread()

            await asyncio.gather(*(one() for _ in range(count)))

    asyncio.run(run())


def _traffic(base: str, model: str, keys: dict[str, str]) -> None:
    """Plain and streamed completions from every tenant, then a burst that queues, sheds and meets the limits."""
    # One at a time first: a request the failing replica refuses always finds the other one free, so the proxy
    # retries (under the burst below, the other replica's slots may all be busy and the refusal reaches the client).
    _chat(base, next(iter(keys.values())), model, count=12, stream=False, concurrency=1)
    for key in keys.values():
        _chat(base, key, model, count=8, stream=False, concurrency=4)
        _chat(base, key, model, count=8, stream=True, concurrency=4)
    for key in keys.values():
        _chat(base, key, model, count=40, stream=True, concurrency=40)


def _start_platform(procs: ProcessGroup, endpoint) -> tuple[str, list[tuple[str, str]]]:
    """Two simulated replicas (one failing half of its requests, so the proxy retries) and a proxy with a short
    admission queue; returns the proxy's address and the replicas' (address, endpoint id)."""
    replicas = []
    for i, error_rate in enumerate((0.0, 0.5)):
        port = free_port()
        procs.spawn(sim_replica_argv(port, speed=50, served_model_name=endpoint.name,
                                     extra=["--fault", f"error_rate={error_rate}"]), port=port)  # fmt: skip
        Replica.objects.create(endpoint=endpoint, name=f"dash-r{i}", url=f"http://127.0.0.1:{port}",
                               state=ReplicaState.READY, concurrency_limit=2)  # fmt: skip
        replicas.append((f"127.0.0.1:{port}", str(endpoint.pk)))
    proxy_port = free_port()
    env = {
        "DJANGO_SETTINGS_MODULE": settings.SETTINGS_MODULE,
        "DATABASE_URL": database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "INFERCAP_METRICS_TOKEN": METRICS_TOKEN,
        "INFERCAP_SNAPSHOT_POLL_S": "0.1",
        "INFERCAP_PROXY_MAX_QUEUE": "4",  # a burst of 40 sheds
    }
    procs.spawn(uvicorn_argv("config.asgi:application", proxy_port), env=env, port=proxy_port)
    proxy = f"127.0.0.1:{proxy_port}"
    wait_until(
        lambda: httpx.get(f"http://{proxy}/health", timeout=5).status_code == 200, 30, "the proxy did not start"
    )
    return proxy, replicas


def _start_prometheus(procs: ProcessGroup, workdir: Path, proxy: str, replicas: list[tuple[str, str]]) -> str:
    """Prometheus on the shipped jobs (the web pods and the Service are the proxy; the replica template's pods are
    the replicas) and rules; returns its URL once it has scraped."""
    config = discovered_scrape_config(
        workdir, pods={"infercap-web": [(proxy, "")], "infercap-ep-ENDPOINT_ID": replicas},
        services={"infercap-web": proxy},
    )  # fmt: skip
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    write_rules(workdir)
    prometheus = prometheus_start(procs, workdir / "prometheus.yml", workdir)
    wait_until(lambda: query(prometheus, "up == 1"), 60, "Prometheus scraped nothing")
    time.sleep(1.5)  # every target scraped once: what the jobs kept is checked from /api/v1/targets at the end
    return prometheus


def _store_books(endpoint) -> None:
    """What /metrics/platform serves beyond the ledger: the traffic's usage rolled up, this hour's cost report."""
    metered = [-1]

    def metering_settled() -> bool:
        time.sleep(0.5)  # longer than the proxy's usage flush
        count, metered[0] = metered[0], UsageRecord.objects.filter(endpoint=endpoint).count()
        return count == metered[0] > 0

    wait_until(metering_settled, 30, "traffic not metered")
    usage_rollup_run()
    now = timezone.now()
    cost_reports_store(granularity=CostReport.Granularity.HOUR, start=now - timedelta(seconds=1), now=now)


def _answers(prometheus: str, queries: list[PanelQuery], timeout_s: float = 20) -> dict[PanelQuery, list]:
    """Each query's series with a finite value, asked again until all have one (rules evaluate each second)."""
    results: dict[PanelQuery, list] = {}

    def all_answered() -> bool:
        for q in queries:
            if not results.get(q):
                results[q] = [s for s in query(prometheus, q.promql) if math.isfinite(float(s["value"][1]))]
        return all(results.values())

    try:
        wait_until(all_answered, timeout_s, "every panel answered")
    except TimeoutError:
        pass  # the caller names the empty ones
    return results


def run(*, endpoint, keys: dict[str, str], variables: dict[str, str], progress=print) -> dict:
    """Starts the world (see ``_start_platform``; Prometheus), sends ``keys``' traffic twice (counters exist at the
    first scrape, then increase), stores the platform's books, and runs every panel query.

    Returns {"queries": [(PanelQuery, series returned)], "variables": {name: values listed}, "targets": Prometheus'
    active targets as (job, health, scrape URL)}."""
    workdir = Path(tempfile.mkdtemp(prefix="infercap-dashboard-"))
    with ProcessGroup() as procs:
        proxy, replicas = _start_platform(procs, endpoint)
        prometheus = _start_prometheus(procs, workdir, proxy, replicas)
        progress("prometheus up; sending traffic")
        for _ in range(2):
            _traffic(f"http://{proxy}", endpoint.name, keys)
            time.sleep(2)  # scrapes between the rounds: the second round's increments are rates
        _store_books(endpoint)
        progress("traffic sent; waiting for the rules")
        queries = panel_queries(variables)
        results = _answers(prometheus, queries)
        listed = variable_values(prometheus, variables)
        targets = httpx.get(f"{prometheus}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
    shutil.rmtree(workdir, ignore_errors=True)
    return {
        "queries": [(q, results.get(q, [])) for q in queries],
        "variables": listed,
        "targets": [(t["labels"]["job"], t["health"], t["scrapeUrl"]) for t in targets],
    }
