"""``bench proxy``: the proxy's added latency and throughput cost, proxied vs direct to simulated replicas,
at 1, 64 and 256 concurrent streams, measured in one run on the same replicas.

Processes: a simulated replica (``simulator.cli``), one proxy worker (uvicorn running
``config.asgi`` with the production settings: the full data path with auth, limits, admission, routing, relay and
metering), a bare pass-through (``benchmarks.serving.passthrough``: the same uvicorn + aiohttp hop with none of
those features) and this process as the load generator (aiohttp). At one stream the three paths are used in turn,
request by request. At 64 and 256 streams (``method=paired``, the default) direct and proxied traffic run at
once on the same replica, ``level`` streams each, every load-generator worker switching path on every request
and the workers' starts spread over ``ramp_s`` (1 s) per 64 streams: both paths then see the same replica state,
batching waves and background load, and the difference measures the proxy. (``method=phased`` runs them as
consecutive phases instead; the simulator's TTFT then drifts between phases by more than the proxy costs.)

Workload: closed-loop streams of ``max_tokens`` (64) tokens on short, unique prompts (``prompt_chars``, 64
characters = 16 tokens). The prompts are short so that the replica is not the thing measured: with the earlier
~70-token prompts, 2 × 64 streams made the simulated 13B engine batch ~32 prompts into 330 ms prefill steps, its
own TTFT p50 was ~580 ms, and the p50 of *any* extra hop swung by ±10 ms with the phase of those steps (a
do-nothing hop measured −5 to +9 ms in 280-request runs, +7.1 ms over 5,021). ``--opt prompt_chars=280``
reproduces that saturated case.

Per level: added TTFT p50 with its 95% bootstrap interval, added TTFT p99 and added end-to-end p50 (ms,
proxied − direct), of it the proxy's own time before the replica had the request (``proxy_own_p50_ms``, from the
answers' ``Server-Timing``), tokens/s through the proxy as a ratio of direct, errors, the replica's own TTFT p50 on the
direct path, and the proxy's CPU ms per 1,000 tokens (including its background work, e.g. the replica metrics
scraper); the ``bare_passthrough`` entry gives the same figures for the featureless hop (paired with its own
direct traffic), so what this machine charges for any extra hop can be told apart from the proxy's own cost.
Without ``--quick`` it also runs the upstream client calibration (aiohttp vs one pooled ``httpx.AsyncClient``
at 256 streams). Options: ``--opt speed=1.0`` (simulator speed), ``max_tokens=64``, ``prompt_chars=64``,
``levels=1,64,256``, ``rounds``, ``method=paired|phased``, ``ramp_s=1.0``, ``calibrate=0|1``, ``baseline=0|1``,
``proxy_log=FILE`` (the proxy's stderr), ``tracing=0|1``, ``duration_s`` (every phase's length). Quick runs have one or two requests per worker: use them as smoke tests,
not figures.

``--opt tracing=1``: a second proxy worker with tracing on (``INFERCAP_TRACING=1``, OTLP/HTTP batches to a sink in
this process that answers 200 and counts them, as a collector would) joins the one-stream interleaving, so tracing
on and off see the same replica and background load, request by request; the ``streams_1`` row then has a
``tracing`` entry and the result a top-level ``tracing_added_ttft_p50_ms`` (traced − untraced proxy TTFT p50, ms,
with its 95% bootstrap interval) and the batches and bytes the sink received. Only level 1 uses it.

``--opt profile=FILE``: the proxy worker runs under cProfile (``INFERCAP_PROXY_PROFILE``,
``gateway/proxy/profiling.py``) and writes FILE as it exits; the bench prints and returns each module's share of
the worker's CPU time (``profile.by_module``: the request path's stages are its files) and writes the sorted
listing to FILE.txt. The profiler slows the worker, so a profiled run's latency figures are not the proxy's.
"""

from __future__ import annotations

import asyncio
import io
import json
import math
import os
import pstats
import secrets
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import aiohttp
import httpx

from benchmarks.harness.bench_world import bench_world_create
from benchmarks.serving import proxy_processes
from benchmarks.serving.stats import added_p50_interval
from capacity.percentiles import percentile
from capacity.runtimes.processes import ProcessGroup, child_django_env, free_port, sim_replica_argv, uvicorn_argv
from endpoints.models import Replica

