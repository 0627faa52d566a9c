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
