"""Our two-axis autoscaler as one stateful object over the pure policies, for the simulator (pure: no Django).

The live services run the same ``horizontal.decide`` / ``vertical.decide`` / ``predicted_floor`` with their state
kept in Redis and the database; this class keeps that state in memory for a discrete-event run.
"""

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from capacity.autoscaling import horizontal, predictive, vertical
from capacity.autoscaling.demand import DemandSample


@dataclass
class InfercapPolicy:
    min_replicas: int
    max_replicas: int
    concurrency_limit: int
    concurrency_min: int
    concurrency_max: int
    ttft_slo_ms: float
    tpot_slo_ms: float
    warm_pool: int = 0
    provisioned_concurrency: int = 0
    scale_to_zero: bool = False
    predictive_period_s: float | None = 86_400.0  # None turns the predictive floor off
    predictive_lead_s: float = 120.0
    # In-flight seconds of a request at a given per-replica concurrency (a latency model); Little's law turns the
    # forecast rate into concurrency with it.
    seconds_per_request: Callable[[float], float] = lambda concurrency: 10.0
    # MU of the reference request the concurrency limit is set for; when given, the horizontal policy scales on
    # demand in MU against concurrency_limit × this (else on requests).
    reference_request_mu: float | None = None
    horizontal_config: horizontal.HorizontalConfig = field(default_factory=horizontal.HorizontalConfig)
    vertical_config: vertical.VerticalConfig = field(default_factory=vertical.VerticalConfig)
    name: str = "infercap"
    interval_s: float = 5.0
    vertical_interval_s: float = 30.0

    def __post_init__(self) -> None:
        self.samples: deque[DemandSample] = deque()
        self.history: dict[int, float] = {}
        self.last_scale_up_at: float | None = None
        self.last_scale_down_at: float | None = None
        self.vertical_state = vertical.VerticalState()
        self.decisions: list[horizontal.HorizontalDecision] = []
        self.predictive_config = (
            predictive.PredictiveConfig(
                period_s=self.predictive_period_s,
                lead_s=self.predictive_lead_s,
                target_utilization=self.horizontal_config.target_utilization,
            )
            if self.predictive_period_s
            else None
        )

    def observe(self, sample: DemandSample) -> None:
        self.samples.append(sample)
        horizon = sample.t - self.horizontal_config.scale_down_window_s - 1
        while self.samples and self.samples[0].t < horizon:
            self.samples.popleft()
        if self.predictive_config:
            predictive.record(self.history, t=sample.t, arrivals=sample.arrivals, cfg=self.predictive_config)

    @property
    def target_concurrency(self) -> float:
        return float(self.concurrency_limit)

    def desired(self, *, now: float, ready: int, starting: int) -> int:
        floor = 0
        if self.predictive_config:
            floor, _ = predictive.predicted_floor(
                self.history,
                now=now,
                target_concurrency=self.target_concurrency,
                seconds_per_request=self.seconds_per_request(
                    self.target_concurrency * self.horizontal_config.target_utilization
                ),
                cfg=self.predictive_config,
            )
        decision = horizontal.decide(
            horizontal.HorizontalInputs(
                now=now,
                samples=self.samples,
                ready=ready,
                starting=starting,
                min_replicas=self.min_replicas,
                max_replicas=self.max_replicas,
                target_concurrency=self.target_concurrency,
                mu_capacity_per_replica=(
                    horizontal.mu_capacity_per_replica(self.target_concurrency, self.reference_request_mu)
                    if self.reference_request_mu
                    else None
                ),
                provisioned_concurrency=self.provisioned_concurrency,
                scale_to_zero=self.scale_to_zero,
                predicted_floor=floor,
                last_scale_up_at=self.last_scale_up_at,
                last_scale_down_at=self.last_scale_down_at,
            ),
            self.horizontal_config,
        )
        if decision.desired > decision.current:
            self.last_scale_up_at = now
        elif decision.desired < decision.current:
            self.last_scale_down_at = now
        self.decisions.append(decision)
        return decision.desired

    def adjust_concurrency(
        self, *, ttft_p95_ms, tpot_p95_ms, kv_usage, waiting_per_replica, busy_fraction=None
    ) -> int:
        decision = vertical.decide(
            vertical.VerticalInputs(
                current_limit=self.concurrency_limit,
                min_limit=self.concurrency_min,
                max_limit=self.concurrency_max,
                ttft_slo_ms=self.ttft_slo_ms,
                tpot_slo_ms=self.tpot_slo_ms,
                ttft_p95_ms=ttft_p95_ms,
                tpot_p95_ms=tpot_p95_ms,
                kv_usage=kv_usage,
                waiting_per_replica=waiting_per_replica,
                busy_fraction=busy_fraction,
                state=self.vertical_state,
            ),
            self.vertical_config,
        )
        self.vertical_state = decision.state
        self.concurrency_limit = decision.desired
        return decision.desired
