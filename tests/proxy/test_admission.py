"""The pure admission policy: classes, DRR fairness, age shedding, bounded queue, Retry-After."""

import pytest

from gateway.admission import (
    AdmissionQueue,
    DrainRateMeter,
    QueuedItem,
    effective_priority,
    retry_after_s,
)

AGES = {"critical": 30.0, "standard": 10.0, "sheddable": 2.0}


def item(rid, tenant="a", priority="standard", mu=1.0, at=0.0):
    return QueuedItem(request_id=rid, tenant=tenant, priority=priority, mu=mu, enqueued_at=at)


def test_priority_from_reservation_capped_by_key_and_only_lowered_by_header():
    assert effective_priority(key_max="standard", reservation="critical") == "standard"
    assert effective_priority(key_max="critical", reservation="critical") == "critical"
    assert effective_priority(key_max="critical", reservation=None) == "sheddable"
    assert effective_priority(key_max="standard", reservation="standard", requested="sheddable") == "sheddable"
    assert effective_priority(key_max="standard", reservation="standard", requested="critical") == "standard"
    with pytest.raises(ValueError):
        effective_priority(key_max="standard", reservation="standard", requested="urgent")


def test_strict_priority_across_classes_fcfs_inside_tenant():
    q = AdmissionQueue(max_size=10, max_age_s=AGES)
    for i, p in enumerate(["sheddable", "standard", "critical", "standard"]):
        assert q.offer(item(f"r{i}", priority=p, at=i), now=i).admitted
    order = [q.pop(now=5).request_id for _ in range(4)]
    assert order == ["r2", "r1", "r3", "r0"]
    assert q.pop(now=5) is None


def test_drr_shares_mu_fairly_between_tenants():
    # Tenant a sends large requests, tenant b small ones; service in MU should alternate evenly.
    q = AdmissionQueue(max_size=1000, max_age_s=AGES)
    for i in range(50):
        q.offer(item(f"a{i}", tenant="a", mu=8.0, at=i), now=i)
    for i in range(200):
        q.offer(item(f"b{i}", tenant="b", mu=2.0, at=100 + i), now=100 + i)
    served = {"a": 0.0, "b": 0.0}
    for _ in range(60):
        it = q.pop(now=400)
        served[it.tenant] += it.mu
    assert served["a"] > 0 and served["b"] > 0
    assert 0.8 < served["a"] / served["b"] < 1.25


def test_drr_does_not_let_one_tenant_burst_small_requests():
    # Tenant a queued six small requests before tenant b's two: b is served on the second and fourth turns.
    q = AdmissionQueue(max_size=100, max_age_s=AGES)
    for i in range(6):
        q.offer(item(f"a{i}", tenant="a", mu=0.15, at=i), now=i)
    for i in range(2):
        q.offer(item(f"b{i}", tenant="b", mu=0.15, at=10 + i), now=10 + i)
    order = [q.pop(now=20).tenant for _ in range(8)]
    assert order[:4] == ["a", "b", "a", "b"]


def test_queue_age_shedding_removes_only_over_age_requests():
    q = AdmissionQueue(max_size=10, max_age_s=AGES)
    q.offer(item("old-shed", priority="sheddable", at=0.0), now=0.0)
    q.offer(item("old-std", priority="standard", at=0.0), now=0.0)
    q.offer(item("new-shed", priority="sheddable", at=2.5), now=2.5)
    assert q.next_expiry() == 2.0
    expired = q.expire(now=3.0)
    assert [i.request_id for i in expired] == ["old-shed"]
    assert len(q) == 2
    assert [i.request_id for i in q.expire(now=5.0)] == ["new-shed"]
    assert [i.request_id for i in q.expire(now=10.5)] == ["old-std"]


def test_full_queue_rejects_sheddable_and_evicts_newest_sheddable_for_critical():
    q = AdmissionQueue(max_size=3, max_age_s=AGES)
    q.offer(item("s1", priority="sheddable", at=0), now=0)
    q.offer(item("s2", priority="sheddable", at=1), now=1)
    q.offer(item("c1", priority="critical", at=2), now=2)
    refused = q.offer(item("s3", priority="sheddable", at=3), now=3)
    assert not refused.admitted and refused.reason == "queue_full"
    res = q.offer(item("c2", priority="critical", at=4), now=4)
    assert res.admitted and [e.request_id for e in res.evicted] == ["s2"]
    res = q.offer(item("c3", priority="critical", at=5), now=5)
    assert [e.request_id for e in res.evicted] == ["s1"]
    assert not q.offer(item("c4", priority="critical", at=6), now=6).admitted
    assert q.depth_by_class() == {"critical": 3, "standard": 0, "sheddable": 0}


def test_remove_and_mu_accounting():
    q = AdmissionQueue(max_size=10, max_age_s=AGES)
    a, b = item("a", mu=3.0), item("b", tenant="t2", priority="critical", mu=2.0)
    q.offer(a, now=0)
    q.offer(b, now=0)
    assert q.queued_mu == 5.0 and q.mu_ahead_of("critical") == 2.0
    assert q.remove(a) and not q.remove(a)
    assert q.queued_mu == 2.0
    assert q.pop(now=1) is b and len(q) == 0


def test_drain_rate_and_retry_after():
    meter = DrainRateMeter(tau_s=5.0, now=0.0)
    for t in range(1, 51):
        meter.record(10.0, now=t / 10)  # 100 MU/s for 5 s
    rate = meter.rate_mu_per_s(now=5.0)
    assert 60 < rate < 140
    assert retry_after_s(queued_mu=500, drain_mu_per_s=rate) in range(4, 9)
    assert retry_after_s(queued_mu=10**9, drain_mu_per_s=rate) == 60
    assert retry_after_s(queued_mu=0, drain_mu_per_s=0) == 1
    assert meter.rate_mu_per_s(now=100.0) < 1.0  # nothing finished for a long time: no optimistic estimate
