"""Selective disaggregation's prompt-length threshold on the console (docs/disaggregation.md, "The threshold in the
console"): the last hour's prompts of an endpoint (their rate, the mean and spread of their uncached tokens, and the
share under its configured ``pd_min_uncached_tokens``, which go straight to decode), and the threshold the P/D planner
recommended the last time an operator planned for it, kept in the shared store."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Avg, Count, F, IntegerField, Max, Q, StdDev
from django.db.models.functions import Cast

from billing.models import UsageRecord
from capacity.autoscaling import store
from endpoints.models import Endpoint

log = logging.getLogger(__name__)

WINDOW = timedelta(hours=1)
# The bounds of the prompt-length ranges: the planner's candidate thresholds (0 and powers of two from 64), so the
# share it reads under each of them from the ranges is the share measured.
RANGE_BOUNDS = tuple(2**k for k in range(6, 24))
RECOMMENDATION_KEY = "infercap:console:pd-threshold:{endpoint_id}"
RECOMMENDATION_TTL_S = 7 * 24 * 3600  # a week: a plan on a workload older than that is worth making again


@dataclass
class PromptMix:
    """The last hour's prompts of one endpoint, against a threshold of ``threshold`` uncached tokens."""

    threshold: int
    prompts: int = 0
    under: int = 0  # prompts with fewer uncached tokens than the threshold: straight to decode
    arrival_rate_per_s: float = 0.0
    uncached_mean: float | None = None
    uncached_sd: float | None = None
    output_mean: float | None = None
    # (prompts, lowest, highest) per range of uncached tokens between the bounds, for ``PDWorkload.prompt_ranges``
    ranges: list[tuple[int, int, int]] = field(default_factory=list)

    @property
    def under_share(self) -> float | None:
        return self.under / self.prompts if self.prompts else None


def prompt_mix(*, endpoint: Endpoint, now: datetime, threshold: int | None = None) -> PromptMix:
    """One aggregate over the endpoint's usage records of the last hour (every tenant's: callers show it only to those
    who see the whole endpoint)."""
    threshold = endpoint.pd_min_uncached_tokens if threshold is None else threshold
    uncached = Cast(F("input_tokens") - F("cached_tokens"), IntegerField())
    rows = UsageRecord.objects.filter(
        endpoint=endpoint, finished_at__gte=now - WINDOW, finished_at__lt=now, input_tokens__gt=0
    ).annotate(uncached=uncached)
    bounds = sorted(set(RANGE_BOUNDS) | ({threshold} if threshold > 0 else set()))
    figures = rows.aggregate(
        prompts=Count("id"),
        under=Count("id", filter=Q(uncached__lt=threshold)),
        uncached_mean=Avg("uncached"),
        uncached_sd=StdDev("uncached"),
        uncached_max=Max("uncached"),
        output_mean=Avg("output_tokens"),
        **{f"under_{b}": Count("id", filter=Q(uncached__lt=b)) for b in bounds},
    )
    prompts = figures["prompts"] or 0
    return PromptMix(
        threshold=threshold,
        prompts=prompts,
        under=figures["under"] or 0,
        arrival_rate_per_s=prompts / WINDOW.total_seconds(),
        uncached_mean=figures["uncached_mean"],
        uncached_sd=figures["uncached_sd"],
        output_mean=figures["output_mean"],
        ranges=_ranges(figures, bounds, prompts),
    )


def _ranges(figures: dict, bounds: list[int], prompts: int) -> list[tuple[int, int, int]]:
    """The prompts between consecutive bounds (the last range up to the longest prompt), empty ranges left out."""
    out, below, low = [], 0, 0
    longest = max(0, figures["uncached_max"] or 0)
    for bound in bounds:
        count = (figures[f"under_{bound}"] or 0) - below
        if count:
            out.append((count, low, min(bound, longest)))
        below, low = below + count, bound
        if below >= prompts:
            return out
    out.append((prompts - below, low, max(low, longest)))
    return out


def ranges_text(ranges: list[tuple[int, int, int]]) -> str:
    """The ranges as the planner form takes them: one ``prompts lowest highest`` a line."""
    return "\n".join(f"{count} {low} {high}" for count, low, high in ranges)


def remember_recommendation(*, endpoint_id: int, plan, engine_profile: str, at: datetime) -> dict:
    """Keep what a P/D plan for the endpoint said of the threshold, for its page: the threshold planned with and its
    share, and the recommended one with its share and pools."""
    best = plan.threshold or {}
    entry = {
        "planned_tokens": plan.min_uncached_tokens,
        "planned_share": plan.bypass_share,
        "planned_gpus": plan.disaggregated_gpus,
        "tokens": best.get("recommended_min_uncached_tokens"),
        "share": best.get("bypass_share"),
        "gpus": best.get("gpus"),
        "usd_per_hour": best.get("usd_per_hour"),
        "engine_profile": engine_profile,
        "at": at.isoformat(),
    }
    try:
        store.client().set(
            RECOMMENDATION_KEY.format(endpoint_id=endpoint_id), json.dumps(entry), ex=RECOMMENDATION_TTL_S
        )
    except store.RedisError as exc:
        log.warning("P/D threshold of endpoint %s not kept: %s", endpoint_id, exc)
    return entry


def recommendation(endpoint_id: int) -> dict | None:
    """The last P/D plan's threshold for the endpoint, or None (never planned, expired, or the store unreadable)."""
    try:
        raw = store.client().get(RECOMMENDATION_KEY.format(endpoint_id=endpoint_id))
        entry = json.loads(raw) if raw else None
    except (store.RedisError, ValueError):
        return None
    if not isinstance(entry, dict):
        return None
    try:
        entry["at"] = datetime.fromisoformat(entry["at"])
    except (KeyError, TypeError, ValueError):
        entry["at"] = None
    return entry


def endpoint_threshold(*, endpoint: Endpoint, now: datetime) -> dict | None:
    """The endpoint page's figures: for a disaggregated endpoint its threshold with the last hour's share under it, and
    the last plan's recommendation; None for an aggregated one (every prompt is served in one pool)."""
    if endpoint.serving_mode != "disaggregated":
        return None
    return {"mix": prompt_mix(endpoint=endpoint, now=now), "recommended": recommendation(endpoint.pk)}
