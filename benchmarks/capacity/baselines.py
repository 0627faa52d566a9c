"""Baseline replica-count policies to compare ours against (pure: no Django).

All share one shape: ``observe(sample)`` every second, ``desired(now=, ready=, starting=)`` every
``interval_s``. None of them has a vertical axis: they scale on a fixed per-replica concurrency target. The
metric is the requests in flight at replicas plus those queued at the proxy (``metric="requests"``, what a queue-
aware custom metric reports) or the in-flight requests alone (``metric="in_flight"``, what a pod-level concurrency
metric such as Knative's queue-proxy sees). ``ScheduledPolicy`` is a cron-style pre-scale (KEDA's cron scaler,
CronHPA) fitted on history days, optionally under a reactive policy (KEDA takes the larger of its triggers).
docs/algorithms.md#baselines.
"""

import math
from collections import deque
from dataclasses import dataclass

from capacity.autoscaling.demand import DemandSample

METRICS = ("requests", "in_flight")


class _Windowed:
    horizon_s = 600.0

    def __init__(self, metric: str = "requests") -> None:
        if metric not in METRICS:
            raise ValueError(f"metric must be one of {METRICS}")
        self.metric = metric
        self.samples: deque[DemandSample] = deque()

    def observe(self, sample: DemandSample) -> None:
        self.samples.append(sample)
        while self.samples and self.samples[0].t < sample.t - self.horizon_s:
            self.samples.popleft()

    def mean(self, now: float, seconds: float) -> float:
        attr = self.metric
        values = [getattr(s, attr) for s in self.samples if s.t > now - seconds]
        return sum(values) / len(values) if values else 0.0


@dataclass
class StaticPolicy:
    """Static peak provisioning: enough replicas for the peak, all the time."""

    replicas: int
    name: str = "static_peak"
    interval_s: float = 5.0

    def observe(self, sample: DemandSample) -> None:
        pass

    def desired(self, *, now: float, ready: int, starting: int) -> int:
        return self.replicas


class HpaLikePolicy(_Windowed):
    """Kubernetes HPA on an average-concurrency metric: tolerance 0.1, 300 s scale-down stabilization,
    scale-up at most max(+4 pods, +100%) per 15 s sync, metric averaged over a 30 s scrape window. A scale-down
    ``behavior`` policy (``scale_down_percent`` per ``scale_down_period_s``, e.g. 20% per 60 s) bounds how fast it
    removes pods; the default (100% per 15 s) is Kubernetes'."""

    name = "hpa"

    def __init__(
        self,
        *,
        target_per_replica: float,
        min_replicas: int,
        max_replicas: int,
        tolerance: float = 0.1,
        stabilization_s: float = 300.0,
        interval_s: float = 15.0,
        metric_window_s: float = 30.0,
        scale_down_percent: float = 100.0,
        scale_down_period_s: float = 15.0,
        metric: str = "requests",
        name: str = "hpa",
    ) -> None:
        super().__init__(metric)
        self.name = name
        self.scale_down_percent, self.scale_down_period_s = scale_down_percent, scale_down_period_s
        self.replica_history: deque[tuple[float, int]] = deque()
        self.target = target_per_replica
        self.min_replicas, self.max_replicas = min_replicas, max_replicas
        self.tolerance, self.stabilization_s = tolerance, stabilization_s
        self.interval_s, self.metric_window_s = interval_s, metric_window_s
        self.recommendations: deque[tuple[float, int]] = deque()

    def desired(self, *, now: float, ready: int, starting: int) -> int:
        current = ready + starting
        metric = self.mean(now, self.metric_window_s)
        ratio = metric / (max(current, 1) * self.target)
        recommended = current if abs(ratio - 1) <= self.tolerance else math.ceil(metric / self.target)
        recommended = min(max(recommended, self.min_replicas, 1), self.max_replicas)
        self.recommendations.append((now, recommended))
        while self.recommendations and self.recommendations[0][0] < now - self.stabilization_s:
            self.recommendations.popleft()
        self.replica_history.append((now, current))
        while self.replica_history and self.replica_history[0][0] < now - self.scale_down_period_s:
            self.replica_history.popleft()
        if recommended < current:
            # Scale-down stabilization: the highest recommendation of the window wins; the behavior policy then
            # removes at most scale_down_percent of the replicas held at the start of its period.
            stabilized = min(current, max(r for _, r in self.recommendations))
            period_start = max(r for _, r in self.replica_history)
            floor = math.ceil(period_start * (1 - self.scale_down_percent / 100.0))
            return max(stabilized, min(current, floor))
        return min(recommended, max(current + 4, 2 * current))


