"""``bench sim``: the simulator's own figures — profile fit, prefix-cache TTFT ratio, DES speed, determinism.

- ``profile_fit``: per-stream decode tok/s of the default profile at batch 16 / 64 / 128 (500-token prompts,
  300-token outputs), under ``profile_roofline_tok_s``, the most its GPU's memory bandwidth allows at those batches
  (``profile_within_roofline``); next to it the worked example's illustrative 13B table (105 / 68 / 44,
  docs/algorithms.md#the-worked-example), which no A100 reaches, and the relative error;
- ``prefix_ttft_ratio``: TTFT of a request whose 2,000-token prefix is cached / TTFT of the same-length cold
  one (engine in virtual time; with ``--live`` over HTTP against a replica process, in wall time);
- ``des_requests_per_s``: simulated requests completed per wall-clock second, 10,000 shared-prefix requests
  over 8 replicas, routed by the platform's llm-d router (``--opt router=round_robin`` etc.), and
  ``des_requests_per_cpu_s``, the same per CPU-second of this process (steadier on a shared machine);
- ``deterministic``: two runs with one seed give identical per-request outcomes (and another seed does not).

``--plot F.svg`` draws per-stream tok/s against batch size for the profile and its roofline, with the table's
points.
"""

from __future__ import annotations

import time

import httpx

from capacity.hardware.profiles import ROOFLINES, get_profile
from capacity.hardware.roofline import decode_floor_s
from gateway.routing import make_router
from simulator import workloads
from simulator.calibration import decode_tok_s_per_stream, profile_fit
from simulator.des import Simulation
from simulator.engine import Engine, Sequence
from simulator.process import start_replica
from simulator.tokens import block_hashes, count_tokens, filler_text

TABLE_13B = {16: 105.0, 64: 68.0, 128: 44.0}
SMOKE = {"requests": "500"}  # --smoke: 500 DES requests, not 10,000
CONTEXT_PER_SEQ = 650  # mean context of a sequence in profile_fit's window: 500-token prompts, 300-token outputs


def roofline_tok_s(profile_name: str, batch: int) -> float | None:
    """Per-stream decode tok/s at the roofline: one token per step at the floor's step time; None without one."""
    line = ROOFLINES.get(profile_name)
    if line is None:
        return None
    floor = decode_floor_s(
        line.model, line.accelerator, batch=batch, context_tokens=batch * CONTEXT_PER_SEQ, gpus=line.gpus
    )
    return 1 / floor


def _router(name: str, seed: int):
    return make_router(name, seed=seed)


def prefix_ttft_virtual(profile_name: str | None = None, prefix_tokens: int = 2000) -> tuple[float, float]:
    """(cold TTFT, warm TTFT) in simulated seconds for two requests sharing a ``prefix_tokens`` prefix."""
    engine = Engine(get_profile(profile_name))
    prefix = filler_text(prefix_tokens, seed="bench-prefix")
    ttfts = []
    now = 0.0
    for i in range(2):
        text = prefix + filler_text(32, seed=f"bench-question-{i}")
        seq = engine.add(Sequence(f"p{i}", count_tokens(text), 8, block_hashes(text), arrival_s=now))
        start = now
        while (plan := engine.plan(now, 1 << 30)) is not None:
            now += plan.duration()
            engine.commit(plan, plan.steps, now)
        ttfts.append(seq.first_token_s - start)
    return ttfts[0], ttfts[1]


def prefix_ttft_live(prefix_tokens: int = 2000) -> tuple[float, float]:
    """The same over HTTP: a replica process at speed 1, time to the first SSE data frame, in wall seconds."""
    prefix = filler_text(prefix_tokens, seed="bench-prefix")
    out = []
    with start_replica(profile=None, speed=1.0) as replica, httpx.Client(timeout=60) as client:
        for i in range(2):
            body = {
                "model": "llama-13b",
                "prompt": prefix + filler_text(32, seed=f"q{i}"),
                "max_tokens": 4,
                "stream": True,
            }
            started = time.perf_counter()
            with client.stream("POST", f"{replica.url}/v1/completions", json=body) as response:
                next(line for line in response.iter_lines() if line.startswith("data: "))
                out.append(time.perf_counter() - started)
    return out[0], out[1]


def des_speed(*, requests: int, replicas: int, router: str, seed: int = 1) -> tuple[float, object]:
    sim = Simulation(router=_router(router, seed), replicas=replicas, seed=seed)
    started, cpu_started = time.perf_counter(), time.process_time()
    result = sim.run(workloads.shared_prefix(count=requests, qps=40.0, seed=seed))
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    return len(result.completed()) / wall, len(result.completed()) / cpu, result