ROOT = Path(__file__).resolve().parents[2]
TENANT_SLUG = "bench-proxy"
# A short chat turn (16 tokens): see the module docstring for why the prompt is short.
PROMPT_CHARS = 64
_FILLER = "Say hello in one word. "
# --smoke: every level and the client calibration, in 0.3 s phases of 8-token answers at 10× speed.
SMOKE = {"duration_s": "0.3", "max_tokens": "8", "speed": "10", "calibrate": "1"}
ENDPOINT = "bench-proxy-model"


def _prompt(nonce: str, who, i: int, chars: int) -> str:
    """A unique prompt of ``chars`` characters (the simulator counts 4 per token): a per-phase nonce, so no phase
    rides on an earlier one's prefix cache, then the worker and request, padded with a fixed sentence."""
    head = f"{nonce} worker {who} request {i}: "
    return (head + _FILLER * (1 + chars // len(_FILLER)))[: max(chars, len(head))]


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pct(values: list[float], q: float) -> float:
    """``percentile`` (nearest rank), NaN for no values: the figures' arithmetic goes on and the JSON says NaN."""
    value = percentile(values, q)
    return math.nan if value is None else value


def _body(nonce: str, worker, i: int, prompt_chars: int, max_tokens: int) -> dict:
    """A streamed completion request of the load: its own prompt, run to ``max_tokens``."""
    return {
        "model": ENDPOINT,
        "prompt": _prompt(nonce, worker, i, prompt_chars),
        "max_tokens": max_tokens,
        "ignore_eos": True,  # every stream runs to max_tokens (the replica stops at EOS otherwise)
        "stream": True,
    }


async def _one(session, url: str, payload: bytes, headers: dict, out: dict) -> None:
    t0 = time.perf_counter()
    ttft = None
    tokens = 0
    done = False
    try:
        async with session.post(url, data=payload, headers=headers) as resp:
            if resp.status != 200:
                body = await resp.read()
                out["errors"] += 1
                out.setdefault("samples", []).append(f"{resp.status} {body[:200]!r}")
                return
            own = _server_timing(resp.headers.get("server-timing"), "proxy")
            async for chunk in resp.content.iter_any():
                if ttft is None:
                    ttft = time.perf_counter() - t0
                tokens += chunk.count(b'"text":')
                if b"[DONE]" in chunk:
                    done = True
    except Exception as exc:  # noqa: BLE001 - every failure is counted, none stops the run
        out["errors"] += 1
        out.setdefault("samples", []).append(repr(exc)[:200])
        return
    if not done or ttft is None:
        out["errors"] += 1
        out.setdefault("samples", []).append("stream ended without [DONE]")
        return
    out["ttft"].append(ttft)
    out["e2e"].append(time.perf_counter() - t0)
    out["tokens"] += tokens
    if own is not None:
        out.setdefault("own_s", []).append(own)


def _server_timing(value: str | None, metric: str) -> float | None:
    """A metric's duration in a ``Server-Timing`` header, in seconds (the proxy's own time before the replica had
    the request: docs/request-path.md); None where the answer has none (the direct path, the bare hop)."""
    for part in (value or "").split(","):
        name, _, params = part.strip().partition(";")
        if name == metric and params.startswith("dur="):
            return float(params[4:]) / 1000
    return None


async def _phase(
    base: str, key: str | None, *, streams: int, duration_s: float, max_tokens: int, prompt_chars: int = PROMPT_CHARS
) -> dict:
    url = base + "/v1/completions"
    headers = {"content-type": "application/json"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    out = {"ttft": [], "e2e": [], "tokens": 0, "errors": 0}
    # A fresh prefix per phase: the simulator caches prefixes, and a phase must not ride on the previous one's cache.
    nonce = os.urandom(4).hex()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
        deadline = time.perf_counter() + duration_s

        async def worker(w: int) -> None:
            i = 0
            while time.perf_counter() < deadline:
                body = _body(nonce, w, i, prompt_chars, max_tokens)
                await _one(session, url, json.dumps(body).encode(), headers, out)
                i += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(streams)))
        out["wall_s"] = time.perf_counter() - started
    return out


async def _mixed_phase(
    targets: list,
    *,
    streams: int,
    duration_s: float,
    max_tokens: int,
    ramp_s: float = 0.0,
    prompt_chars: int = PROMPT_CHARS,
) -> list[dict]:
    """``streams`` concurrent streams per target, all at once on the same replica: ``streams × len(targets)``
    workers, each switching target on every request (worker w's request i goes to target (w + i) mod n), so every
    path sees the same replica state, the same batching waves and the same background load."""
    outs = [{"ttft": [], "e2e": [], "tokens": 0, "errors": 0} for _ in targets]
    heads = []
    for base, key in targets:
        headers = {"content-type": "application/json"}
        if key:
            headers["authorization"] = f"Bearer {key}"
        heads.append((base + "/v1/completions", headers))
    nonce = os.urandom(4).hex()
    n = len(targets)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
        deadline = time.perf_counter() + duration_s

        async def worker(w: int) -> None:
            # Starts spread over ``ramp_s``: clients do not all arrive in the same millisecond, and a synchronised
            # herd makes every TTFT hinge on which side of one replica batching step a request lands.
            await asyncio.sleep(ramp_s * w / (streams * n))
            i = 0
            while time.perf_counter() < deadline:
                t = (w + i) % n
                body = _body(nonce, w, i, prompt_chars, max_tokens)
                await _one(session, heads[t][0], json.dumps(body).encode(), heads[t][1], outs[t])
                i += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(streams * n)))
        wall = time.perf_counter() - started
    for out in outs:
        out["wall_s"] = wall
    return outs


