"""Workload generators shared by benchmarks and tests (pure, deterministic for a seed).

Each generator yields ``SimRequest`` objects in arrival order (the discrete-event runner reads them lazily).
Prompts are built with ``tokens.filler_text`` so token counts are exact (4 characters per token). Arrival
processes: ``poisson_times``, ``constant_times``, ``staged_poisson_times`` (rising QPS stages) and
``bursty_times`` (diurnal cycle, 10× spikes, near-zero nights). Shapes: ``shared_prefix`` (llm-d's benchmark),
``multi_turn`` (sessions whose next turn follows the previous answer after a think time), ``bursty``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from simulator.tokens import BLOCK_CHARS, block_hashes, filler_text, output_text

_PREFIX_CHAINS: dict[tuple[str, str | None], list[int]] = {}


@dataclass(eq=False)
class SimRequest:
    request_id: str
    arrival_s: float
    prompt_parts: tuple[str, ...]  # concatenated into the prompt; a block-aligned first part is hashed once
    output_tokens: int
    priority: int = 0  # vLLM priority: lower is served first
    priority_class: str = "standard"  # critical | standard | sheddable
    tenant: str = "default"
    session_id: str | None = None
    cache_salt: str | None = None
    followup: Callable[[object], SimRequest | None] | None = None  # next turn, from this one's RequestResult
    adapter: str | None = None  # the LoRA adapter it names as its model (Simulation(lora=…))
    extra: dict = field(default_factory=dict)

    @property
    def prompt_text(self) -> str:
        return "".join(self.prompt_parts)

    @property
    def prompt_tokens(self) -> int:
        return -(-sum(len(part) for part in self.prompt_parts) // 4)

    def block_hashes(self) -> list[int]:
        head = self.prompt_parts[0] if self.prompt_parts else ""
        if len(self.prompt_parts) > 1 and head and len(head) % BLOCK_CHARS == 0:
            key = (head, self.cache_salt)
            chain = _PREFIX_CHAINS.get(key)
            if chain is None:
                if len(_PREFIX_CHAINS) > 4096:
                    _PREFIX_CHAINS.clear()
                chain = _PREFIX_CHAINS[key] = block_hashes(head, salt=self.cache_salt)
            rest = "".join(self.prompt_parts[1:])
            parent = chain[-1] if chain else None
            return chain + block_hashes(rest, salt=self.cache_salt, parent=parent)
        return block_hashes(self.prompt_text, salt=self.cache_salt)


# -- arrival processes ---------------------------------------------------------------------------------
def poisson_times(
    rate_per_s: float,
    *,
    count: int | None = None,
    duration_s: float | None = None,
    start_s: float = 0.0,
    seed: int = 0,
) -> Iterator[float]:
    rng = random.Random(f"poisson-{seed}")
    t, n = start_s, 0
    while (count is None or n < count) and rate_per_s > 0:
        t += rng.expovariate(rate_per_s)
        if duration_s is not None and t >= start_s + duration_s:
            return
        n += 1
        yield t


def constant_times(rate_per_s: float, *, count: int, start_s: float = 0.0) -> Iterator[float]:
    for i in range(count):
        yield start_s + i / rate_per_s


def staged_poisson_times(stages: Iterable[tuple[float, float]], *, seed: int = 0) -> Iterator[float]:
    """Rising QPS stages: ``[(qps, duration_s), ...]`` back to back, Poisson within each."""
    start = 0.0
    for i, (qps, duration) in enumerate(stages):
        yield from poisson_times(qps, duration_s=duration, start_s=start, seed=seed * 1000 + i)
        start += duration


def diurnal_rate(
    t: float,
    *,
    peak_qps: float,
    day_s: float,
    night_fraction: float = 0.02,
    spikes: Iterable[tuple[float, float]] = (),
    spike_factor: float = 10.0,
    spike_ramp_s: float = 2.0,
) -> float:
    """Request rate at time t: a raised-cosine day (trough ``night_fraction``·peak at t = 0, peak at day_s/2),
    times ``spike_factor`` inside each spike ``(start_s, length_s)``, reached within ``spike_ramp_s``."""
    phase = (1 - math.cos(2 * math.pi * t / day_s)) / 2
    rate = peak_qps * (night_fraction + (1 - night_fraction) * phase**2)
    for start, length in spikes:
        if start <= t < start + length:
            ramp = min(1.0, (t - start) / spike_ramp_s) if spike_ramp_s > 0 else 1.0
            rate *= 1 + (spike_factor - 1) * ramp
    return rate


def bursty_times(
    *,
    duration_s: float,
    peak_qps: float,
    day_s: float | None = None,
    spikes: int = 3,
    spike_s: float = 20.0,
    spike_factor: float = 10.0,
    night_fraction: float = 0.02,
    seed: int = 0,
) -> tuple[Iterator[float], Callable[[float], float]]:
    """Non-homogeneous Poisson arrivals (thinning) over the diurnal rate with random spikes.

    Spikes are multiplied onto the current diurnal rate (10× within ~2 s by default). Returns (times, rate_fn).
    """
    rng = random.Random(f"bursty-{seed}")
    day = day_s or duration_s
    windows = sorted((rng.uniform(0.1, 0.9) * duration_s, spike_s) for _ in range(spikes))

    def rate_fn(t: float) -> float:
        return diurnal_rate(
            t, peak_qps=peak_qps, day_s=day, night_fraction=night_fraction, spikes=windows, spike_factor=spike_factor
        )

    bound = peak_qps * spike_factor

    def times() -> Iterator[float]:
        t = 0.0
        while True:
            t += rng.expovariate(bound)
            if t >= duration_s:
                return
            if rng.random() * bound <= rate_fn(t):
                yield t

    return times(), rate_fn


# -- request shapes ------------------------------------------------------------------------------------
def shared_prefix(
    *,
    groups: int = 32,
    prompts_per_group: int = 32,
    system_tokens: int = 2048,
    question_tokens: int = 256,
    output_tokens: int = 256,
    times: Iterable[float] | None = None,
    qps: float = 10.0,
    count: int | None = None,
    tenants: int = 1,
    seed: int = 0,
) -> Iterator[SimRequest]:
    """llm-d's shared-prefix benchmark: each request takes a random group's system prompt and one of that
    group's questions (so whole prompts recur too), and asks for a fixed-length output."""
    rng = random.Random(f"shared-prefix-{seed}")
    systems = [filler_text(system_tokens, seed=f"sys-{seed}-{g}") for g in range(groups)]
    questions = [
        [filler_text(question_tokens, seed=f"q-{seed}-{g}-{p}") for p in range(prompts_per_group)]
        for g in range(groups)
    ]
    if times is None:
        times = poisson_times(qps, count=count if count is not None else groups * prompts_per_group, seed=seed)
    for i, t in enumerate(times):
        if count is not None and i >= count:
            return
        g = rng.randrange(groups)
        p = rng.randrange(prompts_per_group)
        yield SimRequest(
            request_id=f"sp-{i}",
            arrival_s=t,
            prompt_parts=(systems[g], questions[g][p]),
            output_tokens=output_tokens,
            tenant=f"tenant-{i % tenants}",
            extra={"group": g},
        )


