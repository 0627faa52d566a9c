"""The same closed-loop load on a real vLLM engine (over HTTP) and on the simulator's engine (in virtual time), and
the figures ``bench fidelity`` compares: throughput, TTFT p50/p90, TPOT p50 and prefix-cache hit rate.

Prompts are token ids (vLLM's ``/v1/completions`` takes them), so a shape's token counts and its shared prefix are
exact on both sides whatever the model's tokenizer; every request is streamed, so each one has a TTFT and a TPOT.
"""

from __future__ import annotations

import asyncio
import heapq
import os
import random
import statistics
import time
from dataclasses import dataclass

from capacity.replica_benchmark.http_driver import HttpReplicaDriver
from capacity.replica_benchmark.sweep import BenchmarkError, Sample, Shape, output_lengths, percentile, summarize
from endpoints.runtimes.sim.engine import Engine, Sequence
from endpoints.runtimes.sim.profiles import EngineProfile
from endpoints.runtimes.sim.tokens import BLOCK_SIZE_TOKENS

FIRST_ID = 3  # ids 0-2 are the tiny model's BOS, EOS and padding


@dataclass(frozen=True)
class LoadPoint:
    """One closed-loop load: ``concurrency`` requests of ``shape`` in flight until ``requests`` have finished.
    With ``prefix_groups`` > 1 the shared prefix is one of that many (request i takes prefix i mod groups): a mix of
    conversations, each with its own system prompt."""

    shape: Shape
    concurrency: int
    requests: int
    prefix_groups: int = 1

    @property
    def label(self) -> str:
        groups = f"×{self.prefix_groups}g" if self.prefix_groups > 1 else ""
        return f"{self.shape.label}{groups} c{self.concurrency}"


def prompt_ids(shape: Shape, *, run_id: str, index: int, vocab_size: int, prefix_groups: int = 1) -> list[int]:
    """The token ids of request ``index`` of a run: a shared prefix (per group) and then its own tokens."""
    prefix_len = min(shape.shared_prefix_tokens, shape.input_tokens)
    shared = random.Random(f"{run_id}-prefix-{index % max(1, prefix_groups)}")
    own = random.Random(f"{run_id}-{index}")
    ids = [shared.randrange(FIRST_ID, vocab_size) for _ in range(prefix_len)]
    return ids + [own.randrange(FIRST_ID, vocab_size) for _ in range(shape.input_tokens - prefix_len)]


def grain_hashes(ids: list[int]) -> list[int]:
    """The simulator's prefix-cache hashes of a token-id prompt: one per full 16-token grain, chained (a grain's
    hash names the whole prefix up to it), as ``tokens.block_hashes`` hashes text."""
    out, parent = [], 0
    for start in range(0, len(ids) - BLOCK_SIZE_TOKENS + 1, BLOCK_SIZE_TOKENS):
        parent = hash((parent, tuple(ids[start : start + BLOCK_SIZE_TOKENS])))
        out.append(parent)
    return out


class TokenPromptDriver(HttpReplicaDriver):
    """``benchmark_replica``'s HTTP driver (``replica_benchmark.http_driver``) with exact token-id prompts and every
    request streamed; a ``replica_benchmark.sweep.LoadDriver``, so ``run_sweep`` calibrates with it."""

    name = "http-token-ids"

    def __init__(self, url: str, *, model: str, vocab_size: int, **kwargs):
        super().__init__(url, model=model, **kwargs)
        self.vocab_size = vocab_size

    def run(self, shape: Shape, concurrency: int, requests: int, run_id: str, prefix_groups: int = 1) -> list[Sample]:
        def prompt(index: int) -> list[int]:
            return prompt_ids(
                shape, run_id=run_id, index=index, vocab_size=self.vocab_size, prefix_groups=prefix_groups
            )

        return asyncio.run(
            self.closed_loop(
                concurrency=concurrency,
                outputs=output_lengths(shape, requests, run_id),
                prompt=prompt,
                streamed=lambda index: True,
            )
        )


class Recorder:
    """A ``LoadDriver`` that keeps every run another one makes (its load, run id and samples): ``run_sweep``'s
    levels, fit shapes and grid become the profile fit's data, and the run id replays the same prompts and output
    lengths in the simulator."""

    def __init__(self, driver):
        self.driver = driver
        self.name = driver.name
        self.runs: list[tuple[LoadPoint, str, list[Sample]]] = []

    def run(self, shape: Shape, concurrency: int, requests: int, run_id: str) -> list[Sample]:
        samples = self.driver.run(shape, concurrency, requests, run_id)
        self.runs.append((LoadPoint(shape, concurrency, requests), run_id, samples))
        return samples


