"""``gateway.admission.brownout`` (pure): the degradation level, fair pain (refusals and degradations in
proportion to each tenant's excess over its reservation), the slot share under overload, and the fallback chain
rules."""

import random
from collections import Counter

import pytest

from gateway.admission import AdmissionController, QueuedItem
from gateway.admission.brownout import (
    LEVEL_DEGRADE_SHEDDABLE,
    LEVEL_DEGRADE_STANDARD,
    LEVEL_NORMAL,
    LEVEL_SHEDDING,
    FairPain,
    degradation_level,
    degraded_at,
    fallback_chain_error,
    slot_allowed,
    slot_share_cap,
)
from gateway.admission.controller import DEFAULT_MAX_AGE_S

LOAD = {"in_flight_mu": 0.0, "nominal_mu_per_s": 10.0}


def level_for(queued: dict[str, float], rate=10.0) -> int:
    order = ["critical", "standard", "sheddable"]

    def ahead(c):
        return sum(queued.get(k, 0.0) for k in order[: order.index(c) + 1])

    return degradation_level(mu_ahead_of=ahead, drain_mu_per_s=rate, max_age_s=DEFAULT_MAX_AGE_S)


def test_the_level_rises_with_the_queued_work_against_each_classs_max_age():
    assert level_for({}) == LEVEL_NORMAL
    assert level_for({"sheddable": 4.0}) == LEVEL_NORMAL  # 0.4 s of 2 s
    assert level_for({"sheddable": 6.0}) == LEVEL_DEGRADE_SHEDDABLE  # 0.6 s: past a quarter
    # 1.6 s: past three quarters of sheddable's 2 s, so sheddable is shed and standard degrades
    assert level_for({"sheddable": 16.0}) == LEVEL_DEGRADE_STANDARD
    assert level_for({"standard": 30.0}) == LEVEL_DEGRADE_STANDARD  # standard work delays sheddable too
    assert level_for({"standard": 100.0}) == LEVEL_SHEDDING  # 10 s: standard's max age
    assert level_for({"standard": 4.0}, rate=0.0) == LEVEL_SHEDDING  # nothing drains
    assert [degraded_at(c, 1) for c in ("critical", "standard", "sheddable")] == [False, False, True]
    assert [degraded_at(c, 3) for c in ("critical", "standard", "sheddable")] == [False, True, True]


def offer(pain: FairPain, load: dict[str, tuple[float, float]], seconds: float, refusals_per_s: float, rng):
    """Tenants offer ``load[t] = (MU/s, reserved MU/s)`` in 1 MU requests; ``refusals_per_s`` of them are refused,
    each time the victim fair pain picks among the tenants that sent something lately."""
    now, refused = 0.0, Counter()
    names = list(load)
    total_rate = sum(r for r, _ in load.values())
    debt = 0.0
    while now < seconds:
        now += rng.expovariate(total_rate)
        tenant = rng.choices(names, weights=[load[n][0] for n in names])[0]
        pain.arrived(tenant, 1.0, reserved_mu_per_s=load[tenant][1], now=now)
        debt += refusals_per_s / total_rate
        if debt >= 1.0:
            debt -= 1.0
            victim = pain.victim(names, now)
            pain.pained(victim, now)
            if now > pain.window_s:
                refused[victim] += 1
    return refused


def test_refusals_fall_in_proportion_to_each_tenants_excess_not_its_arrivals():
    # a: 30 MU/s on a 25 MU/s reservation (excess 5); b: 20 on 5 (excess 15); c: 10 with none (excess 10)
    load = {"a": (30.0, 25.0), "b": (20.0, 5.0), "c": (10.0, 0.0)}
    pain = FairPain(window_s=30.0)
    refused = offer(pain, load, seconds=120.0, refusals_per_s=20.0, rng=random.Random(3))
    total = sum(refused.values())
    shares = {t: refused[t] / total for t in load}
    assert shares == pytest.approx({"a": 5 / 30, "b": 15 / 30, "c": 10 / 30}, abs=0.05)
    # whoever arrives last (a, by volume half the arrivals) is not who pays
    assert shares["a"] < 0.25


def test_a_tenant_within_its_reservation_is_spared_while_another_exceeds_one():
    pain = FairPain(window_s=10.0)
    for i in range(100):
        pain.arrived("inside", 1.0, reserved_mu_per_s=100.0, now=i * 0.1)
        pain.arrived("over", 1.0, reserved_mu_per_s=0.0, now=i * 0.1)
    assert [pain.victim(["inside", "over"], 10.0) for _ in range(3)] == ["over"] * 3
    assert not any(pain.take_degrade_credit("inside", 10.0) for _ in range(10))
    assert all(pain.take_degrade_credit("over", 10.0) for _ in range(10))