async def _httpx_phase(
    base: str, *, streams: int, duration_s: float, max_tokens: int, prompt_chars: int = PROMPT_CHARS
) -> dict:
    """The same load through one pooled ``httpx.AsyncClient``: the calibration behind choosing aiohttp."""
    out = {"ttft": [], "e2e": [], "tokens": 0, "errors": 0}
    nonce = os.urandom(4).hex()
    limits = httpx.Limits(max_connections=streams * 2, max_keepalive_connections=streams * 2)
    async with httpx.AsyncClient(limits=limits, timeout=120) as client:
        deadline = time.perf_counter() + duration_s

        async def worker(w: int) -> None:
            i = 0
            while time.perf_counter() < deadline:
                body = _body(nonce, w, i, prompt_chars, max_tokens)
                i += 1
                t0 = time.perf_counter()
                ttft, tokens, done = None, 0, False
                try:
                    async with client.stream("POST", base + "/v1/completions", json=body) as resp:
                        if resp.status_code != 200:
                            out["errors"] += 1
                            continue
                        async for chunk in resp.aiter_raw():
                            if ttft is None:
                                ttft = time.perf_counter() - t0
                            tokens += chunk.count(b'"text":')
                            done = done or b"[DONE]" in chunk
                except Exception:  # noqa: BLE001
                    out["errors"] += 1
                    continue
                if not done:
                    out["errors"] += 1
                    continue
                out["ttft"].append(ttft)
                out["e2e"].append(time.perf_counter() - t0)
                out["tokens"] += tokens

        started = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(streams)))
        out["wall_s"] = time.perf_counter() - started
    return out


