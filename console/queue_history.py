"""Queue depth by priority class over time, for the endpoint page's chart.

The proxy only publishes the current depth (Redis hash ``infercap:demand:{endpoint_id}``, one field per process);
a beat task samples it every few seconds into a capped Redis list per endpoint, which the chart reads back.
"""

from __future__ import annotations

import json
import logging
import time

from console.live import redis_client
from console.selectors import PRIORITY_CLASSES, queue_depth

logger = logging.getLogger(__name__)

HISTORY_KEY = "infercap:console:queue:{endpoint_id}"
SAMPLE_EVERY_S = 5.0
KEPT = 720  # one hour at one sample every 5 s


def _client():
    return redis_client()


def queue_sample(*, endpoint_ids: list[int], now: float | None = None) -> int:
    """Append the current depth of each endpoint to its history; returns how many samples were stored."""
    client = _client()
    if client is None:
        return 0
    now = time.time() if now is None else now
    pipe = client.pipeline(transaction=False)
    for endpoint_id in endpoint_ids:
        sample = {"t": round(now, 3), **queue_depth(endpoint_id)}
        key = HISTORY_KEY.format(endpoint_id=endpoint_id)
        pipe.rpush(key, json.dumps(sample))
        pipe.ltrim(key, -KEPT, -1)
        pipe.expire(key, 2 * 3600)  # an endpoint that is gone stops being sampled; its history goes with it
    pipe.execute()
    return len(endpoint_ids)


def queue_history(endpoint_id: int, *, since: float) -> dict[str, list[tuple[float, float]]]:
    """Per priority class, (t, queued) points since ``since`` (oldest first); empty without Redis."""
    series: dict[str, list[tuple[float, float]]] = {cls: [] for cls in PRIORITY_CLASSES}
    client = _client()
    if client is None:
        return series
    try:
        raw_samples = client.lrange(HISTORY_KEY.format(endpoint_id=endpoint_id), 0, -1)
    except Exception:  # Redis down: the chart says "no data" instead of failing the page
        logger.warning("queue history unreadable for endpoint %s", endpoint_id, exc_info=True)
        return series
    for raw in raw_samples:
        try:
            sample = json.loads(raw)
        except (TypeError, ValueError):
            continue
        if not isinstance(sample, dict) or sample.get("t", 0) < since:
            continue
        for cls in PRIORITY_CLASSES:
            series[cls].append((float(sample["t"]), float(sample.get(cls, 0))))
    return series
