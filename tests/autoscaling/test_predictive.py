"""The predictive floor: yesterday's peak one cold start ahead, and a rising trend."""

from capacity.autoscaling.predictive import PredictiveConfig, predicted_floor, record

DAY = 86_400.0
CFG = PredictiveConfig(lead_s=120.0)


def history_with(rates_by_minute):
    h = {}
    for minute, rps in rates_by_minute.items():
        record(h, t=minute * 60.0, arrivals=rps * 60.0, cfg=CFG)
    return h


def test_yesterdays_peak_raises_the_floor_one_lead_ahead():
    peak_minute = int(9 * 60)  # 09:00 yesterday: 20 req/s; everything else 1 req/s
    h = history_with({m: (20.0 if m == peak_minute else 1.0) for m in range(0, 24 * 60)})
    now = DAY + peak_minute * 60.0 - 100.0  # 100 s before today's 09:00
    floor, detail = predicted_floor(h, now=now, target_concurrency=10, seconds_per_request=3.5, cfg=CFG)
    # 20 req/s × 3.5 s = 70 in flight at 7 per replica → 10 replicas
    assert floor == 10 and detail["yesterday_rps"] == 20.0
    # an hour earlier the floor only covers the quiet level
    early, _ = predicted_floor(h, now=now - 3600, target_concurrency=10, seconds_per_request=3.5, cfg=CFG)
    assert early == 1


def test_rising_trend_is_extrapolated_but_a_falling_one_is_ignored():
    rising = history_with({m: float(m) for m in range(0, 11)})  # +1 req/s per minute
    floor, detail = predicted_floor(rising, now=600.0, target_concurrency=10, seconds_per_request=7.0, cfg=CFG)
    assert detail["trend_rps"] > 10  # ahead of the current 10 req/s
    assert floor >= 11
    falling = history_with({m: float(20 - m) for m in range(0, 11)})
    _, detail = predicted_floor(falling, now=600.0, target_concurrency=10, seconds_per_request=7.0, cfg=CFG)
    assert detail["trend_rps"] is None


def test_no_history_no_floor():
    assert predicted_floor({}, now=1000.0, target_concurrency=10, seconds_per_request=5.0)[0] == 0


def test_history_is_trimmed_to_a_day():
    h = {}
    for minute in range(0, 3 * 24 * 60, 7):
        record(h, t=minute * 60.0, arrivals=60.0, cfg=CFG)
    assert min(h) >= (3 * 24 * 60 - 24 * 60 - 15)