def test_degradation_credit_follows_the_excess_fraction():
    pain = FairPain(window_s=10.0)
    for i in range(100):
        # half of "half"'s traffic is over its reservation: every second request of it is served shorter
        pain.arrived("half", 2.0, reserved_mu_per_s=10.0, now=i * 0.1)
    degraded = sum(pain.take_degrade_credit("half", 10.0) for _ in range(100))
    assert degraded == pytest.approx(50, abs=2)


def test_the_window_forgets_old_traffic_and_refusals():
    pain = FairPain(window_s=5.0)
    pain.arrived("old", 10.0, reserved_mu_per_s=0.0, now=0.0)
    pain.pained("old", 0.0)
    pain.arrived("new", 1.0, reserved_mu_per_s=0.0, now=10.0)
    assert pain.excess(10.0) == {"new": 1.0} and "old" not in pain.tenants


def item(rid, tenant, priority="sheddable", mu=1.0):
    return QueuedItem(request_id=rid, tenant=tenant, priority=priority, mu=mu, enqueued_at=0.0)


def test_a_long_request_at_an_empty_queue_is_queued_not_refused():
    # 3,000 MU is 300 s at 10 MU/s, but nothing is queued ahead of it: it waits only for the next free slot
    admission = AdmissionController(now=0.0)
    admission.arrived(tenant="t", mu=3000.0, reserved_mu_per_s=0.0, now=0.0)
    outcome = admission.enqueue(item("long", "t", mu=3000.0), now=0.0, has_replicas=True, scale_to_zero=False, **LOAD)
    assert outcome.admitted and outcome.refused is None


def test_a_request_that_would_wait_too_long_refuses_the_tenant_that_owes_the_most():
    admission = AdmissionController(now=0.0)
    for _ in range(20):
        admission.arrived(tenant="heavy", mu=1.0, reserved_mu_per_s=0.0, now=0.0)
    admission.arrived(tenant="light", mu=1.0, reserved_mu_per_s=0.0, now=0.0)
    # 14 MU of sheddable work queued at 10 MU/s: 1.4 s, short of 3/4 of 2 s
    for i in range(14):
        assert admission.enqueue(
            item(f"h{i}", "heavy"), now=0.0, has_replicas=True, scale_to_zero=False, **LOAD
        ).admitted
    # light's request would wait 1.5 s: heavy owes the refusals (20 of 21 MU offered), so its newest queued goes
    outcome = admission.enqueue(item("l0", "light"), now=0.0, has_replicas=True, scale_to_zero=False, **LOAD)
    assert outcome.admitted and [(r.item.request_id, r.reason) for r in outcome.evicted] == [("h13", "evicted")]
    # heavy's own next one is refused at arrival
    refused = admission.enqueue(item("h14", "heavy"), now=0.0, has_replicas=True, scale_to_zero=False, **LOAD)
    assert refused.refused.reason == "overloaded" and 1 <= refused.refused.retry_after_s <= 60
    # a critical request is never the victim of sheddable work's wait
    assert admission.enqueue(
        item("c", "light", "critical"), now=0.0, has_replicas=True, scale_to_zero=False, **LOAD
    ).admitted


def test_a_saturated_queue_judges_waits_by_the_measured_rate_not_an_optimistic_profile():
    # The profile claims 100 MU/s; the replicas really finish 2 MU/s. 14 MU queued is 0.14 s at the profile's
    # rate and 7 s at the real one: only the measured rate can tell that sheddable work will expire.
    profile = {"in_flight_mu": 0.0, "nominal_mu_per_s": 100.0}
    admission = AdmissionController(now=0.0, drain_tau_s=10.0)
    t = 0.0
    while t < 30.0:  # 30 s of completions at 2 MU/s fill the drain meter's window
        admission.finished(mu_done=1.0, now=t)
        t += 0.5
    assert admission.drain.rate_mu_per_s(t) == pytest.approx(2.0, rel=0.1)
    for _ in range(20):
        admission.arrived(tenant="heavy", mu=1.0, reserved_mu_per_s=0.0, now=t)
    admission.arrived(tenant="light", mu=1.0, reserved_mu_per_s=0.0, now=t)

    def offer(rid, tenant, now):
        return admission.enqueue(item(rid, tenant), now=now, has_replicas=True, scale_to_zero=False, **profile)

    for i in range(14):
        assert offer(f"h{i}", "heavy", t).admitted
    # just saturated: the optimistic rate (the profile's) rules, nobody is refused early
    assert admission.overload_rate(t, 100.0) == 100.0
    assert offer("h14", "heavy", t).admitted
    # the queue has held requests for the meter's whole window: the measured rate rules, and fair pain picks heavy
    later = t + admission.drain.tau_s
    assert admission.overload_rate(later, 100.0) == pytest.approx(admission.drain.rate_mu_per_s(later))
    outcome = offer("l0", "light", later)
    assert outcome.admitted and [r.reason for r in outcome.evicted] == ["evicted"]
    assert outcome.evicted[0].item.tenant == "heavy"
    assert offer("h15", "heavy", later).refused.reason == "overloaded"
    # once the queue empties the next overload starts optimistic again
    while admission.next_to_serve(later) is not None:
        pass
    assert admission.overload_rate(later, 100.0) == 100.0


