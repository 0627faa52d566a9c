"""Load traces for autoscaling runs (pure: no Django).

The bursty trace: a diurnal cycle from a near-zero night to a daytime peak, with spikes that multiply the local
rate by 10 within a few seconds. The spikes repeat every day at the same hour (cron jobs, batch pipelines,
scheduled campaigns), so a policy that remembers yesterday can get ahead of them; a policy that only reacts
must absorb them through a cold start.
"""

import math
import random
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


# -- days that differ from one another ------------------------------------------------------------------------------
# docs/algorithms.md#autoscaling-evaluation. A seeded generator of compressed "days": a diurnal shape with noise, a
# weekday/weekend/holiday level and shape, and spikes whose time, height, ramp and duration are drawn anew each day.
# History days feed the policies that learn (the predictive floor, the cron schedule, the baselines' tuning); the
# held-out days are drawn from the same generator with other seeds, so their spikes fall elsewhere.

# Published statistics of the Azure LLM inference traces (Azure/AzurePublicDataset, CC-BY), carried over as figures,
# not data. 2023 trace (Patel et al., "Splitwise", ISCA 2024, collected 11 Nov 2023): conversation requests have a
# median prompt of 1,020 tokens and a median output of 129; coding requests 1,500 and 13. 2024 trace (Stojkovic et
# al., "DynamoLLM", HPCA 2025, collected 10-19 May 2024, a week): a diurnal load with a weekday/weekend difference.
# The lognormal spreads (sigma) and the burst process below are our assumptions, not published figures.
AZURE_CONVERSATION = {"prompt_median": 1020, "prompt_sigma": 0.9, "output_median": 129, "output_sigma": 1.0}
AZURE_CODE = {"prompt_median": 1500, "prompt_sigma": 0.8, "output_median": 13, "output_sigma": 1.2}
# Our synthetic days: chat with long answers (means ~960 prompt and ~715 output tokens).
SYNTHETIC_CHAT = {"prompt_median": 800, "prompt_sigma": 0.6, "output_median": 560, "output_sigma": 0.7}


@dataclass(frozen=True)
class DaySpike:
    start_s: float  # seconds into the day
    height: float  # multiplier on the day's rate at the top (2–20×)
    ramp_s: float  # seconds to reach the top (seconds to minutes)
    duration_s: float  # seconds at or near the top, ramp included

    def factor(self, into_day_s: float) -> float:
        into = into_day_s - self.start_s
        if into < 0 or into >= self.duration_s:
            return 1.0
        return 1 + (self.height - 1) * min(1.0, into / max(self.ramp_s, 1e-9))


