"""The prefill pool's decision, taken inside a disaggregated endpoint's horizontal tick (``ticks.horizontal_tick``).

One tick decides both pools under the endpoint's one horizontal lock, so a single reconcile converges them and two
workers can never launch for the same pool at once. The decode pool is the endpoint's own horizontal decision (the
proxies' demand reports, in MU); the prefill pool is ``capacity.autoscaling.prefill.decide`` on what the prefill
replicas' own ``/metrics`` say: computed prompt tokens per second (counters diffed between ticks, kept in Redis),
prompts waiting and the TTFT p95 of the last cycle. Its decision is stored on the ``prefill`` axis with its inputs
and reason, as the other axes' are. docs/disaggregation.md#autoscaling-two-pools.
"""

import logging
from dataclasses import replace

from django.db.models import F

from capacity.autoscaling import prefill, replica_metrics, store
from capacity.autoscaling.services import ACTIVE, owner_suspended, prefill_pool, scrape_replica
from capacity.models import AutoscalerDecision
from capacity.unit_resolver import prefill_coefficients
from endpoints.models import Endpoint, ReplicaState, ServingMode

log = logging.getLogger(__name__)

PREFILL = AutoscalerDecision.Axis.PREFILL


def prefill_decision(endpoint: Endpoint, *, tick: str, now: float, store_row) -> AutoscalerDecision | None:
    """Decide the prefill pool's count, store the decision (``store_row``: the ticks' idempotent writer) and set
    ``Endpoint.prefill_desired_replicas``; None for an aggregated endpoint or a tick already decided."""
    if endpoint.serving_mode != ServingMode.DISAGGREGATED:
        return None
    inputs = prefill_inputs(endpoint, now=now)
    if owner_suspended(endpoint):
        inputs = replace(inputs, min_replicas=0, max_replicas=0)
    decision = prefill.decide(inputs)
    desired = 0 if owner_suspended(endpoint) else decision.desired
    row = store_row(endpoint, PREFILL, tick, decision.current, desired, decision.reason, decision.inputs, at=now)
    if row is None:
        return None
    if desired != endpoint.prefill_desired_replicas:
        Endpoint.objects.filter(pk=endpoint.pk).update(prefill_desired_replicas=desired)
        endpoint.prefill_desired_replicas = desired
    return row


def prefill_inputs(endpoint: Endpoint, *, now: float) -> prefill.PrefillInputs:
    members = list(prefill_pool(endpoint).filter(state__in=ACTIVE, is_standby=False, terminate_at__isnull=True))
    ready = [r for r in members if r.state == ReplicaState.READY]
    rate, waiting, ttft, scraped = 0.0, 0.0, [], 0
    for replica in ready:
        scrape = scrape_replica(replica)
        if scrape is None:
            continue
        scraped += 1
        waiting += scrape.waiting
        key = store.PREFILL_COUNTER_KEY.format(replica_id=replica.pk)
        before = store.load_json(key) or {}
        tokens = replica_metrics.computed_prompt_tokens(scrape)
        now_ttft = scrape.buckets(replica_metrics.TTFT)
        try:
            dt, dtokens = now - float(before["t"]), tokens - float(before["tokens"])
            if dt > 0 and dtokens >= 0:  # a restart resets the counter: no rate from that pair
                rate += dtokens / dt
        except (KeyError, TypeError, ValueError):
            pass  # its first read: no rate yet
        ttft.append(replica_metrics.diff(now_ttft, _hist(before.get("ttft"))))
        store.save_json(key, {"t": now, "tokens": tokens, "ttft": [[str(b), c] for b, c in now_ttft.items()]})
    window = store.push_sample(endpoint.pk, {"t": now, "tokens_per_s": rate}, key_format=store.PREFILL_SAMPLES_KEY)
    samples = []
    for s in window:
        try:
            samples.append(prefill.RateSample(t=float(s["t"]), tokens_per_s=float(s["tokens_per_s"])))
        except (KeyError, TypeError, ValueError):
            continue
    p95 = replica_metrics.quantile(replica_metrics.merge(ttft))
    last_up, last_down = _last_moves(endpoint)
    return prefill.PrefillInputs(
        now=now,
        samples=samples,
        ready=len(ready),
        starting=len(members) - len(ready),
        min_replicas=endpoint.prefill_min_replicas,
        max_replicas=endpoint.prefill_max_replicas,
        tokens_per_s_per_replica=_capacity(endpoint),
        ttft_p95_ms=None if p95 is None else p95 * 1000.0,
        ttft_slo_ms=float(endpoint.ttft_slo_ms),
        waiting=waiting,
        last_scale_up_at=last_up,
        last_scale_down_at=last_down,
        scraped=scraped,
    )


def _capacity(endpoint: Endpoint) -> float | None:
    try:
        coeffs = prefill_coefficients(endpoint)
    except (ValueError, AttributeError) as exc:
        log.warning("endpoint %s: no prefill coefficients (%s)", endpoint.pk, exc)
        return None
    return prefill.tokens_per_s_capacity(mu_per_min=coeffs.mu_per_min, alpha=coeffs.alpha)


def _hist(rows) -> dict[float, float] | None:
    if not rows:
        return None
    try:
        return {float(b): float(c) for b, c in rows}  # "inf" parses as math.inf
    except (TypeError, ValueError):
        return None


def _last_moves(endpoint: Endpoint) -> tuple[float | None, float | None]:
    applied = AutoscalerDecision.objects.filter(endpoint=endpoint, axis=PREFILL, applied=True)
    up = applied.filter(desired__gt=F("current")).order_by("-at").values_list("at", flat=True).first()
    down = applied.filter(desired__lt=F("current")).order_by("-at").values_list("at", flat=True).first()
    return (up.timestamp() if up else None), (down.timestamp() if down else None)
