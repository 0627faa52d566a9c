"""Load traces for autoscaling runs (pure: no Django).

The bursty trace: a diurnal cycle from a near-zero night to a daytime peak, with spikes that multiply the local
rate by 10 within a few seconds. The spikes repeat every day at the same hour (cron jobs, batch pipelines,
scheduled campaigns), so a policy that remembers yesterday can get ahead of them; a policy that only reacts
must absorb them through a cold start.
"""

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Spike:
    at_fraction: float  # of the period
    duration_s: float
    multiplier: float = 10.0
    ramp_s: float = 3.0


@dataclass(frozen=True)
class BurstyTrace:
    period_s: float = 86_400.0
    night_rps: float = 0.3
    peak_rps: float = 40.0
    spikes: tuple[Spike, ...] = field(
        default_factory=lambda: (Spike(0.22, 240.0), Spike(0.38, 180.0), Spike(0.8, 240.0))
    )

    def base_rps(self, t: float) -> float:
        x = (t % self.period_s) / self.period_s
        shape = ((1 - math.cos(2 * math.pi * x)) / 2) ** 2
        return self.night_rps + (self.peak_rps - self.night_rps) * shape

    def spike_onsets(self, *, day: int = 0) -> list[float]:
        return [day * self.period_s + s.at_fraction * self.period_s for s in self.spikes]

    def rate(self, t: float) -> float:
        base = self.base_rps(t)
        x_s = t % self.period_s
        factor = 1.0
        for s in self.spikes:
            into = x_s - s.at_fraction * self.period_s
            if 0 <= into < s.duration_s:
                factor = max(factor, 1 + (s.multiplier - 1) * min(1.0, into / s.ramp_s))
        return base * factor

    def peak_rate(self, step_s: float = 5.0) -> float:
        return max(self.rate(i * step_s) for i in range(int(self.period_s / step_s)))