def test_without_fair_pain_the_same_queue_takes_everyone():
    admission = AdmissionController(now=0.0, fair_pain=False)
    for i in range(16):
        assert admission.enqueue(
            item(f"h{i}", "heavy"), now=0.0, has_replicas=True, scale_to_zero=False, **LOAD
        ).admitted


def test_fallback_chains_without_loops_and_within_the_depth():
    assert fallback_chain_error(1, {1: 2, 2: None}) is None
    assert fallback_chain_error(1, {1: 2, 2: 3}) is None  # two steps
    assert fallback_chain_error(1, {1: 2, 2: 3, 3: 4}) == "depth"
    assert fallback_chain_error(1, {1: 2, 2: 1}) == "loop"
    assert fallback_chain_error(1, {1: 1}) == "loop"


def test_a_class_refused_for_overload_lately_keeps_the_level_at_its_shedding_level():
    admission = AdmissionController(now=0.0)
    admission.arrived(tenant="t", mu=21.0, reserved_mu_per_s=0.0, now=0.0)
    ahead = item("small", "t", mu=1.0)
    assert admission.enqueue(ahead, now=0.0, has_replicas=True, scale_to_zero=False, **LOAD).admitted
    refused = admission.enqueue(item("big", "t", mu=20.0), now=0.0, has_replicas=True, scale_to_zero=False, **LOAD)
    assert refused.refused.reason == "overloaded"
    assert admission.remove(ahead) and not len(admission.queue)
    # the queue is empty, but sheddable work is being refused: it is served shorter now, standard work too
    assert admission.level(now=1.0, nominal_mu_per_s=10.0) == LEVEL_DEGRADE_STANDARD
    assert admission.degrade(tenant="t", priority="standard", now=1.0, nominal_mu_per_s=10.0)
    assert admission.level(now=2.5, nominal_mu_per_s=10.0) == LEVEL_NORMAL


def test_a_slot_share_caps_the_degraded_classes_together_and_never_critical():
    half = {"limit": 4, "share": 0.5}
    # level 1: sheddable holds at most 2 of 4 slots; standard and critical are not held back
    assert slot_allowed("sheddable", LEVEL_DEGRADE_SHEDDABLE, running={"sheddable": 1}, **half)
    assert not slot_allowed("sheddable", LEVEL_DEGRADE_SHEDDABLE, running={"sheddable": 2}, **half)
    assert slot_allowed("standard", LEVEL_DEGRADE_SHEDDABLE, running={"sheddable": 2, "standard": 1}, **half)
    # level 2: standard degrades too, and the two share the 2 slots
    assert not slot_allowed("standard", LEVEL_DEGRADE_STANDARD, running={"sheddable": 1, "standard": 1}, **half)
    assert slot_allowed("standard", LEVEL_DEGRADE_STANDARD, running={"critical": 2, "standard": 1}, **half)
    for level in (LEVEL_NORMAL, LEVEL_DEGRADE_SHEDDABLE, LEVEL_DEGRADE_STANDARD, LEVEL_SHEDDING):
        assert slot_allowed("critical", level, running={"sheddable": 4, "standard": 4}, **half)
    # not overloaded: no share at all; no policy: no share at any level
    assert slot_allowed("sheddable", LEVEL_NORMAL, running={"sheddable": 3}, **half)
    assert slot_allowed("sheddable", LEVEL_SHEDDING, running={"sheddable": 3}, limit=4, share=None)
    assert slot_share_cap(4, 0.0) == 0 and slot_share_cap(8, 0.3) == 2 and slot_share_cap(4, 1.0) == 4


def test_the_controller_holds_sheddable_back_only_once_its_queue_says_overload():
    controller = AdmissionController(now=0.0)
    replicas = {"r0": ({"sheddable": 2}, 4), "r1": ({"sheddable": 1}, 4)}
    args = {"share": 0.5, "now": 0.0, "nominal_mu_per_s": 10.0}
    assert controller.held_back("sheddable", replicas, **args) is None  # nothing queued: level 0, not in force
    for i in range(6):  # 6 MU of sheddable work queued at 10 MU/s: 0.6 s of its 2 s max age, level 1
        item = QueuedItem(request_id=f"q{i}", tenant="t", priority="sheddable", mu=1.0, enqueued_at=0.0)
        assert controller.enqueue(item, now=0.0, has_replicas=True, scale_to_zero=False, **LOAD).admitted
    assert controller.level(now=0.0, nominal_mu_per_s=10.0) == LEVEL_DEGRADE_SHEDDABLE
    assert controller.held_back("sheddable", replicas, **args) == {"r0"}  # r0's half is taken, r1 has one left
    assert controller.held_back("critical", replicas, **args) is None
    assert controller.held_back("sheddable", replicas, share=None, now=0.0, nominal_mu_per_s=10.0) is None
    assert controller.next_class() == "sheddable"
