"""Demand samples and the windowed views the policies take of them (pure: no Django)."""

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter


@dataclass(frozen=True, slots=True)
class DemandSample:
    """One sample of an endpoint's demand: requests in flight at replicas plus requests queued at the proxy. Slotted:
    an autoscaler worker keeps minutes of these per endpoint (``tick_reads``)."""

    t: float  # unix seconds (or virtual seconds in the simulator)
    in_flight: float = 0.0
    queued: float = 0.0
    in_flight_mu: float = 0.0
    queued_mu: float = 0.0
    arrivals: float = 0.0  # requests admitted since the previous sample (feeds the predictive floor's history)
    arrivals_mu: float = 0.0  # their MU at the expected cost (the MU predictive floor's history)

    @property
    def requests(self) -> float:
        return self.in_flight + self.queued

    @property
    def mu(self) -> float:
        return self.in_flight_mu + self.queued_mu

    def as_dict(self) -> dict[str, float]:
        """The fields by name, as the sample is stored (``json.dumps`` of this)."""
        return {name: getattr(self, name) for name in self.__slots__}


def window(samples: Iterable[DemandSample], *, now: float, seconds: float) -> list[DemandSample]:
    """The samples taken in the last ``seconds`` (inclusive of ``now``)."""
    start, end = now - seconds, now + 1e-9
    return [s for s in samples if start < s.t <= end]


def window_max(samples: Sequence[DemandSample], *, attr: str = "requests") -> float:
    """The largest finite value (a non-finite one, e.g. a corrupt stored sample, is ignored). Mapped in C: the
    horizontal tick takes several over a 420-sample window per endpoint
    (docs/architecture.md#the-horizontal-tick-at-fleet-scale)."""
    return max(filter(math.isfinite, map(attrgetter(attr), samples)), default=0.0)


def window_mean(samples: Sequence[DemandSample], *, attr: str = "requests") -> float:
    if not samples:
        return 0.0
    return sum(getattr(s, attr) for s in samples) / len(samples)


def sum_process_reports(reports: Iterable[dict], *, now: float, fresh_s: float = 5.0) -> DemandSample:
    """Sum the per-proxy-process demand reports that are fresher than ``fresh_s`` (older ones are dead processes)."""
    return sum_fresh_reports(reports, now=now, fresh_s=fresh_s)[0]


def sum_fresh_reports(reports: Iterable[dict], *, now: float, fresh_s: float = 5.0) -> tuple[DemandSample, int]:
    """``sum_process_reports`` and how many reports were fresh (0: no proxy vouches for this sample).

    A report stamped in the future by more than ``fresh_s`` (a skewed clock) or with a non-finite stamp would stay
    "fresh" forever, so it counts as stale; non-finite or negative figures count as 0 (one bad report must not
    turn into an infinite or NaN demand)."""
    totals = {"in_flight": 0.0, "queued": 0.0, "in_flight_mu": 0.0, "queued_mu": 0.0}
    fresh = 0
    for report in reports:
        try:
            t = float(report.get("t", 0.0))
        except (TypeError, ValueError, AttributeError):
            continue
        if not math.isfinite(t) or abs(now - t) > fresh_s:
            continue
        fresh += 1
        for key in totals:
            try:
                value = float(report.get(key, 0.0) or 0.0)
            except (TypeError, ValueError):
                continue
            if math.isfinite(value) and value > 0:
                totals[key] += value
    return DemandSample(t=now, **totals), fresh


def arrivals_since(
    reports: dict[str, dict], seen: dict[str, list[float]], *, now: float, fresh_s: float = 5.0
) -> tuple[float, float, dict[str, list[float]]]:
    """Requests (and their MU) that reached the proxies' admission since ``seen``: each fresh report carries its
    process's cumulative ``arrived`` and ``arrived_mu``; ``seen`` holds each process's figures at the previous
    sample. Returns the arrivals, their MU, and the figures to keep for the next sample (fresh processes only).

    A process seen for the first time counts from its next report (its earlier arrivals belong to samples already
    taken); a counter that went back (the process restarted under its name) counts from zero."""
    arrivals = arrivals_mu = 0.0
    keep: dict[str, list[float]] = {}
    for process, report in reports.items():
        try:
            t = float(report.get("t", 0.0))
            count, mu = float(report["arrived"]), float(report.get("arrived_mu", 0.0))
        except (TypeError, ValueError, KeyError, AttributeError):
            continue
        if not (math.isfinite(t) and abs(now - t) <= fresh_s and math.isfinite(count) and math.isfinite(mu)):
            continue
        keep[process] = [count, mu]
        before = seen.get(process)
        if before is None:
            continue
        restarted = count < before[0]
        arrivals += count if restarted else count - before[0]
        arrivals_mu += max(0.0, mu if restarted else mu - before[1])
    return arrivals, arrivals_mu, keep
