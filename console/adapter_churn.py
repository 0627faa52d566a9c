"""Adapters per replica and their load churn for the endpoint page, from the reports every proxy process publishes
(``gateway.proxy.replica_adapters.lora_report`` under ``infercap:lora:{endpoint_id}``; docs/lora.md#the-console). A tenant
sees the names of the adapters it may use (``adapters_visible_to``); any other adapter a replica holds is a count."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field

from console.live import redis_client
from endpoints.models import Endpoint
from endpoints.selectors import adapters_visible_to
from tenants.selectors import principal_is_operator

logger = logging.getLogger(__name__)

LORA_REPORT_KEY = (
    "infercap:lora:{endpoint_id}"  # gateway.proxy.replica_adapters.LORA_REPORT_KEY (the proxy imports no console)
)
HELD_STALE_S = 30.0  # a process's list of held adapters older than this is not shown (it may have died)
CHURN_WINDOW_MINUTES = 5


@dataclass
class ReplicaLora:
    names: list[str] = field(default_factory=list)  # held adapters the viewer may see by name
    others: int = 0  # held adapters the viewer may not see by name
    loads: int = 0  # loads in the window, summed over proxy processes
    loads_per_min: float = 0.0


def merge_reports(raw_fields, *, now_s: float) -> dict[str, tuple[set[str], int]]:
    """Per replica id: the adapters any fresh report says it holds, and its loads in the last
    ``CHURN_WINDOW_MINUTES`` wall-clock minutes (the current one included) over every report."""
    first_minute = int(now_s // 60) - CHURN_WINDOW_MINUTES + 1
    merged: dict[str, tuple[set[str], int]] = {}
    for raw in raw_fields:
        try:
            report = json.loads(raw)
            fresh = now_s - float(report.get("t", 0)) <= HELD_STALE_S
            replicas = report.get("replicas") or {}
            for rid, entry in replicas.items():
                held, loads = merged.get(str(rid), (set(), 0))
                if fresh:
                    held |= {name for name in entry.get("held") or () if isinstance(name, str)}
                loads += sum(int(n) for minute, n in (entry.get("loads") or {}).items() if int(minute) >= first_minute)
                merged[str(rid)] = (held, loads)
        except (ValueError, TypeError, AttributeError):
            continue  # one unreadable report never hides the others
    return merged


def replica_lora(*, endpoint: Endpoint, viewer, now_s: float | None = None) -> dict[int, ReplicaLora]:
    """Per replica id of a LoRA endpoint, what the viewer may see of its adapters and churn; {} without LoRA or
    Redis."""
    if endpoint.lora[0] <= 0:
        return {}
    client = redis_client()
    if client is None:
        return {}
    try:
        fields = client.hgetall(LORA_REPORT_KEY.format(endpoint_id=endpoint.pk))
    except Exception:  # Redis down: the page renders without adapters
        logger.warning("LoRA reports unreadable for endpoint %s", endpoint.pk, exc_info=True)
        return {}
    merged = merge_reports(fields.values(), now_s=time.time() if now_s is None else now_s)
    named = None  # operators: every name
    if not principal_is_operator(viewer):
        named = set(adapters_visible_to(viewer).filter(endpoint=endpoint).values_list("name", flat=True))
    result = {}
    for rid, (held, loads) in merged.items():
        if not rid.isdigit():
            continue
        shown = sorted(held if named is None else held & named)
        result[int(rid)] = ReplicaLora(
            names=shown, others=len(held) - len(shown), loads=loads, loads_per_min=loads / CHURN_WINDOW_MINUTES
        )
    return result
