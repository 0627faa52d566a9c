"""The prefill pool's policy: how many prefill replicas a disaggregated endpoint runs (pure: no Django, clock
injected).

A prefill replica's work is prompt tokens it computes (those its prefix cache did not hold), and its SLO is the
time to first token. So the pool scales on the computed prompt-token rate against one replica's prefill capacity in
tokens per second (from the prefill pool's MU coefficients: ``mu_per_min / (60 · alpha)``), and on the queue: a
TTFT p95 past the SLO while prompts wait adds a replica even when the rate reads as enough (long prompts queue
behind each other before the mean rate shows it). Scale down on the window's peak rate, one bounded step at a time,
never within the delay after a scale-up and never on an unread fleet. docs/disaggregation.md#autoscaling-two-pools.
"""

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class PrefillConfig:
    target_utilization: float = 0.6  # prefill queues grow fast near saturation: TTFT is its SLO, not throughput
    scale_up_window_s: float = 20.0
    scale_down_window_s: float = 300.0
    max_scale_up_step: int = 4
    max_scale_down_fraction: float = 0.2
    scale_down_delay_s: float = 300.0
    scale_down_cooldown_s: float = 30.0
    tolerance: float = 0.1

    def __post_init__(self) -> None:
        if not 0 < self.target_utilization <= 1:
            raise ValueError("target_utilization must be in (0, 1]")
        if self.max_scale_up_step < 1 or not 0 <= self.max_scale_down_fraction < 1:
            raise ValueError("scale steps must be at least 1 up and below 1 down")


@dataclass(frozen=True)
class RateSample:
    t: float
    tokens_per_s: float  # computed prompt tokens per second across the pool over the last scrape interval


@dataclass(frozen=True)
class PrefillInputs:
    now: float
    samples: Sequence[RateSample]
    ready: int
    starting: int
    min_replicas: int = 1
    max_replicas: int = 4
    # One replica's prefill capacity in computed prompt tokens per second; None when unknown (no coefficients).
    tokens_per_s_per_replica: float | None = None
    ttft_p95_ms: float | None = None
    ttft_slo_ms: float = 2000.0
    waiting: float = 0.0  # prompts queued across the ready prefill replicas
    last_scale_up_at: float | None = None
    last_scale_down_at: float | None = None
    scraped: int = 0  # ready replicas whose /metrics answered this tick


@dataclass(frozen=True)
class PrefillDecision:
    current: int
    desired: int
    reason: str
    inputs: dict = field(default_factory=dict)


def tokens_per_s_capacity(*, mu_per_min: float, alpha: float) -> float | None:
    """Computed prompt tokens per second one replica prefills at its SLO-compliant maximum load."""
    if not (0 < alpha < math.inf and 0 < mu_per_min < math.inf):
        return None
    return mu_per_min / 60.0 / alpha


def _peak(samples: Sequence[RateSample], *, now: float, seconds: float) -> float:
    return max((s.tokens_per_s for s in samples if now - seconds <= s.t <= now), default=0.0)


def decide(inputs: PrefillInputs, cfg: PrefillConfig = PrefillConfig()) -> PrefillDecision:
    current = inputs.ready + inputs.starting
    floor, ceiling = max(0, inputs.min_replicas), max(0, inputs.max_replicas)
    floor = min(max(floor, 1), ceiling)  # a disaggregated endpoint keeps one prefill replica (else no fast path)
    capacity = inputs.tokens_per_s_per_replica
    up_rate = _peak(inputs.samples, now=inputs.now, seconds=cfg.scale_up_window_s)
    down_rate = _peak(inputs.samples, now=inputs.now, seconds=cfg.scale_down_window_s)
    usable = capacity is not None and capacity > 0
    up_need = up_rate / (capacity * cfg.target_utilization) if usable else 0.0
    down_need = down_rate / (capacity * cfg.target_utilization) if usable else 0.0
    over_slo = inputs.ttft_p95_ms is not None and inputs.ttft_p95_ms > inputs.ttft_slo_ms
    slow = over_slo and inputs.waiting >= max(1, inputs.ready)  # a queue on every replica, not one straggler
    record = {
        "ready": inputs.ready,
        "starting": inputs.starting,
        "tokens_per_s_20s": round(up_rate, 1),
        "tokens_per_s_5min": round(down_rate, 1),
        "tokens_per_s_per_replica": None if capacity is None else round(capacity, 1),
        "up_need": round(up_need, 3),
        "down_need": round(down_need, 3),
        "ttft_p95_ms": None if inputs.ttft_p95_ms is None else round(inputs.ttft_p95_ms, 1),
        "ttft_slo_ms": inputs.ttft_slo_ms,
        "waiting": inputs.waiting,
        "scraped": inputs.scraped,
        "floor": floor,
        "max_replicas": ceiling,
        "config": asdict(cfg),
    }

    def result(desired: int, reason: str) -> PrefillDecision:
        return PrefillDecision(current=current, desired=desired, reason=reason, inputs=record)

    if current < floor:
        return result(floor, "below the prefill pool's floor")
    if current > ceiling:
        return result(ceiling, "above the prefill pool's max replicas")
    wanted = math.ceil(up_need) if up_need > current * (1 + cfg.tolerance) else current
    why = f"prompt tokens need {up_need:.2f} replicas"
    if slow and inputs.starting == 0 and wanted <= current:
        wanted, why = (
            current + 1,
            f"TTFT p95 {inputs.ttft_p95_ms:.0f} ms over the SLO with {inputs.waiting:.0f} waiting",
        )
    if wanted > current:
        desired = min(wanted, ceiling, current + cfg.max_scale_up_step)
        if desired > current:
            return result(desired, f"scale up: {why}")
        return result(current, f"hold: at max replicas ({why})")
    if inputs.starting and up_need > inputs.ready * (1 + cfg.tolerance):
        return result(current, "hold: starting prefill replicas cover the prompt rate")
    target_down = max(math.ceil(down_need), floor)
    if target_down < current and down_need < current * (1 - cfg.tolerance) and not over_slo:
        if not usable or inputs.scraped < inputs.ready:
            return result(current, "hold: the pool's metrics were not all read")
        if inputs.last_scale_up_at is not None and inputs.now - inputs.last_scale_up_at < cfg.scale_down_delay_s:
            return result(current, "hold: scale-down delay after a scale-up")
        if (
            inputs.last_scale_down_at is not None
            and inputs.now - inputs.last_scale_down_at < cfg.scale_down_cooldown_s
        ):
            return result(current, "hold: cooling down after a scale-down")
        step = max(1, math.floor(current * cfg.max_scale_down_fraction))
        return result(max(target_down, current - step), f"scale down: 5-min peak needs {down_need:.2f} replicas")
    return result(current, "hold: within tolerance")
