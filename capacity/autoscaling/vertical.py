"""The vertical policy: each endpoint's per-replica concurrency limit (pure: no Django).

Every 30 s the limit moves within [min, max] from TTFT/TPOT p95 against the SLO, KV-cache usage and the replica
queue: it decreases fast on overload and increases slowly when healthy, but only once a signal has stayed across
its threshold for several cycles (one noisy p95 must not move it), and never by more than a bounded fraction per
cycle. Its output is the horizontal policy's ``target_concurrency`` and the proxy's replica slots.
"""

import functools
import hashlib
import math
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class VerticalConfig:
    # Overload when any signal is above its high mark; healthy when all are below their low marks.
    latency_high: float = 1.0  # p95 / SLO
    ttft_low: float = 0.5
    tpot_low: float = 0.7
    kv_high: float = 0.92
    kv_low: float = 0.75
    queue_high: float = 4.0  # requests waiting inside a replica (vLLM's own queue), per replica
    queue_low: float = 1.0
    # Raise the limit only on evidence from a loaded fleet: replicas running at least this share of the limit. A
    # fleet healthy at a batch well below its limit says nothing of the limit itself, yet the horizontal axis sizes the
    # fleet to run target_utilization of whatever the limit becomes. At 0.3 (chosen on compressed days, against a
    # night at one replica walking the limit to its maximum), a real-length day walked the limit 64 → 232 on replicas
    # running 40 % of it; the fleet was then shrunk to run batches no replica had shown it could, overloaded within a
    # cold start, cut, and grew again: a saw-tooth that missed the SLO through the plateau hours
    # (docs/experiments/autoscaling.md, 2026-12-06, training seed 1: 0.914 attainment outside the spikes).
    increase_min_busy: float = 0.7
    # Cut after three overloaded cycles (90 s), not two: in a spike the replicas run at their limit, over the SLO,
    # until the replicas ordered for it start (60-120 s); cutting on that overload, which the horizontal axis is
    # already fixing, left the limit low for the rest of the day and the fleet sized for too few sequences a replica
    # (docs/algorithms.md#autoscaling-evaluation: on trace seeds 2-6's held-out days, never seed 1's, 52.2 GPU-hours
    # at a mean attainment of 0.880 against 57.9 at 0.870 with two cycles).
    overload_cycles: int = 3
    # An overload that replica-side TTFT alone shows needs 4 min (more than the longest cold start): a replica
    # fresh from its cold start is handed the proxy's backlog at once, a limit's worth of prompts prefilled back to
    # back (91 × 0.16 s ≈ 15 s on the A100 profile), while replicas running too many sequences show it in TPOT, the
    # KV cache or their own queue. Cutting on the backlog left the limit at 45-64 for hours after a spike, or after a
    # scale-up on a plateau (docs/experiments/autoscaling.md, 2026-12-06).
    ttft_only_overload_cycles: int = 8
    healthy_cycles: int = 3
    decrease_factor: float = 0.7
    increase_fraction: float = 0.125
    max_change_fraction: float = 0.3

    def __post_init__(self) -> None:
        if not 0 < self.decrease_factor < 1:
            raise ValueError("decrease_factor must be in (0, 1)")
        if min(self.overload_cycles, self.healthy_cycles, self.ttft_only_overload_cycles) < 1:
            raise ValueError("cycle counts must be at least 1")


@dataclass(frozen=True)
class VerticalState:
    """Consecutive cycles each way; persisted between ticks (the services keep it with the decision)."""

    overload_streak: int = 0
    healthy_streak: int = 0


@dataclass(frozen=True)
class VerticalInputs:
    current_limit: int
    min_limit: int
    max_limit: int
    ttft_slo_ms: float
    tpot_slo_ms: float
    ttft_p95_ms: float | None = None  # None: no requests finished in the window
    tpot_p95_ms: float | None = None
    kv_usage: float | None = None  # highest replica's vllm:kv_cache_usage_perc
    waiting_per_replica: float | None = None  # mean vllm:num_requests_waiting
    busy_fraction: float | None = None  # mean requests running per replica / current limit
    state: VerticalState = field(default_factory=VerticalState)


@dataclass(frozen=True)
class VerticalDecision:
    current: int
    desired: int
    reason: str
    state: VerticalState
    inputs: dict = field(default_factory=dict)