def uniform(
    *,
    times: Iterable[float],
    prompt_tokens: int | tuple[int, int] = 512,
    output_tokens: int | tuple[int, int] = 128,
    tenants: int = 1,
    seed: int = 0,
    prefix: str = "u",
) -> Iterator[SimRequest]:
    """Independent prompts (no shared prefix) with fixed or uniformly drawn lengths."""
    rng = random.Random(f"uniform-{seed}")

    def draw(spec):
        return rng.randint(*spec) if isinstance(spec, tuple) else spec

    for i, t in enumerate(times):
        yield SimRequest(
            request_id=f"{prefix}-{i}",
            arrival_s=t,
            prompt_parts=(filler_text(draw(prompt_tokens), seed=f"{prefix}-{seed}-{i}"),),
            output_tokens=draw(output_tokens),
            tenant=f"tenant-{i % tenants}",
        )


def bursty(
    *,
    duration_s: float = 3600.0,
    peak_qps: float = 5.0,
    day_s: float | None = None,
    spikes: int = 3,
    spike_s: float = 20.0,
    prompt_tokens: tuple[int, int] = (200, 800),
    output_tokens: tuple[int, int] = (50, 300),
    seed: int = 0,
) -> tuple[Iterator[SimRequest], Callable[[float], float]]:
    """The autoscaling trace: diurnal cycle + 10× spikes within seconds + near-zero nights. Returns
    (requests, rate_fn) so benchmarks can plot the offered rate."""
    times, rate_fn = bursty_times(
        duration_s=duration_s, peak_qps=peak_qps, day_s=day_s, spikes=spikes, spike_s=spike_s, seed=seed
    )
    return uniform(
        times=times, prompt_tokens=prompt_tokens, output_tokens=output_tokens, seed=seed, prefix="burst"
    ), rate_fn


def multi_turn(
    *,
    sessions: int = 50,
    turns: int = 5,
    session_rate_per_s: float = 1.0,
    system_tokens: int = 512,
    user_tokens: int = 64,
    output_tokens: int = 128,
    think_time_s: float = 5.0,
    seed: int = 0,
) -> Iterator[SimRequest]:
    """Chat sessions: turn k+1 arrives ``think_time_s`` (exponential) after turn k finished (or was rejected),
    with the whole conversation so far as its prompt, so each turn extends the previous prompt's prefix."""
    rng = random.Random(f"multi-turn-{seed}")
    system = filler_text(system_tokens, seed=f"mt-system-{seed}")

    def turn(session: str, k: int, history: str, at: float) -> SimRequest:
        user = filler_text(user_tokens, seed=f"mt-{seed}-{session}-{k}")
        request = SimRequest(
            request_id=f"{session}-t{k}",
            arrival_s=at,
            prompt_parts=(system, history + user),
            output_tokens=output_tokens,
            session_id=session,
        )
        if k + 1 < turns:

            def followup(result, _request=request, _history=history + user) -> SimRequest | None:
                answer = output_text(0, result.output_tokens or 0)
                return turn(session, k + 1, _history + answer, result.finish_s + rng.expovariate(1 / think_time_s))

            request.followup = followup
        return request

    for i, t in enumerate(poisson_times(session_rate_per_s, count=sessions, seed=seed)):
        yield turn(f"s{i}", 0, "", t)