def determinism(*, requests: int, router: str) -> bool:
    digests = []
    for seed in (7, 7, 8):
        sim = Simulation(router=_router(router, seed), replicas=4, seed=seed)
        digests.append(sim.run(workloads.shared_prefix(count=requests, qps=30.0, seed=seed)).digest())
    return digests[0] == digests[1] != digests[2]


def run(*, quick: bool, plot: str | None = None, live: bool = False, progress=print, **opts) -> dict:
    router = opts.get("router", "llmd")
    des_requests = int(opts.get("requests", 10_000))
    profile = get_profile(opts.get("profile"))
    progress(f"profile fit of {profile.name}")
    fit = profile_fit(profile)
    errors = {b: round(fit[b] / TABLE_13B[b] - 1, 4) for b in TABLE_13B}
    ceiling = {b: _round(roofline_tok_s(profile.name, b)) for b in fit}
    progress("prefix TTFT, virtual time" + (" and live" if live else ""))
    cold, warm = prefix_ttft_virtual(profile.name)
    figures: dict = {
        "profile": profile.name,
        "profile_fit": fit,
        "profile_fit_table": TABLE_13B,
        "profile_fit_rel_error": errors,
        "profile_roofline_tok_s": ceiling,
        "profile_within_roofline": None if None in ceiling.values() else all(fit[b] < ceiling[b] for b in fit),
        "prefix_ttft_ratio": round(warm / cold, 4),
        "prefix_ttft_cold_s": round(cold, 4),
        "prefix_ttft_warm_s": round(warm, 4),
    }
    if live:
        live_cold, live_warm = prefix_ttft_live()
        figures["prefix_ttft_ratio_live"] = round(live_warm / live_cold, 4)
    progress(f"DES: {des_requests} shared-prefix requests over 8 replicas, router {router}")
    rate, cpu_rate, result = des_speed(requests=des_requests, replicas=8, router=router)
    figures["des_requests_per_s"] = round(rate, 1)
    # Per CPU-second too: on a shared machine the wall-clock figure mostly measures the neighbours.
    figures["des_requests_per_cpu_s"] = round(cpu_rate, 1)
    figures["des_wall_s"] = round(result.wall_s, 2)
    figures["des_summary"] = result.summary()
    progress("determinism: two runs with one seed, one with another")
    figures["deterministic"] = determinism(requests=500 if quick else 2000, router=router)
    if plot:
        batches = [1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 160, 192, 256]
        curve = [(b, decode_tok_s_per_stream(profile, b)) for b in batches]
        ceiling_curve = [(b, v) for b in batches if (v := roofline_tok_s(profile.name, b)) is not None]
        _write_svg(plot, curve, TABLE_13B, profile.name, ceiling_curve)
        progress(f"wrote {plot}")
    return figures


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _write_svg(
    path: str, curve: list[tuple[int, float]], table: dict[int, float], name: str, ceiling: list[tuple[int, float]]
) -> None:
    width, height, pad = 640, 400, 50
    xmax = max(b for b, _ in curve)
    ymax = max(v for _, v in curve + ceiling + list(table.items())) * 1.1

    def xy(b: float, v: float) -> tuple[float, float]:
        return pad + (width - 2 * pad) * b / xmax, height - pad - (height - 2 * pad) * v / ymax

    points = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(b, v) for b, v in curve))
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
        'font-size="12">',
        f'<text x="{pad}" y="20">{name}: per-stream decode tok/s vs batch size (line: simulator; dashed: '
        "roofline; dots: the worked example's 13B table)</text>",
        f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" stroke="black"/>',
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="black"/>',
        f'<polyline fill="none" stroke="steelblue" stroke-width="2" points="{points}"/>',
    ]
    if ceiling:
        roof = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(b, v) for b, v in ceiling))
        parts.append(f'<polyline fill="none" stroke="gray" stroke-dasharray="6 4" points="{roof}"/>')
    for b, v in table.items():
        x, y = xy(b, v)
        parts.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="crimson"><title>B={b}: {v} tok/s</title></circle>'
        )
    for b in (0, 64, 128, 192, 256):
        x, _ = xy(b, 0)
        parts.append(f'<text x="{x:.1f}" y="{height - pad + 16}" text-anchor="middle">{b}</text>')
    for v in range(0, int(ymax) + 1, 25):
        _, y = xy(0, v)
        parts.append(f'<text x="{pad - 6}" y="{y + 4:.1f}" text-anchor="end">{v}</text>')
    parts.append("</svg>")
    with open(path, "w") as fh:
        fh.write("\n".join(parts))
