"""``bench proxy --opt processes=N``: several proxy processes acting as one through Redis (docs/request-path.md,
"Several proxy processes"): how many concurrent streams N of them serve within an added-TTFT bound, what each costs
and where the CPU goes, and whether a tenant's rate limit and a replica's concurrency limit hold across them.

Processes: ``replicas`` simulated replicas (``--max-num-seqs 1024``, limit 1,024 each: not the bottleneck), N proxy
workers (the same production-settings uvicorn command as ``bench proxy``, each its own process and port, sharing the
one Redis and PostgreSQL), and the load generator in its own process (``proxy_loadgen.py``), which spreads its
proxied streams over the N proxies round-robin, as a Service would, and runs a few direct streams to the replicas
beside them (``max(8, streams / 4)``): the added TTFT is p50(proxied) − p50(direct) in the same phase.

For each N of ``processes`` (``1,2`` compares them in one run; every count's proxies run at once, and the searches
take turns level by level, so the counts see the same minutes of the machine's load): a capacity search, streams
doubling from ``start`` until a phase's added TTFT p50 is above ``bound_ms`` (its 95 % bootstrap interval wholly
above it), any request fails or the replicas' own TTFT p50 triples (``Search``), then ``refine`` bisections. The
most streams that met the bound with 0 errors is ``proxy.processes.<N>.streams_at_bound``, with that phase's added
TTFT p50, proxied tokens/s, proxy CPU per 1,000 tokens, each process's CPU (cores), the load generator's and the
replicas' CPU, and Redis commands per second and per request (``INFO commandstats`` of the shared Redis, less the
rate with every proxy idle); ``.stopped_by`` says what ended the doubling. ``proxy.processes.scaling_2_over_1`` is
the ratio of the two counts' streams.

The limits check (across the largest N, if ≥ 2; ``limits=1``): an endpoint whose one replica has a concurrency limit
of 4, driven with 4 streams per slot spread over the N processes (each alone would fill the limit), the replica's
requests in flight polled every 5 ms (``replica_max_in_flight`` ≤ 4); and an API key with an RPM limit of 120, sent
three times that as fast as possible over the N processes (``rpm_admitted`` ≤ the bucket plus its refill over the
burst). ``shared_redis=0`` is the control: every process after the first gets its own private Redis, and the same
check shows what N processes that do not share Redis let through.

Options: ``processes=1,2``, ``bound_ms`` (10), ``start`` (8), ``max_streams`` (256 quick, 1,024 full), ``refine``
(1 quick, 2 full), ``duration_s`` (each phase: 3 quick, 8 full), ``replicas`` (4), ``speed``, ``max_tokens`` (64),
``prompt_chars`` (64), ``ramp_s``, ``limits=0|1``, ``shared_redis=0|1``, ``proxy_log=FILE``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass

import redis
from django.conf import settings

from benchmarks.harness.bench_world import bench_world_create
from benchmarks.serving.stats import added_p50_interval
from capacity.percentiles import percentile
from capacity.runtimes.processes import (
    ROOT,
    ProcessGroup,
    child_django_env,
    free_port,
    sim_replica_argv,
    stop_process,
    uvicorn_argv,
)
from endpoints.models import Replica
from tenants.models import Tenant
from tenants.services import api_key_create

TENANT_SLUG = "bench-procs"
ENDPOINT = "bench-procs-model"
LIMITED_ENDPOINT = "bench-procs-limited"
REPLICA_LIMIT = 4  # the limited replica's concurrency limit
RPM_LIMIT = 120  # the limits check key's requests per minute: leases of 5 % (6 requests) are granted
PREFIX = "proxy.processes"
# A level whose replicas' own TTFT p50 is over this many times the first level's has the replicas (or the machine's
# CPU starving them) as its bottleneck; 2 was within one phase's noise (86.7 against 41.9 ms at 80 streams, then
# 68 ms at 128), starved replicas went 3-8 times (60 -> 155-480 ms at a load average of 10).
REPLICA_TTFT_GROWTH = 3.0


@dataclass(frozen=True)
class Options:
    """``--opt`` values (the module docstring) with the quick and full runs' defaults."""

    processes: list
    bound_ms: float
    start: int
    max_streams: int
    refine: int
    duration_s: float
    replicas: int
    speed: float
    max_tokens: int
    prompt_chars: int
    ramp_s: float
    limits: bool
    shared_redis: bool
    proxy_log: str

    @classmethod
    def parse(cls, opts: dict, *, quick: bool) -> Options:
        try:
            processes = [int(n) for n in str(opts["processes"]).split(",")]
        except ValueError:
            raise ValueError("--opt processes= must be a number or a list like 1,2") from None
        if not processes or any(n < 1 or n > 16 for n in processes):
            raise ValueError("--opt processes= takes 1 to 16 processes")
        options = cls(
            processes=processes,
            bound_ms=float(opts.get("bound_ms", 10.0)),
            start=int(opts.get("start", 8)),
            max_streams=int(opts.get("max_streams", 256 if quick else 1024)),
            refine=int(opts.get("refine", 1 if quick else 2)),
            duration_s=float(opts.get("duration_s", 3.0 if quick else 8.0)),
            replicas=int(opts.get("replicas", 4)),
            speed=float(opts.get("speed", 1.0)),
            max_tokens=int(opts.get("max_tokens", 64)),
            prompt_chars=int(opts.get("prompt_chars", 64)),
            ramp_s=float(opts.get("ramp_s", 1.0)),
            limits=str(opts.get("limits", "1")) in ("1", "true", "yes"),
            shared_redis=str(opts.get("shared_redis", "1")) in ("1", "true", "yes"),
            proxy_log=opts.get("proxy_log", os.devnull),
        )
        if options.bound_ms <= 0 or options.start < 1 or options.max_streams < options.start:
            raise ValueError("--opt bound_ms must be > 0 and 1 <= start <= max_streams")
        if options.replicas < 1 or options.duration_s <= 0:
            raise ValueError("--opt replicas must be >= 1 and duration_s > 0")
        return options


