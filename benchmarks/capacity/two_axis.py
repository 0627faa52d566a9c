"""Our two-axis autoscaler as one stateful object over the pure policies, for the simulator (pure: no Django).

The live services run the same ``horizontal.decide`` / ``vertical.decide`` / ``predicted_floor`` with their state
kept in Redis and the database; this class keeps that state in memory for a discrete-event run. With
``reference_request_mu`` it scales and predicts in MU (``predictive.predicted_floor_mu``: the median of the
history days, corrected for today's level; the trend alone without history); each decision's reason says which
signal moved it (docs/algorithms.md#predictive-floor).
"""

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

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
    # "rate": demand is the larger of the MU in flight and the MU arriving per second × the seconds a request stays
    # in flight (Little's law), without the proxy's queue; "queue": in flight + queued, as the live ticks read it.
    demand_signal: str = "rate"
    rate_window_s: float = 300.0  # the window the seconds in flight are measured over
    arrival_window_s: float = 10.0  # the window the arrival rate is measured over
    horizontal_config: horizontal.HorizontalConfig = field(default_factory=horizontal.HorizontalConfig)
    vertical_config: vertical.VerticalConfig = field(default_factory=vertical.VerticalConfig)
    name: str = "infercap"
    interval_s: float = 5.0
    vertical_interval_s: float = 30.0
    # Replicas an endpoint's vertical tick reads (vertical.sample_replicas; 0: all), as INFERCAP's
    # AUTOSCALE_VERTICAL_SAMPLE sets it for the live tick.
    vertical_sample: int = 0

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
            if self.predictive_period_s and not self.reference_request_mu
            else None
        )
        self.seasonal_config = (
            predictive.SeasonalConfig(
                period_s=self.predictive_period_s,
                lead_s=self.predictive_lead_s,
                target_utilization=self.horizontal_config.target_utilization,
            )
            if self.predictive_period_s and self.reference_request_mu
            else None
        )
        self.mu_history: dict[int, float] = {}
        self.raw: deque[DemandSample] = deque()
        self.in_flight_s: float | None = None  # the last Little's-law estimate, for the record
        # Ready replicas at each decision over the rate window: the batch the in-flight time was measured at.
        self.ready_seen: deque[int] = deque(maxlen=max(1, round(self.rate_window_s / self.interval_s)))

    def observe(self, sample: DemandSample) -> None:
        self.raw.append(sample)
        while self.raw and self.raw[0].t < sample.t - self.rate_window_s:
            self.raw.popleft()
        if self.demand_signal == "rate" and self.reference_request_mu:
            sample = self._rate_demand(sample)
        self.samples.append(sample)
        horizon = sample.t - self.horizontal_config.scale_down_window_s - 1
        while self.samples and self.samples[0].t < horizon:
            self.samples.popleft()
        if self.predictive_config:
            predictive.record(self.history, t=sample.t, arrivals=sample.arrivals, cfg=self.predictive_config)
        if self.seasonal_config and sample.arrivals_mu:
            predictive.record_mu(self.mu_history, t=sample.t, mu=sample.arrivals_mu, cfg=self.seasonal_config)

    def _rate_demand(self, sample: DemandSample) -> DemandSample:
        """The sample with its demand read from the arrival rate (docs/algorithms.md#predictive-floor, the rate signal).

        A queue at the proxy lasts seconds (it is served or shed within the class's max age), while a replica
        ordered for it comes one cold start later, when the queue is gone: scaling on it overshoots. The arrival
        rate is what the fleet must keep up with; the seconds a request stays in flight are measured (mean MU in
        flight / mean MU arriving per second over ``rate_window_s``) so the request mix of the day counts, and
        bounded to [0.3, 3] × the latency model's, so a stalled or overloaded fleet cannot run away with it."""
        target_batch = self.target_concurrency * self.horizontal_config.target_utilization
        model_s = self.seconds_per_request(target_batch)
        recent = [s for s in self.raw if s.t > sample.t - self.arrival_window_s]
        rate_mu = sum(s.arrivals_mu for s in recent) / self.arrival_window_s
        rate_requests = sum(s.arrivals for s in recent) / self.arrival_window_s
        arrived = sum(s.arrivals_mu for s in self.raw)
        in_flight = sum(s.in_flight_mu for s in self.raw)
        if arrived > 0 and len(self.raw) >= 30:
            measured = in_flight / arrived
            if self.ready_seen:
                # Measured at the batch the replicas ran; a request stays in flight longer in a larger batch (decode
                # steps slow down), and a rising rate brings one: the batch the present rate would put on the ready
                # replicas, up to the target batch a fleet sized for it runs. The latency model's ratio carries the
                # measurement there, so a spike is sized at the time in flight it will have, not the quiet hour's.
                replicas = max(1.0, sum(self.ready_seen) / len(self.ready_seen))
                ran = max(1.0, sum(s.in_flight for s in self.raw) / len(self.raw) / replicas)
                coming = min(target_batch, max(ran, rate_requests * measured / replicas))
                measured *= self.seconds_per_request(coming) / self.seconds_per_request(ran)
        else:
            measured = model_s
        self.in_flight_s = min(max(measured, 0.3 * model_s), 3 * model_s)
        return replace(
            sample,
            in_flight_mu=max(sample.in_flight_mu, rate_mu * self.in_flight_s),
            in_flight=max(sample.in_flight, rate_requests * self.in_flight_s),
            queued=0.0,
            queued_mu=0.0,
        )

    def remember(self, *, t: float, mu: float) -> None:
        """History from before the run (earlier days' arrivals, as the live rollups would hold them)."""
        if self.seasonal_config:
            predictive.record_mu(self.mu_history, t=t, mu=mu, cfg=self.seasonal_config)
        elif self.predictive_config:
            predictive.record(self.history, t=t, arrivals=1, cfg=self.predictive_config)

    @property
    def target_concurrency(self) -> float:
        return float(self.concurrency_limit)

    def desired(self, *, now: float, ready: int, starting: int) -> int:
        self.ready_seen.append(ready)
        floor, forecast = 0, None
        # The seconds a request stays in flight as measured (the rate signal's Little's-law estimate), else the model's.
        seconds = self.in_flight_s or self.seconds_per_request(
            self.target_concurrency * self.horizontal_config.target_utilization
        )
        if self.seasonal_config:
            floor, forecast = predictive.predicted_floor_mu(
                self.mu_history,
                now=now,
                mu_capacity_per_replica=horizontal.mu_capacity_per_replica(
                    self.target_concurrency, self.reference_request_mu
                ),
                seconds_per_request=seconds,
                cfg=self.seasonal_config,
            )
        elif self.predictive_config:
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
        decision = self._explain(decision, forecast)
        if decision.desired > decision.current:
            self.last_scale_up_at = now
        elif decision.desired < decision.current:
            self.last_scale_down_at = now
        self.decisions.append(decision)
        return decision.desired

    @staticmethod
    def _explain(decision: horizontal.HorizontalDecision, forecast: dict | None) -> horizontal.HorizontalDecision:
        """The decision with the forecast in its record and, when the floor set the count, the forecast's why."""
        if forecast is None:
            return decision
        inputs = {**decision.inputs, "predictive": forecast}
        reason = decision.reason
        if decision.delta and decision.inputs.get("floor_reason") == "predictive_floor":
            if decision.desired == forecast["floor"]:
                reason = f"{reason}; predictive floor {forecast['floor']}: {forecast['why']}"
        elif decision.delta and not forecast["days"]:
            reason = f"{reason} (reactive: {forecast['why']})"
        return replace(decision, reason=reason, inputs=inputs)

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