class KpaLikePolicy(_Windowed):
    """Knative KPA: 60 s stable window, 6 s panic window, panic at 200% of ready capacity, target utilization 0.7;
    in panic it never scales down, and it leaves panic after a stable window without the panic condition."""

    name = "kpa"

    def __init__(
        self,
        *,
        target_concurrency: float,
        min_replicas: int,
        max_replicas: int,
        target_utilization: float = 0.7,
        stable_window_s: float = 60.0,
        panic_window_s: float = 6.0,
        panic_threshold: float = 2.0,
        interval_s: float = 2.0,
        max_scale_down_rate: float = 2.0,
        metric: str = "requests",
        name: str = "kpa",
    ) -> None:
        super().__init__(metric)
        self.name = name
        self.per_replica = target_concurrency * target_utilization
        self.min_replicas, self.max_replicas = min_replicas, max_replicas
        self.stable_window_s, self.panic_window_s = stable_window_s, panic_window_s
        self.panic_threshold, self.interval_s = panic_threshold, interval_s
        self.max_scale_down_rate = max_scale_down_rate
        self.panic_since: float | None = None
        self.max_panic_desired = 0

    def desired(self, *, now: float, ready: int, starting: int) -> int:
        current = ready + starting
        stable = math.ceil(self.mean(now, self.stable_window_s) / self.per_replica)
        panic = math.ceil(self.mean(now, self.panic_window_s) / self.per_replica)
        if panic / max(ready, 1) >= self.panic_threshold:
            if self.panic_since is None:
                self.max_panic_desired = current
            self.panic_since = now
        elif self.panic_since is not None and now - self.panic_since >= self.stable_window_s:
            self.panic_since = None
        if self.panic_since is not None:
            self.max_panic_desired = max(self.max_panic_desired, panic, current)
            wanted = self.max_panic_desired
        else:
            wanted = stable
        if wanted < current:
            wanted = max(wanted, math.floor(current / self.max_scale_down_rate))
        return min(max(wanted, self.min_replicas, 1), self.max_replicas)


class ScheduledPolicy:
    """Cron-style pre-scaling: a replica count per slot of the day (``schedule``), raised ``lead_s`` before the slot
    starts (a cron entry fires ahead of the hour so replicas are warm when it comes), under an optional reactive
    policy whose larger answer wins (KEDA's cron scaler next to a metric trigger; a CronHPA changing an HPA's
    minReplicas)."""

    def __init__(
        self,
        *,
        schedule: list[int],
        period_s: float,
        lead_s: float,
        reactive=None,
        max_replicas: int,
        name: str = "scheduled",
    ) -> None:
        if not schedule:
            raise ValueError("schedule needs at least one slot")
        self.schedule, self.period_s, self.lead_s = list(schedule), period_s, lead_s
        self.reactive, self.max_replicas, self.name = reactive, max_replicas, name
        self.interval_s = reactive.interval_s if reactive is not None else 5.0

    def slot_replicas(self, t: float) -> int:
        slot_s = self.period_s / len(self.schedule)
        return self.schedule[int(((t + self.lead_s) % self.period_s) // slot_s) % len(self.schedule)]

    def observe(self, sample: DemandSample) -> None:
        if self.reactive is not None:
            self.reactive.observe(sample)

    def desired(self, *, now: float, ready: int, starting: int) -> int:
        wanted = self.slot_replicas(now)
        if self.reactive is not None:
            wanted = max(wanted, self.reactive.desired(now=now, ready=ready, starting=starting))
        return min(max(wanted, 1), self.max_replicas)


def fit_schedule(
    history_days: list[list[float]],
    *,
    period_s: float,
    slots: int,
    seconds_per_request: float,
    per_replica: float,
    statistic: str = "median",
    bucket_s: float = 60.0,
) -> list[int]:
    """Replicas per slot from history days' arrival times (seconds into each day): each day's busiest minute in the
    slot, turned into in-flight requests by Little's law (rate × seconds per request) and divided by the requests
    one replica holds at its target; across days the median (``statistic="median"``: a spike seen on one day is
    not scheduled) or the maximum (``"max"``: provision for the busiest day seen)."""
    if statistic not in ("median", "max"):
        raise ValueError("statistic must be median or max")
    slot_s = period_s / slots
    per_day = []
    for times in history_days:
        buckets: dict[int, int] = {}
        for t in times:
            buckets[int((t % period_s) // bucket_s)] = buckets.get(int((t % period_s) // bucket_s), 0) + 1
        peaks = [0.0] * slots
        for b, count in buckets.items():
            slot = min(slots - 1, int(b * bucket_s // slot_s))
            peaks[slot] = max(peaks[slot], count / bucket_s)
        per_day.append(peaks)
    schedule = []
    for slot in range(slots):
        values = sorted(day[slot] for day in per_day) or [0.0]
        rate = (
            values[-1]
            if statistic == "max"
            else values[len(values) // 2]
            if len(values) % 2
            else ((values[len(values) // 2 - 1] + values[len(values) // 2]) / 2)
        )
        schedule.append(max(1, math.ceil(rate * seconds_per_request / per_replica)))
    return schedule
