"""The rollout state machine as a pure function: observed facts in, the next step out (no Django, no clock).

``decide(facts, config)`` is called on every tick with what the service observed (replica counts per version,
per-version request outcomes since the step began, the time) and returns the state to record, the traffic share
for the new version and the actions to take (replicas to launch, which version to drain). Calling it twice with
the same facts returns the same decision, which is what makes a tick idempotent and a crashed worker harmless.

States (``endpoints.models.RolloutState``)::

    pending → surging → promoting → succeeded                  (all at once)
    pending → surging → shifting (step 1 … n) → promoting → succeeded   (canary)
    pending / surging / shifting → rolling_back → rolled_back  (new replicas failed, canary burned, operator)
    paused: nothing moves until resumed (the service keeps the state it came from)

A canary step advances once its window (``step_duration_s``) has passed without a verdict against it; the
comparison itself waits for ``min_samples`` canary requests, so a quiet endpoint is not held at a step forever
(its canary is simply judged on less evidence). Any new-version replica failing during the trial rolls back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PENDING = "pending"
SURGING = "surging"
SHIFTING = "shifting"
PAUSED = "paused"
PROMOTING = "promoting"
SUCCEEDED = "succeeded"
ROLLING_BACK = "rolling_back"
ROLLED_BACK = "rolled_back"
FAILED = "failed"
FINAL = frozenset({SUCCEEDED, ROLLED_BACK, FAILED})
ROLLBACK_FROM = frozenset({PENDING, SURGING, SHIFTING, PAUSED})  # before the old version starts draining

ALL_AT_ONCE = "all_at_once"
CANARY = "canary"


@dataclass(frozen=True)
class RolloutConfig:
    strategy: str = ALL_AT_ONCE
    canary_steps: tuple[int, ...] = (10, 50, 100)
    step_duration_s: float = 60.0
    max_surge: int = 2
    health_timeout_s: float = 600.0
    error_rate_margin: float = 0.05
    latency_burn_margin: float = 0.10
    min_samples: int = 20


@dataclass(frozen=True)
class VersionStats:
    """Request outcomes of one version over the current step (from the usage records)."""

    requests: int = 0
    errors: int = 0  # upstream errors and timeouts
    slo_misses: int = 0  # answered, but past the endpoint's TTFT or TPOT SLO

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    @property
    def latency_burn(self) -> float:
        """Share of answered requests that missed the latency SLO (what burns the latency error budget)."""
        answered = self.requests - self.errors
        return self.slo_misses / answered if answered > 0 else 0.0


@dataclass(frozen=True)
class RolloutFacts:
    state: str
    now: float  # seconds (any epoch, the same as the *_at fields)
    state_since: float
    traffic_percent: int = 0
    step_index: int = 0
    step_started_at: float | None = None
    baseline_ready: int = 1  # the old version's ready replicas when the rollout started
    new_starting: int = 0  # new-version replicas launched, not yet healthy
    new_ready: int = 0  # healthy, warm-up not passed yet
    new_warmed: int = 0  # healthy and warmed up: may take traffic
    new_draining: int = 0
    new_failures: tuple[str, ...] = ()  # why new-version replicas failed during this rollout
    old_ready: int = 0
    old_draining: int = 0
    canary: VersionStats = field(default_factory=VersionStats)
    baseline: VersionStats = field(default_factory=VersionStats)


@dataclass(frozen=True)
class Decision:
    state: str
    traffic_percent: int
    step_index: int
    new_step: bool = False  # a canary step begins now (its observation window restarts)
    launch: int = 0  # new-version replicas to start now
    drain_old: bool = False
    drain_new: bool = False
    kind: str = ""  # what to record as a RolloutEvent ("" when nothing changed)
    reason: str = ""

    @property
    def changed_state(self) -> bool:
        return bool(self.kind)


def target_new_replicas(facts: RolloutFacts) -> int:
    """The new version gets as many replicas as the old one had ready at the start (at least one)."""
    return max(facts.baseline_ready, 1)


def compare(canary: VersionStats, baseline: VersionStats, config: RolloutConfig) -> str | None:
    """Why the canary is worse than the old version by more than the margins, or None (also when too few samples)."""
    if canary.requests < config.min_samples:
        return None
    if canary.error_rate - baseline.error_rate > config.error_rate_margin:
        return (
            f"canary error rate {canary.error_rate:.1%} vs {baseline.error_rate:.1%} on the old version "
            f"(margin {config.error_rate_margin:.1%}, {canary.requests} canary requests)"
        )
    if canary.latency_burn - baseline.latency_burn > config.latency_burn_margin:
        return (
            f"canary latency SLO misses {canary.latency_burn:.1%} vs {baseline.latency_burn:.1%} on the old version "
            f"(margin {config.latency_burn_margin:.1%}, {canary.requests} canary requests)"
        )
    return None


def decide(facts: RolloutFacts, config: RolloutConfig) -> Decision:
    state = facts.state
    stay = Decision(state=state, traffic_percent=facts.traffic_percent, step_index=facts.step_index)
    if state in FINAL or state == PAUSED:
        return stay
    if state == PENDING:
        target = target_new_replicas(facts)
        return Decision(
            state=SURGING,
            traffic_percent=0,
            step_index=0,
            launch=min(target, config.max_surge),
            kind="surge",
            reason=f"starting {target} new-version replica(s), at most {config.max_surge} at a time",
        )
    if state == ROLLING_BACK:
        alive = facts.new_starting + facts.new_ready + facts.new_warmed + facts.new_draining
        if alive == 0:
            return Decision(
                state=ROLLED_BACK,
                traffic_percent=0,
                step_index=facts.step_index,
                kind="rolled_back",
                reason="new-version replicas stopped; the old version serves all traffic",
            )
        return Decision(state=ROLLING_BACK, traffic_percent=0, step_index=facts.step_index, drain_new=True)
    if state == PROMOTING:
        if facts.old_ready + facts.old_draining == 0:
            return Decision(
                state=SUCCEEDED,
                traffic_percent=100,
                step_index=facts.step_index,
                kind="succeeded",
                reason="old-version replicas drained; the new version serves all traffic",
            )
        return Decision(state=PROMOTING, traffic_percent=100, step_index=facts.step_index, drain_old=True)

    # surging or shifting: the new version is on trial and can still be rolled back
    if facts.new_failures:
        return _rollback(facts, f"new-version replica failed: {facts.new_failures[0]}")
    target = target_new_replicas(facts)
    if state == SURGING:
        if facts.new_warmed >= target:
            return _first_shift(facts, config)
        waited = facts.now - facts.state_since
        if waited > config.health_timeout_s:
            return _rollback(
                facts,
                f"only {facts.new_warmed} of {target} new-version replica(s) healthy and warmed up "
                f"after {waited:.0f} s (limit {config.health_timeout_s:.0f} s)",
            )
        in_flight = facts.new_starting + facts.new_ready
        launch = max(0, min(target - in_flight - facts.new_warmed, config.max_surge - in_flight))
        if launch:
            return Decision(
                state=SURGING,
                traffic_percent=0,
                step_index=0,
                launch=launch,
                kind="launch",
                reason=f"starting {launch} more new-version replica(s)",
            )
        return stay
    if state == SHIFTING:
        burned = compare(facts.canary, facts.baseline, config)
        if burned:
            return _rollback(facts, burned)
        started = facts.step_started_at if facts.step_started_at is not None else facts.state_since
        if facts.now - started < config.step_duration_s:
            return stay
        steps = _steps(config)
        index = facts.step_index + 1
        if index >= len(steps) or steps[index] >= 100:
            return _promote(facts, f"canary held {len(steps[:index])} step(s) within margins")
        return Decision(
            state=SHIFTING,
            traffic_percent=steps[index],
            step_index=index,
            new_step=True,
            kind="shift",
            reason=f"canary step {index + 1}: {steps[index]}% of traffic to the new version",
        )
    raise ValueError(f"unknown rollout state {state!r}")


def _steps(config: RolloutConfig) -> tuple[int, ...]:
    return tuple(config.canary_steps) or (100,)


def _first_shift(facts: RolloutFacts, config: RolloutConfig) -> Decision:
    steps = _steps(config)
    if config.strategy != CANARY or steps[0] >= 100:
        return _promote(facts, "all new-version replicas healthy and warmed up")
    return Decision(
        state=SHIFTING,
        traffic_percent=steps[0],
        step_index=0,
        new_step=True,
        kind="shift",
        reason=f"canary step 1: {steps[0]}% of traffic to the new version",
    )


def _promote(facts: RolloutFacts, why: str) -> Decision:
    return Decision(
        state=PROMOTING,
        traffic_percent=100,
        step_index=facts.step_index,
        new_step=True,
        drain_old=True,
        kind="promote",
        reason=f"{why}: all traffic to the new version, draining the old",
    )


def _rollback(facts: RolloutFacts, why: str) -> Decision:
    return Decision(
        state=ROLLING_BACK, traffic_percent=0, step_index=facts.step_index, drain_new=True, kind="rollback", reason=why
    )


def validate_canary_steps(steps) -> list[int]:
    """Rising whole percents in (0, 100], ending at 100; raises ValueError with a readable message otherwise."""
    if not isinstance(steps, (list, tuple)) or not steps:
        raise ValueError("canary_steps must be a non-empty list of percents")
    out = []
    for step in steps:
        if isinstance(step, bool) or not isinstance(step, int) or not 0 < step <= 100:
            raise ValueError("canary_steps must be whole percents between 1 and 100")
        if out and step <= out[-1]:
            raise ValueError("canary_steps must rise")
        out.append(step)
    if out[-1] != 100:
        raise ValueError("canary_steps must end at 100")
    return out
