"""The rollout state machine as a pure function: observed facts in, the next step out (no Django, no clock).

``decide(facts, config)`` is called on every tick with what the service observed (replica counts per version,
per-version request outcomes since the step began, the time) and returns the state to record, the traffic share
for the new version and the actions to take (replicas to launch, how many old-version replicas to drain). Calling
it twice with the same facts returns the same decision, which is what makes a tick idempotent and a crashed worker
harmless: every count it acts on is derived from the facts, never from what an earlier tick meant to do.

Rolling replacement. With ``B`` the old version's ready replicas at the start (at least one) and the surge
``S = min(B, max_surge)``, at most ``B + S`` replicas of both versions are alive at once (draining ones count:
they still hold their accelerator). The rollout proceeds in batches: start up to ``S`` new-version replicas, wait
for ``/health`` and a warm-up completion, move traffic to the new version in proportion to its warmed replicas
(``100 * warmed / B`` percent, capped by the canary step's percent), drain as many old-version replicas as the
new version now carries (the old version keeps ``B - min(warmed, B * cap / 100)`` ready replicas, enough for its
share at the pre-rollout load per replica), and once those are gone start the next batch. Ready routable replicas
thus never drop below ``B``. When every one of the ``B`` new replicas is warmed up and the cap is 100 %, the rollout
promotes: all traffic to the new version, the last old replicas drain.

States (``endpoints.models.RolloutState``)::

    pending → surging (first batch starting, no traffic yet) → shifting (batches; canary steps) → promoting
            → succeeded
    pending / surging / shifting → rolling_back → rolled_back  (new replicas failed, canary burned, operator)
    paused: nothing moves until resumed (the service keeps the state it came from)

A canary step advances once its window (``step_duration_s``) has passed without a verdict against it and the
new version actually carries the step's percent; the comparison itself waits for ``min_samples`` canary
requests, so a quiet endpoint is not held at a step forever (its canary is simply judged on less evidence). Any
new-version replica failing during the trial, or a batch not warmed up within ``health_timeout_s`` of its
launch, rolls back. Rolling back moves all traffic to the old version, drains the new one and starts old-version
replicas again (within the same ``B + S`` bound) until the old version is back at its starting count.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

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
    new_waiting_since: float | None = None  # launch time of the oldest new replica not warmed up yet
    new_failures: tuple[str, ...] = ()  # why new-version replicas failed during this rollout
    old_ready: int = 0
    old_draining: int = 0
    old_starting: int = 0  # old-version replicas started again by a rollback, not yet ready
    canary: VersionStats = field(default_factory=VersionStats)
    baseline: VersionStats = field(default_factory=VersionStats)

    @property
    def alive(self) -> int:
        """Replicas of both versions holding an accelerator (what the surge bound limits)."""
        return (
            self.new_starting
            + self.new_ready
            + self.new_warmed
            + self.new_draining
            + self.old_ready
            + self.old_draining
            + self.old_starting
        )


@dataclass(frozen=True)
class Decision:
    state: str
    traffic_percent: int
    step_index: int
    new_step: bool = False  # a canary step begins now (its observation window restarts)
    launch: int = 0  # new-version replicas to start now
    drain_old: int = 0  # old-version ready replicas to drain now
    drain_new: bool = False
    launch_old: int = 0  # old-version replicas to start again now (rolling back)
    kind: str = ""  # what to record as a RolloutEvent ("" when nothing changed)
    reason: str = ""

    @property
    def changed_state(self) -> bool:
        return bool(self.kind)


def target_new_replicas(facts: RolloutFacts) -> int:
    """The new version gets as many replicas as the old one had ready at the start (at least one)."""
    return max(facts.baseline_ready, 1)


def surge(facts: RolloutFacts, config: RolloutConfig) -> int:
    """Extra replicas alive at once: the starting ready count, bounded by max_surge (at least one)."""
    return max(1, min(target_new_replicas(facts), config.max_surge))


def compare(canary: VersionStats, baseline: VersionStats, config: RolloutConfig) -> str | None:
    """Why the new version is worse than the old one by more than the margins, or None (also when too few samples).

    A canary is judged at every step; a rolling (all at once) rollout is judged the same way for as long as both
    versions carry traffic, so a bad version is stopped before the last old replica drains."""
    if canary.requests < config.min_samples:
        return None
    who = "canary" if config.strategy == CANARY else "new version"
    if canary.error_rate - baseline.error_rate > config.error_rate_margin:
        return (
            f"{who} error rate {canary.error_rate:.1%} vs {baseline.error_rate:.1%} on the old version "
            f"(margin {config.error_rate_margin:.1%}, {canary.requests} {who} requests)"
        )
    if canary.latency_burn - baseline.latency_burn > config.latency_burn_margin:
        return (
            f"{who} latency SLO misses {canary.latency_burn:.1%} vs {baseline.latency_burn:.1%} on the old version "
            f"(margin {config.latency_burn_margin:.1%}, {canary.requests} {who} requests)"
        )
    return None


def decide(facts: RolloutFacts, config: RolloutConfig) -> Decision:
    state = facts.state
    if state in FINAL or state == PAUSED:
        return Decision(state=state, traffic_percent=facts.traffic_percent, step_index=facts.step_index)
    if state == ROLLING_BACK:
        return _rolling_back(facts, config)
    if state == PROMOTING:
        return _promoting(facts)
    if state not in (PENDING, SURGING, SHIFTING):
        raise ValueError(f"unknown rollout state {state!r}")
    # pending, surging or shifting: the new version is on trial and can still be rolled back
    verdict = _trial_verdict(facts, config)
    if verdict is not None:
        return _rollback(facts, verdict)
    step_index, new_step = _canary_step(facts, config)
    return _next_batch(facts, config, step_index=step_index, new_step=new_step)


def _promoting(facts: RolloutFacts) -> Decision:
    """Drain what is left of the old version; succeeded once none of it is alive."""
    if facts.old_ready + facts.old_draining + facts.old_starting == 0:
        return Decision(
            state=SUCCEEDED,
            traffic_percent=100,
            step_index=facts.step_index,
            kind="succeeded",
            reason="old-version replicas drained; the new version serves all traffic",
        )
    left = facts.old_ready + facts.old_starting
    return Decision(state=PROMOTING, traffic_percent=100, step_index=facts.step_index, drain_old=left)


def _trial_verdict(facts: RolloutFacts, config: RolloutConfig) -> str | None:
    """Why the trial must roll back (a new replica failed, a batch never warmed up, the canary burned), or None."""
    if facts.new_failures:
        return f"new-version replica failed: {facts.new_failures[0]}"
    waiting = facts.new_starting + facts.new_ready
    if waiting and facts.state != PENDING:
        since = facts.new_waiting_since if facts.new_waiting_since is not None else facts.state_since
        waited = facts.now - since
        if waited > config.health_timeout_s:
            return (
                f"only {facts.new_warmed} of {target_new_replicas(facts)} new-version replica(s) healthy and warmed "
                f"up; a batch waited {waited:.0f} s (limit {config.health_timeout_s:.0f} s)"
            )
    if facts.state == SHIFTING:
        return compare(facts.canary, facts.baseline, config)
    return None


def _canary_step(facts: RolloutFacts, config: RolloutConfig) -> tuple[int, bool]:
    """(step index, whether a new step begins now): a canary step advances once its window has passed and the new
    version carries the step's percent."""
    step_index = facts.step_index
    if facts.state != SHIFTING or config.strategy != CANARY:
        return step_index, False
    started = facts.step_started_at if facts.step_started_at is not None else facts.state_since
    if (
        facts.now - started >= config.step_duration_s
        and facts.traffic_percent >= _cap(config, step_index)
        and step_index + 1 < len(_steps(config))
    ):
        return step_index + 1, True
    return step_index, False