@dataclass(frozen=True)
class Day:
    """One compressed day: its rate function (requests/s at seconds into the day) and its request-length mix."""

    name: str
    kind: str  # weekday | weekend | holiday | azure
    period_s: float
    level: float  # the day's peak rate (requests/s) before noise and spikes
    night_fraction: float
    peak_at: float  # fraction of the day where the diurnal shape peaks
    noise: tuple[float, ...]  # multiplicative noise per noise bucket
    noise_bucket_s: float
    spikes: tuple[DaySpike, ...]
    lengths: dict  # prompt/output lognormal medians and sigmas
    max_tokens: int = 4096
    burst_cv: float = 1.0  # 1: Poisson arrivals; above 1 a burstier (gamma) renewal process within a second
    spike_cap: float = (
        3.0  # a spike's top rate at most this × the day's peak level (a 20× spike at noon would not fit)
    )

    def base_rps(self, t: float) -> float:
        x = (t % self.period_s) / self.period_s
        # A raised cosine peaking at ``peak_at``, squared: a narrow day and a long near-zero night.
        shape = ((1 + math.cos(2 * math.pi * (x - self.peak_at))) / 2) ** 2
        noise = self.noise[min(len(self.noise) - 1, int((t % self.period_s) // self.noise_bucket_s))]
        return self.level * (self.night_fraction + (1 - self.night_fraction) * shape) * noise

    def rate(self, t: float) -> float:
        into = t % self.period_s
        factor = max((s.factor(into) for s in self.spikes), default=1.0)
        base = self.base_rps(t)
        return base if factor == 1.0 else max(base, min(base * factor, self.spike_cap * self.level))

    def peak_rate(self, step_s: float = 5.0) -> float:
        return max(self.rate(i * step_s) for i in range(int(self.period_s / step_s)))

    def arrivals(self, *, seed: int, start_s: float = 0.0) -> list[tuple[float, int, int]]:
        """(arrival time, prompt tokens, output tokens) over the day, shifted to start at ``start_s``.

        Arrivals are a Poisson process (``burst_cv`` 1) or a gamma renewal process with that coefficient of
        variation, at the day's rate per second. Prompts are capped at 4,000 tokens (the 13B profile holds 8,192 with the output). Output lengths are where the model stops (EOS), capped at
        ``max_tokens`` (rare: the cap sits far in the tail)."""
        rng = random.Random(f"day-{self.name}-{seed}")
        out: list[tuple[float, int, int]] = []
        shape = 1.0 / (self.burst_cv**2)
        lengths = self.lengths
        for second in range(int(self.period_s)):
            lam = self.rate(second)
            if lam <= 0:
                continue
            n = _gamma_count(rng, lam, shape) if self.burst_cv != 1.0 else _poisson_count(rng, lam)
            for at in sorted(second + rng.random() for _ in range(n)):
                prompt = _lognormal_tokens(rng, lengths["prompt_median"], lengths["prompt_sigma"], cap=4000)
                output = _lognormal_tokens(rng, lengths["output_median"], lengths["output_sigma"], cap=self.max_tokens)
                out.append((start_s + at, prompt, output))
        return out


def _lognormal_tokens(rng: random.Random, median: float, sigma: float, *, cap: int) -> int:
    return min(cap, max(1, round(rng.lognormvariate(math.log(median), sigma))))


def _poisson_count(rng: random.Random, lam: float) -> int:
    if lam > 30:
        return max(0, round(rng.gauss(lam, math.sqrt(lam))))
    threshold, k, p = math.exp(-lam), 0, rng.random()
    while p > threshold:
        k += 1
        p *= rng.random()
    return k


def _gamma_count(rng: random.Random, lam: float, shape: float) -> int:
    """Arrivals in one second of a gamma renewal process with rate ``lam`` (mean gap 1/lam, CV 1/√shape)."""
    t, n = rng.gammavariate(shape, 1.0 / (lam * shape)), 0
    while t < 1.0:
        n += 1
        t += rng.gammavariate(shape, 1.0 / (lam * shape))
    return n


@dataclass(frozen=True)
class DayGenerator:
    """Seeded days: the same ``seed`` and ``index`` give the same day; another index gives other noise and spikes."""

    seed: int = 1
    period_s: float = 86_400.0
    peak_rps: float = 10.0
    night_fraction: float = 0.03
    noise_sigma: float = 0.12
    noise_bucket_s: float = 300.0
    spikes_per_day: tuple[int, int] = (1, 3)
    spike_height: tuple[float, float] = (2.0, 20.0)
    spike_ramp_s: tuple[float, float] = (3.0, 180.0)
    spike_duration_s: tuple[float, float] = (30.0, 240.0)
    weekend_level: float = 0.55
    spike_cap: float = 3.0
    lengths: dict = field(default_factory=lambda: dict(SYNTHETIC_CHAT))
    # How many times shorter than the durations above the drawn spikes' ramps and lengths and the noise buckets are:
    # with ``period_s`` a real day over this factor, the whole day is compressed together (the same seed and index
    # draw the same day, shorter), so a spike keeps its share of the day (docs/algorithms.md#autoscaling-evaluation).
    time_scale: float = 1.0

    def day(self, index: int, *, kind: str = "weekday") -> Day:
        rng = random.Random(f"daygen-{self.seed}-{index}-{kind}")
        scale = self.time_scale
        level, peak_at, night = self.peak_rps, 0.55, self.night_fraction
        lengths, burst_cv = self.lengths, 1.0
        if kind == "weekend":
            level, peak_at = self.peak_rps * self.weekend_level, 0.62
        elif kind == "holiday":
            # Shaped unlike any history day: a low, early, broad day (history's peak hour is quiet).
            level, peak_at, night = self.peak_rps * 0.4, 0.3, self.night_fraction * 4
        elif kind == "azure":
            # The Azure conversation trace's length medians and a burstier arrival process.
            lengths, burst_cv = dict(AZURE_CONVERSATION), 2.0
        elif kind != "weekday":
            raise ValueError(f"unknown day kind {kind!r}")
        level *= math.exp(rng.gauss(0.0, 0.08))  # day-to-day level
        peak_at += rng.uniform(-0.03, 0.03)
        bucket_s = self.noise_bucket_s / scale
        buckets = max(1, math.ceil(self.period_s / bucket_s))
        noise = tuple(math.exp(rng.gauss(0.0, self.noise_sigma)) for _ in range(buckets))
        spikes = []
        for _ in range(rng.randint(*self.spikes_per_day)):
            duration = _log_uniform(rng, *self.spike_duration_s) / scale
            spikes.append(
                DaySpike(
                    start_s=rng.uniform(0.05, 0.95) * self.period_s - duration / 2,
                    height=_log_uniform(rng, *self.spike_height),
                    ramp_s=min(_log_uniform(rng, *self.spike_ramp_s) / scale, duration / 2),
                    duration_s=duration,
                )
            )
        return Day(
            name=f"{kind}-{index}",
            kind=kind,
            period_s=self.period_s,
            level=level,
            night_fraction=night,
            peak_at=peak_at,
            noise=noise,
            noise_bucket_s=bucket_s,
            spikes=tuple(sorted(spikes, key=lambda s: s.start_s)),
            lengths=lengths,
            burst_cv=burst_cv,
            spike_cap=self.spike_cap,
        )


def _log_uniform(rng: random.Random, low: float, high: float) -> float:
    return math.exp(rng.uniform(math.log(low), math.log(high)))
