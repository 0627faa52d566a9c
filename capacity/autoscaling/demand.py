"""Demand samples and the windowed views the policies take of them (pure: no Django)."""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class DemandSample:
    """One sample of an endpoint's demand: requests in flight at replicas plus requests queued at the proxy."""

    t: float  # unix seconds (or virtual seconds in the simulator)
    in_flight: float = 0.0
    queued: float = 0.0
    in_flight_mu: float = 0.0
    queued_mu: float = 0.0
    arrivals: float = 0.0  # requests admitted since the previous sample (feeds the predictive floor's history)

    @property
    def requests(self) -> float:
        return self.in_flight + self.queued

    @property
    def mu(self) -> float:
        return self.in_flight_mu + self.queued_mu


def window(samples: Iterable[DemandSample], *, now: float, seconds: float) -> list[DemandSample]:
    """The samples taken in the last ``seconds`` (inclusive of ``now``)."""
    start = now - seconds
    return [s for s in samples if start < s.t <= now + 1e-9]


def window_max(samples: Sequence[DemandSample], *, attr: str = "requests") -> float:
    return max((getattr(s, attr) for s in samples), default=0.0)


def window_mean(samples: Sequence[DemandSample], *, attr: str = "requests") -> float:
    if not samples:
        return 0.0
    return sum(getattr(s, attr) for s in samples) / len(samples)


def sum_process_reports(reports: Iterable[dict], *, now: float, fresh_s: float = 5.0) -> DemandSample:
    """Sum the per-proxy-process demand reports that are fresher than ``fresh_s`` (older ones are dead processes)."""
    totals = {"in_flight": 0.0, "queued": 0.0, "in_flight_mu": 0.0, "queued_mu": 0.0}
    for report in reports:
        try:
            t = float(report.get("t", 0.0))
        except (TypeError, ValueError):
            continue
        if now - t > fresh_s:
            continue
        for key in totals:
            try:
                totals[key] += max(0.0, float(report.get(key, 0.0) or 0.0))
            except (TypeError, ValueError):
                continue
    return DemandSample(t=now, **totals)
