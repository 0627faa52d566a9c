"""``bench routing --live``: the shared-prefix workload through the real proxy onto real simulated replicas.

Processes: ``replicas`` simulated vLLM replicas (``simulator.cli``, a small KV cache so that the
groups' prefixes compete for it, as in the discrete-event run), one proxy worker (uvicorn ``config.asgi``: auth,
limits, admission, routing with the metrics scraper, relay) and this process as the open-loop load generator
(Poisson arrivals). For each policy the endpoint's ``routing_policy`` is switched (the proxy reloads its
snapshot) and a fresh set of group prompts is used, so no policy inherits another's warm caches.

Per policy and QPS stage: SLO-meeting requests/s, TTFT p50/p95, output tokens/s; per policy: prefix-cache hit
rate from the responses' ``usage.prompt_tokens_details.cached_tokens`` and max/mean generated tokens per replica
from each replica's ``vllm:generation_tokens_total``. Scaled down from the simulator run (smaller prompts,
fewer replicas) to fit a laptop's cores in real time; the ratios, not the absolute numbers, are the point.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from pathlib import Path

import httpx

from benchmarks.harness.bench_world import bench_world_create
from benchmarks.serving.words import random_text
from capacity.percentiles import percentile
from capacity.runtimes.processes import ProcessGroup, child_django_env, free_port, uvicorn_argv
from endpoints.models import Endpoint
from simulator.process import start_replica

ROOT = Path(__file__).resolve().parents[2]
TENANT_SLUG = "bench-routing"
ENDPOINT = "bench-routing-model"
# A small, prefill-heavy replica: 8 groups × 512-token prefixes (256 blocks) do not fit one cache (224 blocks),
# two groups per replica do.
PROFILE_OPTS = {"num_gpu_blocks": 224, "max_num_seqs": 24, "max_model_len": 2048, "prefill_tokens_per_s": 4000}


def _world(replica_urls: list[str]) -> str:
    return bench_world_create(
        tenant_slug=TENANT_SLUG,
        tenant_name="Bench (routing)",
        endpoint_name=ENDPOINT,
        replica_urls=replica_urls,
        concurrency_limit=64,
        routing_policy="round_robin",
        key_name="bench routing",
    )


def _set_policy(policy: str) -> None:
    endpoint = Endpoint.objects.get(name=ENDPOINT)
    endpoint.routing_policy = policy
    endpoint.save(update_fields=["routing_policy", "updated_at"])


def _generation_tokens(urls: list[str]) -> list[float]:
    totals = []
    for url in urls:
        total = 0.0
        for line in httpx.get(f"{url}/metrics", timeout=5).text.splitlines():
            if line.startswith("vllm:generation_tokens_total"):
                total += float(line.rsplit(" ", 1)[1])
        totals.append(total)
    return totals


async def _one(client: httpx.AsyncClient, url: str, body: dict, headers: dict, out: list) -> None:
    started = time.perf_counter()
    record = {"ok": False, "ttft": None, "tokens": 0, "prompt_tokens": 0, "cached": 0, "start": started}
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            if response.status_code != 200:
                record["error"] = f"HTTP {response.status_code}"
                await response.aread()
            else:
                async for line in response.aiter_lines():
                    if not line.startswith("data:") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[5:])
                    if chunk.get("choices"):
                        if record["ttft"] is None:
                            record["ttft"] = time.perf_counter() - started
                        record["tokens"] += 1
                    usage = chunk.get("usage")
                    if usage:
                        record["prompt_tokens"] = usage.get("prompt_tokens", 0)
                        record["cached"] = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
                record["ok"] = record["ttft"] is not None
    except httpx.HTTPError as exc:
        record["error"] = type(exc).__name__
    record["e2e"] = time.perf_counter() - started
    out.append(record)


async def _stage(
    base: str, key: str, prompts: list[str], *, qps: float, duration_s: float, output_tokens: int, seed: int
):
    rng = random.Random(seed)
    out: list[dict] = []
    headers = {"authorization": f"Bearer {key}"}
    url = f"{base}/v1/completions"
    tasks = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0), limits=httpx.Limits(max_connections=1000)) as client:
        started = time.perf_counter()
        t = 0.0
        while True:
            t += rng.expovariate(qps)
            if t >= duration_s:
                break
            delay = started + t - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            body = {
                "model": ENDPOINT,
                "prompt": rng.choice(prompts),
                "max_tokens": output_tokens,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            tasks.append(asyncio.ensure_future(_one(client, url, body, headers, out)))
        await asyncio.gather(*tasks)
    return out


def _stage_figures(records: list[dict], *, duration_s: float, ttft_slo_s: float, tpot_slo_s: float) -> dict:
    good = 0
    ttfts = []
    tokens = 0
    for r in records:
        ttfts.append(r["ttft"] if r["ok"] else math.inf)
        tokens += r["tokens"]
        if r["ok"]:
            tpot = (r["e2e"] - r["ttft"]) / (r["tokens"] - 1) if r["tokens"] > 1 else 0.0
            good += r["ttft"] <= ttft_slo_s and tpot <= tpot_slo_s
    return {
        "requests": len(records),
        "errors": sum(not r["ok"] for r in records),
        "slo_rps": good / duration_s,
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p95_s": percentile(ttfts, 95),
        "output_tok_s": tokens / duration_s,
        "prompt_tokens": sum(r["prompt_tokens"] for r in records),
        "cached_tokens": sum(r["cached"] for r in records),
    }


def _ms(seconds):
    return round(seconds * 1000, 1) if seconds is not None and math.isfinite(seconds) else None


def run_live(*, setup, quick: bool, progress, policies: tuple[str, ...] = ("round_robin", "llmd", "infercap")) -> dict:
    replicas = 4
    groups, per_group, system_tokens, question_tokens, output_tokens = 8, 8, 512, 64, 32
    stages = (8.0, 16.0, 24.0) if quick else (8.0, 16.0, 24.0, 32.0)
    stage_s = 8.0 if quick else 15.0
    ttft_slo_s, tpot_slo_s = setup.ttft_slo_s, setup.tpot_slo_s
    group = ProcessGroup()
    sims = []
    try:
        for _ in range(replicas):
            sims.append(
                start_replica(profile="tiny", speed=1.0, served_model_name=ENDPOINT, profile_opts=PROFILE_OPTS)
            )
        urls = [s.url for s in sims]
        key = _world(urls)
        port = free_port()
        group.spawn(uvicorn_argv("config.asgi:application", port), env=child_django_env(), port=port, timeout=60)
        base = f"http://127.0.0.1:{port}"
        progress(f"live: {replicas} simulated replicas, proxy at {base}")
        results = {}
        for index, policy in enumerate(policies):
            _set_policy(policy)
            time.sleep(1.5)  # the proxy picks up the new policy at its next snapshot poll
            rng = random.Random(f"live-{setup.seed}-{index}")
            systems = [random_text(system_tokens, rng) for _ in range(groups)]
            prompts = [s + random_text(question_tokens, rng) for s in systems for _ in range(per_group)]
            before = _generation_tokens(urls)
            stage_figures = []
            for k, qps in enumerate(stages):
                records = asyncio.run(
                    _stage(base, key, prompts, qps=qps, duration_s=stage_s, output_tokens=output_tokens, seed=k)
                )
                figures = _stage_figures(records, duration_s=stage_s, ttft_slo_s=ttft_slo_s, tpot_slo_s=tpot_slo_s)
                stage_figures.append({"qps": qps, **figures})
                progress(
                    f"live {policy} @ {qps:g} qps: {figures['slo_rps']:.1f} good req/s, TTFT p50 "
                    f"{_ms(figures['ttft_p50_s'])} ms p95 {_ms(figures['ttft_p95_s'])} ms, "
                    f"cached {figures['cached_tokens']}/{figures['prompt_tokens']} tokens"
                )
            after = _generation_tokens(urls)
            per_replica = [a - b for a, b in zip(after, before, strict=True)]
            mean = sum(per_replica) / len(per_replica)
            last = stage_figures[-1]
            prompt_tokens = sum(s["prompt_tokens"] for s in stage_figures)
            results[policy] = {
                "slo_rps": round(max(s["slo_rps"] for s in stage_figures), 2),
                "ttft_p50_ms": _ms(last["ttft_p50_s"]),
                "ttft_p95_ms": _ms(last["ttft_p95_s"]),
                "output_tok_s": round(last["output_tok_s"], 1),
                "prefix_hit_rate": round(sum(s["cached_tokens"] for s in stage_figures) / prompt_tokens, 4)
                if prompt_tokens
                else None,
                "max_over_mean_load": round(max(per_replica) / mean, 3) if mean else None,
                "errors": sum(s["errors"] for s in stage_figures),
            }
            progress(f"live {policy}: {results[policy]}")
    finally:
        group.kill_all()
        for sim in sims:
            sim.stop()
    ours = results["infercap"]

    def ratio(a, b):
        return round(a / b, 4) if a is not None and b else None

    return {
        "mode": "live",
        "workload": {
            "replicas": replicas,
            "groups": groups,
            "prompts_per_group": per_group,
            "tokens": [system_tokens, question_tokens, output_tokens],
            "stages_qps": list(stages),
            "stage_s": stage_s,
            "profile": {"base": "tiny", **PROFILE_OPTS},
        },
        "policies": results,
        "ratio_vs_round_robin": ratio(ours["slo_rps"], results["round_robin"]["slo_rps"]),
        "ratio_vs_llmd": ratio(ours["slo_rps"], results["llmd"]["slo_rps"]),
        "ttft_p50_ratio_vs_round_robin": ratio(ours["ttft_p50_ms"], results["round_robin"]["ttft_p50_ms"]),
    }