async def _interleaved(
    direct_base,
    proxy_base,
    key,
    bare_base,
    *,
    n,
    max_tokens,
    proxy_pid,
    bare_pid,
    prompt_chars=PROMPT_CHARS,
    traced=None,
):
    """``n`` sequential requests to each path, in turn: a paired measurement for the single-stream figures.
    ``traced``: (base, pid) of the proxy with tracing on, a fourth path whose outcome is ``outs["traced"]``."""
    targets = [("direct", direct_base, None, 0), ("proxy", proxy_base, key, proxy_pid)]
    if bare_base:
        targets.append(("bare", bare_base, None, bare_pid))
    if traced:
        targets.append(("traced", traced[0], key, traced[1]))
    outs = {name: {"ttft": [], "e2e": [], "tokens": 0, "errors": 0, "wall_s": 0.0} for name, *_ in targets}
    nonce = os.urandom(4).hex()
    # CPU is read over the whole loop (the kernel counts it in 10 ms ticks, too coarse per request), so it
    # includes each process's background work while the other paths run.
    cpu = {name: 0.0 for name, *_ in targets}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        for i in range(n + 3):
            if i == 3:
                started = {name: _cpu_s(pid) for name, _, _, pid in targets if pid}
            for name, base, k, _pid in targets:
                headers = {"content-type": "application/json", **({"authorization": f"Bearer {k}"} if k else {})}
                body = _body(nonce, name, i, prompt_chars, max_tokens)
                scratch = {"ttft": [], "e2e": [], "tokens": 0, "errors": 0}
                await _one(session, base + "/v1/completions", json.dumps(body).encode(), headers, scratch)
                if i < 3:
                    continue  # warm-up round
                out = outs[name]
                out["ttft"] += scratch["ttft"]
                out["e2e"] += scratch["e2e"]
                out["tokens"] += scratch["tokens"]
                out["errors"] += scratch["errors"]
                out["wall_s"] += sum(scratch["e2e"])
                out.setdefault("own_s", []).extend(scratch.get("own_s", []))
    for name, _, _, pid in targets:
        if pid:
            cpu[name] = _cpu_s(pid) - started[name]
    if traced:
        traced.append((outs["traced"], cpu["traced"]))
    return outs["direct"], outs["proxy"], outs.get("bare"), cpu["proxy"], cpu.get("bare", 0.0)


def _client_row(out: dict) -> dict:
    return {
        "ttft_p50_ms": round(_pct(out["ttft"], 50) * 1000, 1),
        "ttft_p99_ms": round(_pct(out["ttft"], 99) * 1000, 1),
        "tokens_per_s": round(out["tokens"] / out["wall_s"], 1) if out["wall_s"] else 0.0,
        "errors": out["errors"],
    }


def _summary(direct: dict, proxied: dict, cpu_s: float) -> dict:
    d_tps = direct["tokens"] / direct["wall_s"] if direct["wall_s"] else 0.0
    p_tps = proxied["tokens"] / proxied["wall_s"] if proxied["wall_s"] else 0.0
    return {
        "added_ttft_p50_ms": round((_pct(proxied["ttft"], 50) - _pct(direct["ttft"], 50)) * 1000, 3),
        "added_ttft_p50_ci95_ms": added_p50_interval(direct["ttft"], proxied["ttft"]),
        "added_ttft_p99_ms": round((_pct(proxied["ttft"], 99) - _pct(direct["ttft"], 99)) * 1000, 3),
        # Of the added TTFT, the proxy's own work before the replica had the request (its Server-Timing).
        "proxy_own_p50_ms": round(_pct(proxied["own_s"], 50) * 1000, 3) if proxied.get("own_s") else None,
        "added_e2e_p50_ms": round((_pct(proxied["e2e"], 50) - _pct(direct["e2e"], 50)) * 1000, 3),
        "tokens_per_s_ratio": round(p_tps / d_tps, 4) if d_tps else None,
        "errors": proxied["errors"],
        "direct_errors": direct["errors"],
        "direct_ttft_p50_ms": round(_pct(direct["ttft"], 50) * 1000, 3),
        "proxied_ttft_p50_ms": round(_pct(proxied["ttft"], 50) * 1000, 3),
        "direct_tokens_per_s": round(d_tps, 1),
        "proxied_tokens_per_s": round(p_tps, 1),
        "requests": len(proxied["ttft"]),
        "error_samples": sorted(set(proxied.get("samples", [])))[:3],
        "proxy_cpu_ms_per_1k_tokens": round(cpu_s * 1000 / (proxied["tokens"] / 1000), 3)
        if proxied["tokens"]
        else None,
    }


def _merge(a: dict | None, b: dict) -> dict:
    if a is None:
        return b
    return {
        "ttft": a["ttft"] + b["ttft"],
        "e2e": a["e2e"] + b["e2e"],
        "tokens": a["tokens"] + b["tokens"],
        "errors": a["errors"] + b["errors"],
        "wall_s": a["wall_s"] + b["wall_s"],
        "samples": a.get("samples", []) + b.get("samples", []),
    }