def _next_batch(facts: RolloutFacts, config: RolloutConfig, *, step_index: int, new_step: bool) -> Decision:
    """Traffic in proportion to the warmed new replicas (capped by the step), old replicas drained to match, the
    next batch launched within the surge bound; promote once every new replica is warmed and the cap is 100 %."""
    state = facts.state
    cap = _cap(config, step_index)
    target = target_new_replicas(facts)
    share = min(facts.new_warmed, target)  # new replicas that may carry traffic
    if share >= target and cap >= 100:
        why = "all new-version replicas healthy and warmed up"
        if config.strategy == CANARY:
            why = f"canary held {step_index + 1} step(s) within margins; {why}"
        return _promote(facts, step_index, why)
    percent = min(cap, max(1, 100 * share // target)) if share else 0
    old_keep = target - min(share, target * cap // 100)
    drain_old = max(0, facts.old_ready - old_keep)
    room = target + surge(facts, config) - facts.alive
    launch = max(0, min(target - facts.new_starting - facts.new_ready - facts.new_warmed, room))
    next_state = SHIFTING if percent > 0 else (SURGING if state != SHIFTING else SHIFTING)
    decision = Decision(
        state=next_state,
        traffic_percent=percent,
        step_index=step_index,
        new_step=new_step or (next_state == SHIFTING and state != SHIFTING),
        launch=launch,
        drain_old=drain_old,
    )
    if state == PENDING:
        return replace(
            decision,
            state=SURGING,
            kind="surge",
            reason=f"replacing {target} replica(s) in batches of at most {surge(facts, config)} "
            f"(max surge {config.max_surge}): starting {launch}",
        )
    if next_state != state or new_step or percent != facts.traffic_percent:
        where = f"canary step {step_index + 1} (cap {cap}%)" if config.strategy == CANARY else "rolling"
        return replace(
            decision,
            kind="shift",
            reason=f"{where}: {percent}% of traffic to the new version on {share} of {target} warmed replica(s)"
            + (f", draining {drain_old} old" if drain_old else ""),
        )
    if launch:
        return replace(decision, kind="launch", reason=f"starting {launch} more new-version replica(s)")
    return decision


def _steps(config: RolloutConfig) -> tuple[int, ...]:
    return tuple(config.canary_steps) or (100,)


def _cap(config: RolloutConfig, step_index: int) -> int:
    """The most traffic the new version may take now: the canary step's percent, 100 for all at once."""
    if config.strategy != CANARY:
        return 100
    steps = _steps(config)
    return steps[min(step_index, len(steps) - 1)]


def _promote(facts: RolloutFacts, step_index: int, why: str) -> Decision:
    return Decision(
        state=PROMOTING,
        traffic_percent=100,
        step_index=step_index,
        new_step=True,
        drain_old=facts.old_ready + facts.old_starting,
        kind="promote",
        reason=f"{why}: all traffic to the new version, draining the old",
    )


def _rollback(facts: RolloutFacts, why: str) -> Decision:
    return Decision(
        state=ROLLING_BACK, traffic_percent=0, step_index=facts.step_index, drain_new=True, kind="rollback", reason=why
    )


def _rolling_back(facts: RolloutFacts, config: RolloutConfig) -> Decision:
    """Drain the new version; start old-version replicas again until it is back at its starting ready count
    (within the surge bound, for at most ``health_timeout_s``); rolled back once the new version is gone."""
    restore = facts.baseline_ready
    gave_up = facts.now - facts.state_since > config.health_timeout_s
    new_alive = facts.new_starting + facts.new_ready + facts.new_warmed + facts.new_draining
    old_up = facts.old_ready + facts.old_starting
    room = target_new_replicas(facts) + surge(facts, config) - facts.alive
    launch_old = 0 if gave_up else max(0, min(restore - old_up, room))
    if new_alive == 0 and facts.old_starting == 0 and launch_old == 0 and (facts.old_ready >= restore or gave_up):
        short = "" if facts.old_ready >= restore else f" ({facts.old_ready} of {restore} old replicas came back)"
        return Decision(
            state=ROLLED_BACK,
            traffic_percent=0,
            step_index=facts.step_index,
            kind="rolled_back",
            reason=f"new-version replicas stopped; the old version serves all traffic{short}",
        )
    return Decision(
        state=ROLLING_BACK, traffic_percent=0, step_index=facts.step_index, drain_new=True, launch_old=launch_old
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