def classify(inputs: VerticalInputs, cfg: VerticalConfig) -> tuple[str, list[str]]:
    """'overload', 'healthy' or 'neutral', with the signals that made it so."""
    ratios = {}
    if inputs.ttft_p95_ms is not None:
        ratios["ttft"] = inputs.ttft_p95_ms / inputs.ttft_slo_ms
    if inputs.tpot_p95_ms is not None:
        ratios["tpot"] = inputs.tpot_p95_ms / inputs.tpot_slo_ms
    over = [f"{name} p95 at {r:.0%} of SLO" for name, r in ratios.items() if r > cfg.latency_high]
    if inputs.kv_usage is not None and inputs.kv_usage > cfg.kv_high:
        over.append(f"kv usage {inputs.kv_usage:.0%}")
    if inputs.waiting_per_replica is not None and inputs.waiting_per_replica > cfg.queue_high:
        over.append(f"{inputs.waiting_per_replica:.1f} waiting per replica")
    if over:
        return "overload", over
    if not ratios:
        return "neutral", ["no latency samples"]
    healthy = (
        ratios.get("ttft", 0.0) < cfg.ttft_low
        and ratios.get("tpot", 0.0) < cfg.tpot_low
        and (inputs.kv_usage is None or inputs.kv_usage < cfg.kv_low)
        and (inputs.waiting_per_replica is None or inputs.waiting_per_replica < cfg.queue_low)
    )
    if not healthy:
        return "neutral", ["between thresholds"]
    if inputs.busy_fraction is not None and inputs.busy_fraction < cfg.increase_min_busy:
        return "neutral", [f"healthy, but only {inputs.busy_fraction:.0%} of the limit in use"]
    return "healthy", ["all signals below their low marks"]


def _ttft_only(signals: list[str]) -> bool:
    """Whether the overload is replica-side TTFT alone (no TPOT, KV-cache or queue signal)."""
    return all(s.startswith("ttft ") for s in signals)


def decide(inputs: VerticalInputs, cfg: VerticalConfig = VerticalConfig()) -> VerticalDecision:
    if inputs.min_limit < 1 or inputs.min_limit > inputs.max_limit:
        raise ValueError("need 1 <= min_limit <= max_limit")
    current = min(max(inputs.current_limit, inputs.min_limit), inputs.max_limit)
    verdict, signals = classify(inputs, cfg)
    state = inputs.state
    if verdict == "overload":
        state = VerticalState(overload_streak=state.overload_streak + 1, healthy_streak=0)
    elif verdict == "healthy":
        state = VerticalState(overload_streak=0, healthy_streak=state.healthy_streak + 1)
    else:
        state = VerticalState()
    record = {
        "ttft_p95_ms": inputs.ttft_p95_ms,
        "tpot_p95_ms": inputs.tpot_p95_ms,
        "kv_usage": inputs.kv_usage,
        "waiting_per_replica": inputs.waiting_per_replica,
        "busy_fraction": inputs.busy_fraction,
        "verdict": verdict,
        "signals": signals,
        "overload_streak": state.overload_streak,
        "healthy_streak": state.healthy_streak,
        "bounds": [inputs.min_limit, inputs.max_limit],
    }
    max_change = max(1, math.floor(current * cfg.max_change_fraction))
    desired, reason = current, f"hold: {verdict} ({'; '.join(signals)})"
    needed = cfg.ttft_only_overload_cycles if verdict == "overload" and _ttft_only(signals) else cfg.overload_cycles
    if verdict == "overload" and state.overload_streak >= needed:
        cut = min(current - math.floor(current * cfg.decrease_factor), max_change)
        desired = max(inputs.min_limit, current - max(1, cut))
        reason = f"decrease: {'; '.join(signals)}"
        state = replace(state, overload_streak=0)  # re-arm: the next cut needs fresh evidence at the new limit
    elif verdict == "healthy" and state.healthy_streak >= cfg.healthy_cycles:
        desired = min(inputs.max_limit, current + min(max(1, round(current * cfg.increase_fraction)), max_change))
        reason = f"increase: healthy for {state.healthy_streak} cycles"
        state = replace(state, healthy_streak=0)
    if current != inputs.current_limit:
        reason = f"clamped into bounds; {reason}"
    return VerticalDecision(current=inputs.current_limit, desired=desired, reason=reason, state=state, inputs=record)


def sample_replicas(replica_ids, size: int) -> list:
    """The replicas a vertical tick reads: every one when ``size`` is 0 or covers them, else ``size`` of them.

    The sample is fixed, not rotated: each member's histograms are diffed against its own previous cycle, so the p95s
    still cover the last cycle only, from a share of the traffic (the router spreads load, so the share speaks for the
    endpoint). Members are the lowest ranks of a stable hash of the id (rendezvous style): a replica that leaves is
    replaced by one other and the rest stay, where "the first k by name" would shift on every scale event.
    """
    ids = list(replica_ids)
    if size <= 0 or len(ids) <= size:
        return ids
    return sorted(ids, key=_rank)[:size]


@functools.lru_cache(maxsize=65_536)  # a replica's rank never changes; hashed anew it cost the tick 1 µs a replica
def _rank(replica_id) -> bytes:
    return hashlib.blake2b(str(replica_id).encode(), digest_size=8).digest()