@dataclass(frozen=True)
class Fleet:
    """What the phases drive besides the proxies: the load generator, the replicas and the keys."""

    loadgen: LoadGen
    replica_urls: list
    replica_pids: list
    limited_url: str
    key: str
    rpm_key: str


class LoadGen:
    """The load generator process (``proxy_loadgen.py``): one JSON command in, one JSON result out."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.serving.proxy_loadgen"],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def ask(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the load generator exited with {self.proc.wait()}")
        return json.loads(line)

    def close(self) -> None:
        stop_process(self.proc, grace_s=2.0)


def run(*, quick: bool, progress=print, **opts) -> dict:
    options = Options.parse(opts, quick=quick)
    group = ProcessGroup()
    loadgen = None
    results: dict = {f"{PREFIX}.bound_ms": options.bound_ms, f"{PREFIX}.shared_redis": options.shared_redis}
    results[f"{PREFIX}.cores"] = os.cpu_count()
    try:
        urls, pids = _start_replicas(group, options, model=ENDPOINT, count=options.replicas)
        limited = _start_replicas(group, options, model=LIMITED_ENDPOINT, count=1)[0][0]
        key = _world(urls, limited)
        tenant = Tenant.objects.get(slug=TENANT_SLUG)
        # Created before the proxies start, so their first snapshot holds it; its RPM bucket starts full.
        _, rpm_key = api_key_create(tenant=tenant, name=f"rpm {time.time():.0f}", rpm_limit=RPM_LIMIT)
        loadgen = LoadGen()
        fleet = Fleet(loadgen, urls, pids, limited, key, rpm_key=rpm_key)
        redis_urls = _redis_urls(group, max(options.processes), shared=options.shared_redis)
        results.update(_measure(fleet, group, options, redis_urls, progress))
    finally:
        if loadgen is not None:
            loadgen.close()
        group.kill_all()
        Replica.objects.filter(endpoint__name__in=(ENDPOINT, LIMITED_ENDPOINT)).delete()  # their processes are gone
    one, two = results.get(f"{PREFIX}.1.streams_at_bound"), results.get(f"{PREFIX}.2.streams_at_bound")
    results[f"{PREFIX}.scaling_2_over_1"] = round(two / one, 3) if one and two is not None else None
    return results


def _start_replicas(group: ProcessGroup, options: Options, *, model: str, count: int) -> tuple[list, list]:
    urls, pids = [], []
    for _ in range(count):
        port = free_port()
        argv = sim_replica_argv(port, speed=options.speed, served_model_name=model, extra=["--max-num-seqs", "1024"])
        proc = group.spawn(argv, port=port, timeout=60)
        urls.append(f"http://127.0.0.1:{port}")
        pids.append(proc.pid)
    return urls, pids


def _world(urls: list, limited_url: str) -> str:
    """The bench's tenant with the open endpoint (replica limit 1,024) and the limited one (its replica's limit
    ``REPLICA_LIMIT``); returns the open key."""
    common = {"tenant_slug": TENANT_SLUG, "tenant_name": "Bench (proxy processes)", "routing_policy": "infercap"}
    key = bench_world_create(
        **common, endpoint_name=ENDPOINT, replica_urls=urls, concurrency_limit=1024, replica_concurrency_limit=1024,
        key_name="bench",
    )  # fmt: skip
    bench_world_create(
        **common, endpoint_name=LIMITED_ENDPOINT, replica_urls=[limited_url], concurrency_limit=REPLICA_LIMIT,
        replica_concurrency_limit=REPLICA_LIMIT, key_name="bench-limited",
    )  # fmt: skip
    return key


def _redis_urls(group: ProcessGroup, most: int, *, shared: bool) -> list[str]:
    """Each process's Redis: the one Redis for all (as deployed), or for the control a private one for every process
    after the first (``shared_redis=0``)."""
    if shared:
        return [settings.REDIS_URL] * most
    server = shutil.which("redis-server")
    if server is None:
        raise ValueError("--opt shared_redis=0 needs redis-server on the PATH")
    urls = [settings.REDIS_URL]
    for _ in range(most - 1):
        port = free_port()
        group.spawn([server, "--port", str(port), "--save", "", "--appendonly", "no"], port=port, timeout=20)
        urls.append(f"redis://127.0.0.1:{port}/0")
    return urls


def _start_proxies(group: ProcessGroup, n: int, options: Options, redis_urls: list) -> list[tuple[str, int]]:
    """N proxy workers as ``bench proxy`` starts its one: the deployed command line and production settings."""
    env = child_django_env(
        "config.settings.production",
        DJANGO_SECRET_KEY=secrets.token_urlsafe(48),
        DJANGO_SECURE_SSL_REDIRECT="0",
        INFERCAP_QUIET="1",
    )
    proxies = []
    for i in range(n):
        port = free_port()
        proc = group.spawn(
            uvicorn_argv("config.asgi:application", port),
            env={**env, "REDIS_URL": redis_urls[i]},
            port=port,
            stderr=options.proxy_log,
            timeout=60,
        )
        proxies.append((f"http://127.0.0.1:{port}", proc.pid))
    return proxies


def _measure(fleet: Fleet, group: ProcessGroup, options: Options, redis_urls: list, progress) -> dict:
    """Every count's proxies started at once and their searches interleaved level by level (1 process at a level,
    then 2, ...): the counts compared see the same minutes of this machine's load; then the limits check across the
    largest count."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        others_ops = _redis_rate(client, seconds=1.0)  # other clients of this Redis, before any proxy
        sets = {n: _start_proxies(group, n, options, redis_urls) for n in options.processes}
        for proxies in sets.values():
            _warm(fleet, proxies)
        out = {f"{PREFIX}.load_average_before": [round(x, 2) for x in os.getloadavg()]}
        idle = _idle(sets, client, others_ops)
        out[f"{PREFIX}.idle"] = idle
        progress(f"idle: {idle}")
        searches = {n: Search(options) for n in options.processes}
        while any(search.next_level() for search in searches.values()):
            for n, search in searches.items():
                if level := search.next_level():
                    search.record(_phase(fleet, sets[n], options, level, client, idle["redis_ops_per_s"]))
                    progress(f"{n} process(es), {level} streams: {search.steps[-1]}")
        for n, search in searches.items():
            out.update({f"{PREFIX}.{n}.{k}": v for k, v in search.best.items() if k != "streams"})
            out[f"{PREFIX}.{n}.streams_at_bound"] = search.best.get("streams", 0)
            out[f"{PREFIX}.{n}.stopped_by"] = search.stopped_by
            out[f"{PREFIX}.{n}.search"] = search.steps
        most = max(options.processes)
        if most >= 2 and options.limits:
            out.update({f"{PREFIX}.limits.{k}": v for k, v in _limits_check(fleet, sets[most], options).items()})
            progress(f"limits across {most} processes: {_limits_line(out)}")
        out[f"{PREFIX}.load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        client.close()
    return out


def _limits_line(out: dict) -> str:
    return ", ".join(f"{k.rsplit('.', 1)[1]}={v}" for k, v in out.items() if k.startswith(f"{PREFIX}.limits."))


def _warm(fleet: Fleet, proxies: list) -> None:
    """Every proxy loads its snapshot and opens its upstream connections before anything is measured."""
    proxied = [[base, fleet.key] for base, _ in proxies]
    fleet.loadgen.ask(op="load", model=ENDPOINT, proxied=proxied, streams=2 * len(proxied), duration_s=1.0,
                      max_tokens=8, ramp_s=0.0)  # fmt: skip


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _redis_calls(client: redis.Redis) -> dict[str, int]:
    """Calls per command so far (``INFO commandstats``: the whole server's, every database's clients)."""
    return {name.removeprefix("cmdstat_"): row["calls"] for name, row in client.info("commandstats").items()}


def _redis_rate(client: redis.Redis, *, seconds: float) -> float:
    before = sum(_redis_calls(client).values())
    time.sleep(seconds)
    return (sum(_redis_calls(client).values()) - before - 1) / seconds  # less our own INFO


def _idle(sets: dict, client: redis.Redis, others_ops: float, seconds: float = 3.0) -> dict:
    """The proxies' background with no request (scraper, heartbeat, lease sweep, snapshot poll, demand): CPU ms a
    second per process and the Redis commands a second all of them add to the other clients' rate."""
    pids = [pid for proxies in sets.values() for _, pid in proxies]
    cpu = [_cpu_s(pid) for pid in pids]
    calls = _redis_calls(client)
    time.sleep(seconds)
    after = _redis_calls(client)
    by_command = {c: round((after[c] - calls.get(c, 0)) / seconds, 1) for c in after if after[c] > calls.get(c, 0)}
    total = sum(by_command.values())
    return {
        "processes": len(pids),
        "cpu_ms_per_s": [round((_cpu_s(pid) - c) * 1000 / seconds, 1) for pid, c in zip(pids, cpu, strict=True)],
        "redis_ops_per_s": round(max(0.0, total - others_ops), 1),
        "redis_other_clients_ops_per_s": round(others_ops, 1),
        "redis_by_command_per_s": dict(sorted(by_command.items(), key=lambda kv: -kv[1])[:6]),
    }


class Search:
    """The capacity search of one count: streams doubling from ``start`` until a level fails, then ``refine``
    bisections between the last level that met the bound and the first that did not. A level fails on an error, on
    its added TTFT (``_meets``) or when the replicas' own TTFT p50 (the direct streams') is over
    ``REPLICA_TTFT_GROWTH`` times the first level's: the replicas, or this machine's CPU starving them, are then the
    bottleneck, and the proxy routes to the least-loaded replica where the direct streams keep theirs, so the
    difference no longer measures the proxy."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.level, self.failed, self.refines_left = options.start, None, options.refine
        self.best: dict = {}
        self.steps: list = []
        self.direct_floor_ms: float | None = None  # the replicas' TTFT p50 at the first level
        self.stopped_by = "max_streams"  # what ended the doubling: bound, errors, replicas or max_streams

    def next_level(self) -> int | None:
        if self.failed is None:
            return self.level if self.level <= self.options.max_streams else None
        low = self.best.get("streams", 0)
        mid = (low + self.failed) // 2
        return mid if self.refines_left > 0 and low < mid < self.failed else None

    def record(self, row: dict) -> None:
        self.steps.append(_step(row))
        if self.direct_floor_ms is None:
            self.direct_floor_ms = row["direct_ttft_p50_ms"]
        direct, floor = row["direct_ttft_p50_ms"], self.direct_floor_ms
        replicas_ok = direct is not None and (floor is None or direct <= REPLICA_TTFT_GROWTH * floor)
        met = replicas_ok and _meets(row, self.options)
        if self.failed is None:
            if met:
                self.best, self.level = row, self.level * 2
            else:
                self.failed = row["streams"]
                errored = row["errors"] or row["direct_errors"]
                self.stopped_by = "errors" if errored else "bound" if replicas_ok else "replicas"
            return
        self.refines_left -= 1
        if met:
            self.best = row
        else:
            self.failed = row["streams"]


def _meets(row: dict, options: Options) -> bool:
    """0 errors, and the added TTFT p50 not above the bound beyond the phase's own noise: a level fails when its 95 %
    interval lies wholly above the bound (the point figure when too few requests for an interval). One phase's p50
    of a few dozen requests moves by a simulated batching step (tens of ms), so a lone noisy phase would end the
    search early."""
    added, interval = row["added_ttft_p50_ms"], row["added_ttft_p50_ci95_ms"]
    if row["errors"] or row["direct_errors"] or added is None:
        return False
    return (interval[0] if interval else added) <= options.bound_ms


def _step(row: dict) -> dict:
    keys = ("streams", "added_ttft_p50_ms", "direct_ttft_p50_ms", "errors", "tokens_per_s", "cpu_ms_per_1k_tokens")
    keys += ("proxy_cpu_cores", "machine_cpu_cores")
    return {k: row[k] for k in keys}


def _phase(fleet: Fleet, proxies: list, options: Options, level: int, client, idle_ops: float) -> dict:
    """One phase of ``level`` proxied streams over ``proxies`` (and the direct baseline beside them), with every
    process's CPU and the Redis commands it cost."""
    pids = [pid for _, pid in proxies]
    cpu = {pid: _cpu_s(pid) for pid in pids + fleet.replica_pids}
    calls = _redis_calls(client)
    started = time.perf_counter()
    result = fleet.loadgen.ask(
        op="load",
        model=ENDPOINT,
        proxied=[[base, fleet.key] for base, _ in proxies],
        direct=fleet.replica_urls,
        streams=level,
        direct_streams=max(8, level // 4),
        duration_s=options.duration_s,
        max_tokens=options.max_tokens,
        prompt_chars=options.prompt_chars,
        ramp_s=options.ramp_s,
    )
    wall = time.perf_counter() - started
    spent = {pid: _cpu_s(pid) - before for pid, before in cpu.items()}
    after = _redis_calls(client)
    delta = {c: after[c] - calls.get(c, 0) for c in after if after[c] > calls.get(c, 0)}
    return _row(level, result, wall, [spent[p] for p in pids], sum(spent[p] for p in fleet.replica_pids), delta,
                idle_ops)  # fmt: skip


def _row(level: int, result: dict, wall: float, proxy_cpu: list, replica_cpu: float, delta: dict, idle_ops) -> dict:
    proxied, direct = result["proxied"], result["direct"]
    requests = len(proxied["ttft"])
    p50 = _p50_ms(proxied["ttft"])
    d50 = _p50_ms(direct["ttft"])
    loadgen_cores = result["loadgen_cpu_s"] / wall
    redis_ops = sum(delta.values())
    return {
        "streams": level,
        "added_ttft_p50_ms": round(p50 - d50, 2) if p50 is not None and d50 is not None else None,
        "added_ttft_p50_ci95_ms": added_p50_interval(direct["ttft"], proxied["ttft"]),
        "proxied_ttft_p50_ms": p50,
        "direct_ttft_p50_ms": d50,
        "errors": proxied["errors"],
        "direct_errors": direct["errors"],
        "error_samples": proxied["samples"] + direct["samples"],
        "requests": requests,
        "tokens_per_s": round(proxied["tokens"] / proxied["wall_s"], 1) if proxied["wall_s"] else 0.0,
        "cpu_ms_per_1k_tokens": round(sum(proxy_cpu) * 1e6 / proxied["tokens"], 1) if proxied["tokens"] else None,
        "proxy_cpu_cores": [round(c / wall, 3) for c in proxy_cpu],
        "loadgen_cpu_cores": round(loadgen_cores, 3),
        "replicas_cpu_cores": round(replica_cpu / wall, 3),
        "machine_cpu_cores": round((sum(proxy_cpu) + replica_cpu) / wall + loadgen_cores, 3),
        "redis_ops_per_s": round(redis_ops / wall, 1),
        "redis_calls_per_request": round(max(0.0, redis_ops - idle_ops * wall) / requests, 3) if requests else None,
        "redis_by_command": dict(sorted(delta.items(), key=lambda kv: -kv[1])[:6]),
    }


def _p50_ms(values: list[float]) -> float | None:
    value = percentile(values, 50)
    return None if value is None else round(value * 1000, 2)


def _limits_check(fleet: Fleet, proxies: list, options: Options) -> dict:
    """A replica's concurrency limit and a key's RPM limit, each driven through every process of ``proxies``."""
    proxied = [[base, fleet.key] for base, _ in proxies]
    streams = 4 * REPLICA_LIMIT
    slots = fleet.loadgen.ask(
        op="load", model=LIMITED_ENDPOINT, proxied=proxied, streams=streams, duration_s=max(3.0, options.duration_s),
        max_tokens=options.max_tokens, prompt_chars=options.prompt_chars, ramp_s=0.0, watch=[fleet.limited_url],
    )  # fmt: skip
    peak = slots["max_in_flight"].get(fleet.limited_url)
    rpm_targets = [[base, fleet.rpm_key] for base, _ in proxies]
    burst = fleet.loadgen.ask(op="burst", model=ENDPOINT, proxied=rpm_targets, requests=3 * RPM_LIMIT, concurrency=16)
    admitted = burst["statuses"].get("200", 0)
    # The bucket holds a minute's worth and refills at RPM/60 a second over the burst; leases come out of it.
    allowed = RPM_LIMIT + int(RPM_LIMIT / 60 * burst["wall_s"]) + 1
    return {
        "processes": len(proxies),
        "replica_limit": REPLICA_LIMIT,
        "replica_streams": streams,
        "replica_max_in_flight": peak,
        "replica_limit_held": peak is not None and peak <= REPLICA_LIMIT,
        "replica_served": len(slots["proxied"]["ttft"]),
        "replica_errors": slots["proxied"]["errors"],
        "rpm_limit": RPM_LIMIT,
        "rpm_sent": 3 * RPM_LIMIT,
        "rpm_admitted": admitted,
        "rpm_allowed_max": allowed,
        "rpm_429s": burst["statuses"].get("429", 0),
        "rpm_other_statuses": {s: c for s, c in burst["statuses"].items() if s not in ("200", "429")},
        "rpm_burst_s": round(burst["wall_s"], 2),
        "rate_limit_held": admitted <= allowed,
    }
