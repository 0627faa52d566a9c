"""Baseline replica-count policies to compare ours against (pure: no Django).

All share one shape: ``observe(sample)`` every second, ``desired(now=, ready=, starting=)`` every
``interval_s``. None of them has a vertical axis: they scale on a fixed per-replica concurrency target.
"""

import math
from collections import deque
from dataclasses import dataclass

from capacity.autoscaling.demand import DemandSample


class _Windowed:
    horizon_s = 600.0

    def __init__(self) -> None:
        self.samples: deque[DemandSample] = deque()

    def observe(self, sample: DemandSample) -> None:
        self.samples.append(sample)
        while self.samples and self.samples[0].t < sample.t - self.horizon_s:
            self.samples.popleft()

    def mean(self, now: float, seconds: float) -> float:
        values = [s.requests for s in self.samples if s.t > now - seconds]
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
    scale-up at most max(+4 pods, +100%) per 15 s sync, metric averaged over a 30 s scrape window."""

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
    ) -> None:
        super().__init__()
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
        if recommended < current:
            # Scale-down stabilization: the highest recommendation of the window wins.
            return min(current, max(r for _, r in self.recommendations))
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
    ) -> None:
        super().__init__()
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