def _svg(results: dict, path: str) -> None:
    results = {k: v for k, v in results.items() if k.startswith("streams_")}
    levels = list(results)
    width, height, pad = 520, 300, 50
    bar_w = (width - 2 * pad) / (len(levels) * 3)
    top = max(max(r["direct_ttft_p50_ms"], r["proxied_ttft_p50_ms"]) for r in results.values()) or 1.0
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">',
        f'<text x="{pad}" y="18">TTFT p50 (ms): direct (grey) vs proxied (blue)</text>',
    ]
    for i, level in enumerate(levels):
        r = results[level]
        for j, (value, color) in enumerate(((r["direct_ttft_p50_ms"], "#999"), (r["proxied_ttft_p50_ms"], "#36c"))):
            h = (height - 2 * pad) * value / top
            x = pad + (i * 3 + j) * bar_w
            parts.append(
                f'<rect x="{x:.1f}" y="{height - pad - h:.1f}" width="{bar_w * 0.9:.1f}" height="{h:.1f}" fill="{color}"/>'
            )
            parts.append(f'<text x="{x:.1f}" y="{height - pad - h - 3:.1f}">{value:.1f}</text>')
        parts.append(
            f'<text x="{pad + i * 3 * bar_w:.1f}" y="{height - pad + 15}">{level} ({r["tokens_per_s_ratio"]}× tok/s)</text>'
        )
    parts.append("</svg>")
    Path(path).write_text("\n".join(parts))


@dataclass(frozen=True)
class _Options:
    """``--opt`` values (see the module docstring) with the quick and full runs' defaults."""

    speed: float
    replicas: int
    max_tokens: int
    rounds: int
    durations: dict
    prompt_chars: int
    levels: list
    calibrate: bool
    baseline: bool
    paired: bool
    ramp_s: float
    proxy_log: str
    tracing: bool = False
    profile: str = ""  # --opt profile=FILE: the proxy worker's cProfile stats (gateway/proxy/profiling.py)

    @classmethod
    def parse(cls, opts: dict, *, quick: bool) -> _Options:
        method = str(opts.get("method", "paired"))
        if method not in ("paired", "phased"):
            raise ValueError("--opt method= must be paired or phased")
        return cls(
            speed=float(opts.get("speed", 1.0)),
            replicas=int(opts.get("replicas", 1)),
            max_tokens=int(opts.get("max_tokens", 64)),
            rounds=int(opts.get("rounds", 1 if quick else 3)),
            durations=_durations(opts, quick=quick),
            prompt_chars=int(opts.get("prompt_chars", PROMPT_CHARS)),
            levels=[int(x) for x in str(opts.get("levels", "1,64,256")).split(",")],
            calibrate=str(opts.get("calibrate", "0" if quick else "1")) in ("1", "true", "yes"),
            baseline=str(opts.get("baseline", "1")) in ("1", "true", "yes"),
            paired=method == "paired",
            ramp_s=float(opts.get("ramp_s", 1.0)),
            proxy_log=opts.get("proxy_log", os.devnull),
            tracing=str(opts.get("tracing", "0")) in ("1", "true", "yes"),
            profile=str(opts.get("profile", "")),
        )

    def tokens_for(self, level: int) -> int:
        # Short answers at one stream: TTFT is the figure there, and more requests give steadier percentiles.
        return min(self.max_tokens, 16) if level == 1 else self.max_tokens


def _durations(opts: dict, *, quick: bool) -> dict:
    """Seconds of each level's phase (and the calibration's, at 256); ``duration_s`` sets every one."""
    if "duration_s" in opts:
        return dict.fromkeys((1, 64, 256), float(opts["duration_s"]))
    return {1: 2.0, 64: 2.0, 256: 2.5} if quick else {1: 6.0, 64: 10.0, 256: 8.0}


@dataclass(frozen=True)
class _Paths:
    """Where the load goes: the replicas (direct), the proxy, and the bare pass-through (None without baseline)."""

    urls: list
    key: str
    proxy_base: str
    proxy_pid: int
    bare_base: str | None
    bare_pid: int
    traced_base: str | None = None  # the proxy with tracing on (--opt tracing=1)
    traced_pid: int = 0
    sink: _OtlpSink | None = None

    @property
    def direct_base(self) -> str:
        return self.urls[0]


