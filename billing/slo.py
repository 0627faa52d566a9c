"""Error budgets and burn rates: pure arithmetic shared by the alert evaluator, the rule exporter and the benchmark.

No Django here. Windows and thresholds follow the Google SRE workbook's multiwindow, multi-burn-rate alerts
(as Sloth generates them) over a 30-day budget.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache

# Latency histogram bounds (cumulative "le" buckets, like Prometheus). A latency SLO's threshold is
# evaluated at the largest bound not above it, so thresholds taken from these lists give exact SLIs.
TTFT_BOUNDS_MS: tuple[int, ...] = (50, 100, 200, 300, 500, 750, 1000, 1500, 2000, 3000, 5000, 10000)
TPOT_BOUNDS_MS: tuple[int, ...] = (5, 10, 20, 30, 40, 50, 75, 100, 150, 200, 300, 500)

WINDOWS_S: dict[str, int] = {
    "5m": 300,
    "30m": 1800,
    "1h": 3600,
    "2h": 7200,
    "6h": 21600,
    "1d": 86400,
    "3d": 259200,
}


@dataclass(frozen=True)
class WindowPair:
    severity: str  # "page" or "ticket"
    long_window: str
    short_window: str
    burn_rate: float  # both windows must burn faster than this


WINDOW_PAIRS: tuple[WindowPair, ...] = (
    WindowPair("page", "1h", "5m", 14.4),
    WindowPair("page", "6h", "30m", 6.0),
    WindowPair("ticket", "1d", "2h", 3.0),
    WindowPair("ticket", "3d", "6h", 1.0),
)

# How long a pair's condition must hold before its alert fires (Prometheus ``for:``); the exported rules use the same.
ALERT_FOR_S: dict[str, int] = {"page": 60, "ticket": 300}

SLI_KINDS = ("availability", "ttft", "tpot", "goodput")


@lru_cache(maxsize=4096)  # called per SLO and window on every tick, over a handful of distinct thresholds
def snap_bound(threshold_ms: float, bounds: tuple[int, ...]) -> int:
    """The histogram bound an SLO threshold is evaluated at: the largest bound ≤ threshold (the smallest if none)."""
    eligible = [b for b in bounds if b <= threshold_ms]
    return eligible[-1] if eligible else bounds[0]


@dataclass(frozen=True)
class SliSpec:
    """What an SLO counts: its kind, objective and effective latency thresholds (already defaulted from the endpoint)."""

    kind: str
    objective: float
    ttft_ms: float
    tpot_ms: float
    # True when the thresholds are the endpoint's own, so the proxy's ``slo_met`` flag is exactly "good".
    thresholds_are_endpoint_defaults: bool = True

    def __post_init__(self) -> None:
        if self.kind not in SLI_KINDS:
            raise ValueError(f"unknown SLI kind {self.kind!r}")
        if not 0.0 < self.objective < 1.0:
            raise ValueError("objective must lie strictly between 0 and 1")


def sli_counts(spec: SliSpec, sums: Mapping[str, float]) -> tuple[float, float]:
    """(good events, valid events) of an SLI from summed rollup counters.

    Rate-limited and client-cancelled requests are the client's doing and count for no SLI. Availability and
    goodput count every other request (shed, errors and timeouts are bad); latency SLIs count successful ones.
    """
    valid_all = sums.get("requests", 0) - sums.get("rate_limited", 0) - sums.get("client_cancelled", 0)
    ok = sums.get("ok", 0)
    ttft_good = sums.get(f"ttft_le_{snap_bound(spec.ttft_ms, TTFT_BOUNDS_MS)}", 0)
    tpot_good = sums.get(f"tpot_le_{snap_bound(spec.tpot_ms, TPOT_BOUNDS_MS)}", 0)
    if spec.kind == "availability":
        return ok, valid_all
    if spec.kind == "ttft":
        return ttft_good, ok
    if spec.kind == "tpot":
        return tpot_good, ok
    if spec.thresholds_are_endpoint_defaults:
        return sums.get("good", 0), valid_all
    # Custom goodput thresholds: only the two marginal histograms are kept, so count the requests surely meeting
    # both (the Fréchet lower bound); this errs towards alerting, never towards hiding a burn.
    return max(0.0, ttft_good + tpot_good - ok), valid_all


def error_ratio(good: float, total: float) -> float:
    if total <= 0:
        return 0.0
    return max(0.0, min(1.0, (total - good) / total))


def burn_rate(good: float, total: float, objective: float) -> float:
    """How many times faster than allowed the budget burns: 1.0 spends exactly the budget over the period."""
    return error_ratio(good, total) / (1.0 - objective)


def budget_remaining(good: float, total: float, objective: float) -> float:
    """Fraction of the period's error budget left (1 = untouched, 0 = spent, negative = overspent)."""
    if total <= 0:
        return 1.0
    allowed_bad = (1.0 - objective) * total
    return 1.0 - (total - good) / allowed_bad


def exhaustion_at(*, remaining: float, burn: float, period_s: float, now: datetime) -> datetime | None:
    """When the budget runs out if the current burn rate holds; None if it never does at this rate.

    At burn rate b the whole budget lasts period/b, so the remaining fraction r lasts r·period/b.
    """
    if remaining <= 0:
        return now
    if burn <= 0:
        return None
    return now + timedelta(seconds=remaining * period_s / burn)


def pair_condition(burns: Mapping[str, float], pair: WindowPair) -> bool:
    return burns.get(pair.long_window, 0.0) > pair.burn_rate and burns.get(pair.short_window, 0.0) > pair.burn_rate


@dataclass(frozen=True)
class AlertStep:
    """The next state of one (SLO, window pair) alert; ``state`` None means no open alert."""

    state: str | None
    notify: str | None = None  # "firing" or "resolved" when a notification is due


def alert_step(
    *, state: str | None, condition: bool, pending_since: datetime | None, now: datetime, for_s: float
) -> AlertStep:
    """The pending → firing → resolved state machine of one alert.

    A new condition opens a pending alert; it fires once the condition has held ``for_s``. A condition that clears
    resolves the alert: a pending one quietly, a firing one with a notification.
    """
    if state is None or state == "resolved":
        if not condition:
            return AlertStep(state=None)
        if for_s <= 0:
            return AlertStep(state="firing", notify="firing")
        return AlertStep(state="pending")
    if not condition:
        return AlertStep(state="resolved", notify="resolved" if state == "firing" else None)
    if state == "pending" and pending_since is not None and (now - pending_since).total_seconds() >= for_s:
        return AlertStep(state="firing", notify="firing")
    return AlertStep(state=state)
