"""``AdmissionController``: the admission decisions the proxy and the simulators share (pure)."""

import pytest

from gateway.admission import DEFAULT_MAX_AGE_S, DEFAULT_MAX_QUEUE, AdmissionController, QueuedItem
from gateway.proxy.config import ProxyConfig

LOAD = {"in_flight_mu": 0.0, "nominal_mu_per_s": 10.0}


def item(rid, priority="standard", mu=1.0, at=0.0):
    return QueuedItem(request_id=rid, tenant="t", priority=priority, mu=mu, enqueued_at=at)


def test_the_defaults_are_the_proxys():
    # A simulation with the defaults admits as a proxy process with its default settings does
    config = ProxyConfig()
    assert (config.max_queue, config.max_age_s) == (DEFAULT_MAX_QUEUE, DEFAULT_MAX_AGE_S)


def test_a_request_skips_the_queue_only_when_nobody_waits():
    admission = AdmissionController()
    assert admission.may_skip_queue()
    assert admission.enqueue(item("a"), now=0.0, has_replicas=True, scale_to_zero=False, **LOAD).admitted
    assert not admission.may_skip_queue()
    assert admission.next_to_serve(1.0).request_id == "a" and admission.may_skip_queue()


def test_no_replica_is_refused_unless_the_endpoint_scales_from_zero():
    admission = AdmissionController()
    refused = admission.enqueue(item("a"), now=0.0, has_replicas=False, scale_to_zero=False, **LOAD).refused
    assert (refused.reason, refused.retry_after_s) == ("no_replica", 1)
    assert admission.enqueue(item("b"), now=0.0, has_replicas=False, scale_to_zero=True, **LOAD).admitted


def test_retry_after_counts_the_work_ahead_at_the_nominal_rate_then_the_measured_one():
    # Queue mechanics alone: with fair pain a 100 MU sheddable request behind 40 MU at 10 MU/s is refused at once
    admission = AdmissionController(now=0.0, fair_pain=False)
    for i in range(4):
        admission.enqueue(item(f"s{i}", mu=10.0), now=0.0, has_replicas=True, scale_to_zero=False, **LOAD)
    admission.enqueue(item("low", "sheddable", mu=100.0), now=0.0, has_replicas=True, scale_to_zero=False, **LOAD)
    # 40 MU of standard work queued + 20 in flight at the nominal 10 MU/s; sheddable work behind does not count
    assert admission.retry_after("standard", now=0.0, in_flight_mu=20.0, nominal_mu_per_s=10.0) == 6
    assert admission.retry_after("sheddable", now=0.0, in_flight_mu=20.0, nominal_mu_per_s=10.0) == 16
    for t in range(1, 101):  # then 2 MU/s finishes for 10 s: the measured rate replaces the nominal one
        admission.finished(mu_done=0.2, now=t / 10)
    assert admission.retry_after("standard", now=10.0, in_flight_mu=20.0, nominal_mu_per_s=10.0) == pytest.approx(
        30, abs=3
    )


def test_an_evicted_request_is_told_to_wait_behind_the_one_that_took_its_place():
    admission = AdmissionController(
        max_queue=1, fair_pain=False
    )  # the full queue alone (see tests/admission/test_brownout.py)
    admission.enqueue(item("low", "sheddable", mu=5.0), now=0.0, has_replicas=True, scale_to_zero=False, **LOAD)
    outcome = admission.enqueue(
        item("high", "critical", mu=30.0), now=0.1, has_replicas=True, scale_to_zero=False, **LOAD
    )
    assert outcome.admitted
    assert [(r.item.request_id, r.reason, r.retry_after_s) for r in outcome.evicted] == [("low", "evicted", 3)]
    refused = admission.enqueue(item("more", "sheddable"), now=0.2, has_replicas=True, scale_to_zero=False, **LOAD)
    assert (refused.refused.reason, refused.refused.retry_after_s) == ("queue_full", 3)


def test_expired_requests_are_shed_with_the_queue_age_reason():
    admission = AdmissionController()
    admission.enqueue(item("s", "sheddable", at=0.0), now=0.0, has_replicas=True, scale_to_zero=False, **LOAD)
    admission.enqueue(item("c", "critical", at=0.0), now=0.0, has_replicas=True, scale_to_zero=False, **LOAD)
    assert admission.next_expiry() == DEFAULT_MAX_AGE_S["sheddable"]
    assert admission.shed_expired(now=1.9, **LOAD) == []
    shed = admission.shed_expired(now=2.0, **LOAD)
    assert [(r.item.request_id, r.reason) for r in shed] == [("s", "queue_age")]
    assert admission.next_to_serve(2.0).request_id == "c"