def run(*, quick: bool, plot: str | None, live: bool = False, progress=print, **opts) -> dict:
    if "processes" in opts:  # several proxy processes acting as one: benchmarks/serving/proxy_processes.py
        return proxy_processes.run(quick=quick, progress=progress, **opts)
    options = _Options.parse(opts, quick=quick)
    group = ProcessGroup()
    try:
        paths = _start(group, options)
        progress(
            f"replicas {paths.urls}, proxy {paths.proxy_base}; speed {options.speed}, "
            f"{options.max_tokens} tokens per request"
        )
        if len(paths.urls) > 1:
            progress(
                "note: direct traffic goes to the first replica only; use --opt replicas=1 for a like-for-like ratio"
            )
        results = asyncio.run(_measure(options, paths, progress))
        if paths.sink is not None:
            group.kill_all()  # a terminated proxy flushes its last batch
            results["tracing_added_ttft_p50_ms"] = results["streams_1"]["tracing"]["added_ttft_p50_ms"]
            results["tracing_otlp_batches"], results["tracing_otlp_bytes"] = paths.sink.batches, paths.sink.bytes
            paths.sink.close()
    finally:
        group.kill_all()  # first: a failing clean-up below must not leave the processes running
        Replica.objects.filter(endpoint__name=ENDPOINT).delete()  # their processes are gone
    if options.profile:
        results["profile"] = profile_summary(options.profile, progress=progress)
    if plot:
        _svg(results, plot)
    return results


def profile_summary(path: str, *, progress=print, top: int = 15) -> dict:
    """The proxy worker's profile (written as it exited) summed per module, the request path's stages by file:
    where its CPU time goes (under the profiler, which slows every call: shares, not costs). The sorted listing is
    written beside it as FILE.txt."""
    stats = pstats.Stats(path)
    by_module: dict[str, float] = {}
    for (filename, _, _), (_, _, tottime, _, _) in stats.stats.items():
        by_module[_module_of(filename)] = by_module.get(_module_of(filename), 0.0) + tottime
    total = sum(by_module.values()) or 1.0
    listing = io.StringIO()
    pstats.Stats(path, stream=listing).sort_stats("tottime").print_stats(60)
    with open(path + ".txt", "w") as out:
        out.write(listing.getvalue())
    ranked = sorted(by_module.items(), key=lambda kv: -kv[1])[:top]
    for name, seconds in ranked:
        progress(f"profile: {name:<40} {seconds:8.3f} s  {seconds / total:6.1%}")
    return {"file": path, "total_s": round(total, 3), "by_module": {k: round(v / total, 4) for k, v in ranked}}


def _module_of(filename: str) -> str:
    """``gateway/proxy/relay.py`` for the platform's files, the package for a library's, ``~`` for built-ins."""
    parts = filename.replace("\\", "/").split("/")
    for anchor in ("gateway", "billing", "capacity", "config", "tenants", "endpoints"):
        if anchor in parts and "site-packages" not in parts:
            return "/".join(parts[parts.index(anchor) :])
    if "site-packages" in parts:
        return parts[parts.index("site-packages") + 1]
    return parts[-1] if filename not in ("~", "") else "~ (built-ins)"


