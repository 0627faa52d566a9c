"""The predictive floor: capacity raised ahead of repeating peaks (pure: no Django).

History is the request arrival rate per minute, not in-flight concurrency: concurrency depends on how tightly the
fleet was packed at the time (a request lasts longer in a bigger batch), so yesterday's concurrency says little
about today's need at today's packing. Two forecasts of the rate one cold start from now, the larger wins: the
same time yesterday (the peak of yesterday's slice [now, now + lead + margin], scaled up if today runs above
yesterday), and the recent trend (a least-squares line through the last minutes, extrapolated over the lead time).
The floor is ``ceil(rate · seconds_per_request / (target_concurrency · target_utilization))`` (Little's law); it
only raises capacity, it never lowers what demand asks for.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class PredictiveConfig:
    period_s: float = 86_400.0  # "yesterday"
    bucket_s: float = 60.0  # history resolution: the peak demand per bucket
    lead_s: float = 120.0  # how far ahead to look: a cold start
    # Yesterday's slice [then, then + lead + margin]: capacity is asked for one cold start (plus a margin) before
    # a repeating peak and let go as soon as yesterday's peak is behind.
    lookahead_margin_s: float = 30.0
    trend_window_s: float = 600.0
    # Today against yesterday: growth raises the forecast, a quieter day never lowers it below yesterday's shape
    # (the ratio's windows can hold a spike that one day absorbed better than the other).
    ratio_clamp: tuple[float, float] = (1.0, 2.0)
    target_utilization: float = 0.7


def bucket_of(t: float, cfg: PredictiveConfig) -> int:
    return int(t // cfg.bucket_s)


def record(history: dict[int, float], *, t: float, arrivals: float, cfg: PredictiveConfig) -> None:
    """Add arrivals to their bucket (history holds requests per second per bucket); drop buckets older than a period."""
    b = bucket_of(t, cfg)
    history[b] = history.get(b, 0.0) + arrivals / cfg.bucket_s
    horizon = b - int((cfg.period_s + cfg.trend_window_s) // cfg.bucket_s) - 2
    for old in [k for k in history if k < horizon]:
        del history[old]


def _peak(history: Mapping[int, float], start_t: float, end_t: float, cfg: PredictiveConfig) -> float | None:
    values = [history[b] for b in range(bucket_of(start_t, cfg), bucket_of(end_t, cfg) + 1) if b in history]
    return max(values) if values else None


def forecast_yesterday(history: Mapping[int, float], *, now: float, cfg: PredictiveConfig) -> float | None:
    then = now - cfg.period_s
    ahead = _peak(history, then, then + cfg.lead_s + cfg.lookahead_margin_s, cfg)
    if ahead is None:
        return None
    # Scale by today's level against yesterday's at the same hour, bounded so one odd minute cannot explode it.
    today = _peak(history, now - cfg.trend_window_s, now, cfg)
    past = _peak(history, then - cfg.trend_window_s, then, cfg)
    ratio = 1.0
    if today is not None and past:
        ratio = min(max(today / past, cfg.ratio_clamp[0]), cfg.ratio_clamp[1])
    return ahead * ratio


def forecast_trend(history: Mapping[int, float], *, now: float, cfg: PredictiveConfig) -> float | None:
    first, last = bucket_of(now - cfg.trend_window_s, cfg), bucket_of(now, cfg)
    points = [(b * cfg.bucket_s, history[b]) for b in range(first, last + 1) if b in history]
    if len(points) < 3:
        return None
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_d = sum(d for _, d in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    slope = sum((t - mean_t) * (d - mean_d) for t, d in points) / var if var else 0.0
    if slope <= 0:
        return None  # a falling trend must not lower capacity; the reactive policy handles that
    return mean_d + slope * (now + cfg.lead_s - mean_t)


def predicted_floor(
    history: Mapping[int, float],
    *,
    now: float,
    target_concurrency: float,
    seconds_per_request: float,
    cfg: PredictiveConfig = PredictiveConfig(),
) -> tuple[int, dict]:
    """Replicas to keep so the rate forecast one lead time ahead finds capacity already running.

    ``seconds_per_request``: how long a request stays in flight when replicas run at the target concurrency.
    """
    yesterday = forecast_yesterday(history, now=now, cfg=cfg)
    trend = forecast_trend(history, now=now, cfg=cfg)
    forecast_rps = max(v for v in (yesterday, trend, 0.0) if v is not None)
    concurrency = forecast_rps * seconds_per_request
    floor = math.ceil(concurrency / (target_concurrency * cfg.target_utilization)) if concurrency > 0 else 0
    return floor, {"yesterday_rps": yesterday, "trend_rps": trend, "forecast_rps": forecast_rps, "floor": floor}


# -- the floor in MU, from several history days -------------------------------------------------------------------
# docs/algorithms.md#predictive-floor. What ``InfercapPolicy`` runs: history is the MU arriving per second, per
# minute bucket, over up to ``max_days`` periods. The forecast one cold start ahead is the median over the history
# days of each day's peak in that slice (a spike that one day had at that hour does not carry over to the others),
# scaled by today's level against the history days' level over the last 10 min (a holiday lowers it, a busier day
# raises it), and never below the recent trend. No history (a new endpoint): the trend alone.


@dataclass(frozen=True)
class SeasonalConfig:
    period_s: float = 86_400.0
    bucket_s: float = 60.0
    lead_s: float = 120.0
    lookahead_margin_s: float = 30.0
    level_window_s: float = 600.0
    # Today's level against history's: a quiet day lowers the forecast to a quarter, a busy one at most doubles it.
    level_clamp: tuple[float, float] = (0.25, 2.0)
    max_days: int = 7
    trend_window_s: float = 600.0
    target_utilization: float = 0.7


def record_mu(history: dict[int, float], *, t: float, mu: float, cfg: SeasonalConfig) -> None:
    """Add ``mu`` arrived at ``t`` to its bucket (MU per second of the bucket); drop buckets older than the days kept."""
    b = int(t // cfg.bucket_s)
    history[b] = history.get(b, 0.0) + mu / cfg.bucket_s
    horizon = b - int((cfg.max_days * cfg.period_s + cfg.trend_window_s) // cfg.bucket_s) - 2
    if b % 60 == 0:  # prune now and then, not on every sample
        for old in [k for k in history if k < horizon]:
            del history[old]


def _buckets(history: Mapping[int, float], start_t: float, end_t: float, cfg: SeasonalConfig) -> list[float]:
    return [history.get(b, 0.0) for b in range(int(start_t // cfg.bucket_s), int(end_t // cfg.bucket_s) + 1)]


def _median(values: list[float]) -> float:
    """The lower median: with two days, the quieter one (a spike seen once must not be scheduled)."""
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2]


def history_days(history: Mapping[int, float], *, now: float, cfg: SeasonalConfig) -> list[int]:
    """The past periods (1 = a period ago) that have any history at this time of day."""
    first = min(history, default=None)
    if first is None:
        return []
    return [d for d in range(1, cfg.max_days + 1) if (now - d * cfg.period_s) // cfg.bucket_s >= first]


def seasonal_forecast(history: Mapping[int, float], *, now: float, cfg: SeasonalConfig) -> dict:
    """The MU rate one lead time ahead from the history days, with how it was reached."""
    days = history_days(history, now=now, cfg=cfg)
    out: dict = {"days": len(days), "seasonal_mu_s": None, "level_ratio": None, "trend_mu_s": None}
    if days:
        ahead, past = [], []
        for d in days:
            then = now - d * cfg.period_s
            ahead.append(max(_buckets(history, then, then + cfg.lead_s + cfg.lookahead_margin_s, cfg)))
            past.append(_median(_buckets(history, then - cfg.level_window_s, then, cfg)))
        today = _median(_buckets(history, now - cfg.level_window_s, now - cfg.bucket_s, cfg))
        history_level = _median(past)
        ratio = today / history_level if history_level > 0 else cfg.level_clamp[1]
        ratio = min(max(ratio, cfg.level_clamp[0]), cfg.level_clamp[1])
        out["level_ratio"] = round(ratio, 3)
        out["seasonal_mu_s"] = _median(ahead) * ratio
    first, last = int((now - cfg.trend_window_s) // cfg.bucket_s), int(now // cfg.bucket_s) - 1
    points = [(b * cfg.bucket_s, history[b]) for b in range(first, last + 1) if b in history]
    if len(points) >= 3:
        n = len(points)
        mean_t = sum(t for t, _ in points) / n
        mean_d = sum(v for _, v in points) / n
        var = sum((t - mean_t) ** 2 for t, _ in points)
        slope = sum((t - mean_t) * (v - mean_d) for t, v in points) / var if var else 0.0
        if slope > 0:
            out["trend_mu_s"] = mean_d + slope * (now + cfg.lead_s - mean_t)
    return out


def predicted_floor_mu(
    history: Mapping[int, float],
    *,
    now: float,
    mu_capacity_per_replica: float,
    seconds_per_request: float,
    cfg: SeasonalConfig = SeasonalConfig(),
) -> tuple[int, dict]:
    """Replicas to keep so the MU forecast one lead time ahead finds capacity running, and why.

    ``mu_capacity_per_replica``: in-flight MU a replica holds at its target concurrency; ``seconds_per_request``:
    how long a request stays in flight there (Little's law: in-flight MU = MU rate × seconds in flight)."""
    f = seasonal_forecast(history, now=now, cfg=cfg)
    candidates = {k: f[k] for k in ("seasonal_mu_s", "trend_mu_s") if f[k] is not None}
    source, rate = max(candidates.items(), key=lambda kv: kv[1], default=("none", 0.0))
    in_flight_mu = rate * seconds_per_request
    floor = math.ceil(in_flight_mu / (mu_capacity_per_replica * cfg.target_utilization)) if in_flight_mu > 0 else 0
    if not f["days"]:
        why = "no history (new endpoint): trend only"
    elif source == "seasonal_mu_s":
        why = f"median of {f['days']} history day(s) at this hour, ×{f['level_ratio']:.2f} for today's level"
    elif source == "trend_mu_s":
        why = "recent trend above what history expects"
    else:
        why = "nothing forecast"
    if f["level_ratio"] is not None and not 0.5 <= f["level_ratio"] <= 1.5:
        why += " (today differs from history: level corrected)"
    details = {**f, "source": source, "forecast_mu_s": round(rate, 4), "floor": floor, "why": why}
    return floor, details