def simulate_point(
    profile: EngineProfile, point: LoadPoint, *, run_id: str, client_gap_s: float = 0.0, frontend_s: float = 0.0
) -> list[Sample]:
    """The point's closed loop on the simulator's engine in virtual time, with the prompts and output lengths the
    engine gets. A finished request's successor is sent ``client_gap_s`` later (the client's turnaround) and
    reaches the scheduler ``frontend_s`` after that (vLLM's API server: HTTP, request processing, the hop to the
    engine core), at whose next step it is taken in; its TTFT counts from the send, as the client's does."""
    engine = Engine(profile)
    shape, n = point.shape, point.requests
    outputs = output_lengths(shape, n, run_id)
    arrivals: list[tuple[float, int, float]] = [(frontend_s, i, 0.0) for i in range(min(point.concurrency, n))]
    issued = len(arrivals)
    samples: list[Sample] = []
    now = 0.0
    while len(samples) < n:
        while arrivals and arrivals[0][0] <= now:
            _, index, sent = heapq.heappop(arrivals)
            ids = prompt_ids(
                shape, run_id=run_id, index=index, vocab_size=profile.vocab_size, prefix_groups=point.prefix_groups
            )
            engine.add(Sequence(f"{run_id}-{index}", len(ids), outputs[index], grain_hashes(ids), arrival_s=sent))
        plan = engine.plan(now, 1)
        if plan is None:
            if not arrivals:
                raise BenchmarkError("the simulated engine went idle with requests outstanding")
            now = arrivals[0][0]
            continue
        now += plan.duration()
        for seq in engine.commit(plan, plan.steps, now):
            samples.append(
                Sample(seq.arrival_s, now, seq.first_token_s, seq.prompt_tokens, seq.cached_tokens, seq.generated)
            )
            if issued < n:
                heapq.heappush(arrivals, (now + client_gap_s + frontend_s, issued, now + client_gap_s))
                issued += 1
    return samples


METRICS = ("throughput_tok_s", "ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "prefix_hit_rate")


def point_stats(point: LoadPoint, samples: list[Sample]) -> dict[str, float | None]:
    """The compared figures of one run: output tok/s, TTFT and TPOT over the steady window (``summarize``'s: the
    first and last ``concurrency`` finishes are ramp-up and drain), prefix hit rate over every request."""
    stats = summarize(point.shape, point.concurrency, samples)
    ok = sorted((s for s in samples if s.ok), key=lambda s: s.end_s)
    n, c = len(ok), point.concurrency
    window = ok[c : n - c] if n >= 3 * c else ok
    ttfts = [s.first_token_s - s.start_s for s in window if s.first_token_s is not None]
    tpots = [
        (s.end_s - s.first_token_s) / (s.output_tokens - 1)
        for s in window
        if s.first_token_s is not None and s.output_tokens > 1
    ]
    prompt = sum(s.prompt_tokens for s in ok)
    return {
        "throughput_tok_s": stats.aggregate_tok_s,
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p90_s": percentile(ttfts, 90),
        "tpot_p50_s": statistics.median(tpots) if tpots else None,
        "prefix_hit_rate": sum(s.cached_tokens for s in ok) / prompt if prompt else None,
    }


class CpuMeter:
    """Who used this machine's CPUs during a run (Linux ``/proc``): the engine's processes (its process group),
    this process, and everything else: the evidence when a shared machine's neighbours disturb a measurement."""

    def __init__(self, engine_pgid: int | None = None):
        self.engine_pgid = engine_pgid
        self.tick = os.sysconf("SC_CLK_TCK")

    def _busy_ticks(self) -> float:
        with open("/proc/stat") as fh:
            fields = [float(v) for v in fh.readline().split()[1:]]
        return sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0.0)  # all but idle and iowait

    def _group_ticks(self) -> float:
        total = 0.0
        if self.engine_pgid is None:
            return total
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == self.engine_pgid:  # pgrp
                total += float(fields[11]) + float(fields[12])  # utime + stime
        return total

    def __enter__(self) -> CpuMeter:
        self._wall = time.monotonic()
        self._busy, self._engine, self._own = self._busy_ticks(), self._group_ticks(), sum(os.times()[:2])
        return self

    def __exit__(self, *exc) -> None:
        wall = max(time.monotonic() - self._wall, 1e-9)
        busy = (self._busy_ticks() - self._busy) / self.tick
        engine = (self._group_ticks() - self._engine) / self.tick
        own = sum(os.times()[:2]) - self._own
        self.figures = {
            "cpus": os.cpu_count(),
            "busy_cores": round(busy / wall, 2),
            "engine_cores": round(engine / wall, 2) if self.engine_pgid is not None else None,
            "others_cores": round(max(0.0, busy - engine - own) / wall, 2) if self.engine_pgid is not None else None,
            "load_average_1m": round(os.getloadavg()[0], 2),
        }