def _start(group: ProcessGroup, options: _Options) -> _Paths:
    """The simulated replicas, the proxy as deployed and (with ``baseline``) the bare pass-through."""
    urls = []
    for _ in range(options.replicas):
        port = free_port()
        argv = sim_replica_argv(
            port, speed=options.speed, served_model_name=ENDPOINT, extra=["--max-num-seqs", "1024"]
        )
        group.spawn(argv, port=port, timeout=60)
        urls.append(f"http://127.0.0.1:{port}")
    key = bench_world_create(
        tenant_slug=TENANT_SLUG,
        tenant_name="Bench (proxy)",
        endpoint_name=ENDPOINT,
        replica_urls=urls,
        concurrency_limit=1024,
        routing_policy="infercap",
        replica_concurrency_limit=1024,
        key_name="bench",
    )
    proxy_port = free_port()
    # The deployed command line (uvloop and httptools: uvicorn_argv adds them when installed) and the deployed
    # settings (production: DEBUG off), as the reliability harness runs it.
    proxy_env = child_django_env(
        "config.settings.production",
        DJANGO_SECRET_KEY=secrets.token_urlsafe(48),
        DJANGO_SECURE_SSL_REDIRECT="0",
        INFERCAP_QUIET="1",
    )
    profiled = {"INFERCAP_PROXY_PROFILE": os.path.abspath(options.profile)} if options.profile else {}
    proxy = group.spawn(
        uvicorn_argv("config.asgi:application", proxy_port),
        env={**proxy_env, **profiled},
        port=proxy_port,
        stderr=options.proxy_log,
        timeout=60,
    )
    traced = _start_traced(group, options, proxy_env) if options.tracing else {}
    bare_base, bare_pid = None, 0
    if options.baseline:
        bare_port = free_port()
        bare_proc = group.spawn(
            uvicorn_argv("benchmarks.serving.passthrough:app", bare_port),
            env={"BENCH_UPSTREAM": urls[0]},
            port=bare_port,
            timeout=60,
        )
        bare_base, bare_pid = f"http://127.0.0.1:{bare_port}", bare_proc.pid
    return _Paths(urls, key, f"http://127.0.0.1:{proxy_port}", proxy.pid, bare_base, bare_pid, **traced)


class _OtlpSink:
    """A stand-in OTLP/HTTP collector: answers every export 200 and counts batches and bytes."""

    def __init__(self) -> None:
        sink = self
        self.batches = self.bytes = 0

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                sink.bytes += len(self.rfile.read(int(self.headers.get("content-length") or 0)))
                sink.batches += 1
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _start_traced(group: ProcessGroup, options: _Options, proxy_env: dict) -> dict:
    """The same proxy with tracing on, exporting to a sink in this process (``--opt tracing=1``)."""
    sink = _OtlpSink()
    port = free_port()
    env = {
        **proxy_env,
        "INFERCAP_TRACING": "1",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": sink.url,
        "OTEL_SERVICE_NAME": "infercap-bench",
        "OTEL_BSP_SCHEDULE_DELAY": "1000",  # batches every second, so a short run sees them arrive
    }
    proc = group.spawn(
        uvicorn_argv("config.asgi:application", port), env=env, port=port, stderr=options.proxy_log, timeout=60
    )
    return {"traced_base": f"http://127.0.0.1:{port}", "traced_pid": proc.pid, "sink": sink}


async def _measure(options: _Options, paths: _Paths, progress) -> dict:
    # Warm both paths (the proxy loads its snapshot on the first request).
    await _phase(paths.proxy_base, paths.key, streams=4, duration_s=0.5, max_tokens=8)
    await _phase(paths.direct_base, None, streams=4, duration_s=0.5, max_tokens=8)
    if paths.traced_base:
        await _phase(paths.traced_base, paths.key, streams=4, duration_s=0.5, max_tokens=8)
    results = {}
    for level in options.levels:
        results[f"streams_{level}"] = await _measure_level(options, paths, level)
        progress(f"{level} streams: {results[f'streams_{level}']}")
    if options.calibrate:
        # Upstream client calibration: the same 256 streams straight to the replica through each candidate
        # data-plane client (aiohttp, httpx), in this one run, so the proxy's choice of client rests on a measurement.
        n, dur = 256, options.durations.get(256, 3.0)
        load = {
            "streams": n,
            "duration_s": dur,
            "max_tokens": options.max_tokens,
            "prompt_chars": options.prompt_chars,
        }
        a = await _phase(paths.direct_base, None, **load)
        h = await _httpx_phase(paths.direct_base, **load)
        results["client_calibration_256"] = {"aiohttp": _client_row(a), "httpx": _client_row(h)}
        progress(f"client calibration: {results['client_calibration_256']}")
    return results


async def _measure_level(options: _Options, paths: _Paths, level: int) -> dict:
    """One level's row: one stream interleaved request by request, more streams in ``rounds`` phases."""
    traced = [paths.traced_base, paths.traced_pid] if paths.traced_base and level == 1 else None
    if level == 1:
        # One stream: alternate the paths request by request, so both see the same background load.
        direct, proxied, bare, cpu, bare_cpu = await _interleaved(
            paths.direct_base,
            paths.proxy_base,
            paths.key,
            paths.bare_base,
            n=int(options.durations.get(1, 2.0) * 12) * options.rounds,
            max_tokens=options.tokens_for(1),
            proxy_pid=paths.proxy_pid,
            bare_pid=paths.bare_pid,
            prompt_chars=options.prompt_chars,
            traced=traced,
        )
        bare_direct = None
    else:
        direct, proxied, bare, bare_direct, cpu, bare_cpu = await _phase_rounds(options, paths, level)
    row = _summary(direct, proxied, cpu)
    row["method"] = "interleaved" if level == 1 else ("paired" if options.paired else "phased")
    if bare is not None:
        # The same extra hop without any of the proxy's features: what this machine charges for a hop.
        base_row = _summary(bare_direct or direct, bare, bare_cpu)
        row["bare_passthrough"] = {k: base_row[k] for k in _BARE_KEYS}
    if traced:
        # Tracing on vs off: the traced proxy against the untraced one, request by request in the same loop.
        traced_out, traced_cpu = traced[2]
        on = _summary(proxied, traced_out, traced_cpu)
        row["tracing"] = {
            "added_ttft_p50_ms": on["added_ttft_p50_ms"],
            "added_ttft_p50_ci95_ms": on["added_ttft_p50_ci95_ms"],
            "added_e2e_p50_ms": on["added_e2e_p50_ms"],
            "traced_ttft_p50_ms": on["proxied_ttft_p50_ms"],
            "untraced_ttft_p50_ms": on["direct_ttft_p50_ms"],
            "errors": on["errors"],
            "requests": on["requests"],
            "proxy_cpu_ms_per_1k_tokens": on["proxy_cpu_ms_per_1k_tokens"],
        }
    return row


_BARE_KEYS = (
    "added_ttft_p50_ms",
    "added_ttft_p50_ci95_ms",
    "added_ttft_p99_ms",
    "tokens_per_s_ratio",
    "errors",
    "proxy_cpu_ms_per_1k_tokens",
)


async def _phase_rounds(options: _Options, paths: _Paths, level: int) -> tuple:
    """``rounds`` phases of ``level`` streams on each path: (direct, proxied, bare, bare's direct, proxy CPU s,
    bare CPU s), the phases' outcomes merged."""
    direct = proxied = bare = bare_direct = None
    cpu = bare_cpu = 0.0
    for _ in range(options.rounds):
        phase = {
            "streams": level,
            "duration_s": options.durations.get(level, 3.0),
            "max_tokens": options.tokens_for(level),
            "prompt_chars": options.prompt_chars,
        }
        # Starts spread over ramp_s per 64 streams (at most half the phase): at 256 streams a 1 s ramp still left
        # bursts of arrivals whose order at the replica swung the p50 by a batching step.
        mixed = {**phase, "ramp_s": min(options.ramp_s * level / 64, phase["duration_s"] / 2)}
        before = _cpu_s(paths.proxy_pid)
        if options.paired:
            # Both paths at once, each with ``level`` streams, on the same replica: they see the same replica state
            # and the same background load, so the difference is the proxy's own.
            d, p = await _mixed_phase([(paths.direct_base, None), (paths.proxy_base, paths.key)], **mixed)
        else:
            d = await _phase(paths.direct_base, None, **phase)
            before = _cpu_s(paths.proxy_pid)
            p = await _phase(paths.proxy_base, paths.key, **phase)
        cpu += _cpu_s(paths.proxy_pid) - before
        direct, proxied = _merge(direct, d), _merge(proxied, p)
        if paths.bare_base:
            before_bare = _cpu_s(paths.bare_pid)
            if options.paired:
                bd, b = await _mixed_phase([(paths.direct_base, None), (paths.bare_base, None)], **mixed)
                bare_direct = _merge(bare_direct, bd)
            else:
                b = await _phase(paths.bare_base, None, **phase)
            bare = _merge(bare, b)
            bare_cpu += _cpu_s(paths.bare_pid) - before_bare
    return direct, proxied, bare, bare_direct, cpu, bare_cpu
