"""The overload simulator behind ``bench reliability``'s overload section (pure, virtual time): with one fallback
endpoint and the proxy's admission, critical traffic keeps its SLO, refusals follow the tenants' excess (and do
not without fair pain), and the fallback answers what the primary refuses."""

import dataclasses

from benchmarks.operations.overload import PRIMARY, simulate, tenants_at
from simulator.overload import OverloadRun


def test_at_ten_times_capacity_the_fallback_and_fair_pain_do_their_parts():
    figures = simulate(10.0, duration_s=30.0, warmup_s=5.0)
    no_fallback = simulate(10.0, duration_s=30.0, warmup_s=5.0, with_fallback=False)
    no_fair_pain = simulate(10.0, duration_s=30.0, warmup_s=5.0, fair_pain=False)
    assert figures["critical_slo_attainment"] >= 0.99
    assert figures["fallback_fraction"] > 0.3 and figures["degraded_fraction"] > 0.3
    assert figures["answered_fraction"] > no_fallback["answered_fraction"] + 0.3
    assert figures["fairness_max_dev"] <= 0.10 < no_fair_pain["fairness_max_dev"]
    total = figures["answered_fraction"] + figures["shed_fraction"]
    assert abs(total - 1.0) < 1e-3  # every request either answered or shed, none left behind


def test_the_same_seed_gives_the_same_figures():
    assert simulate(3.0, duration_s=15.0, warmup_s=5.0) == simulate(3.0, duration_s=15.0, warmup_s=5.0)


def test_the_simulator_honours_the_slot_share_and_marks_what_it_held():
    def primary_sheddable(share):
        run = OverloadRun(
            primary=dataclasses.replace(PRIMARY, degrade_slot_share=share),
            fallback=None,
            tenants=tenants_at(3.0),
            duration_s=15.0,
            seed=2,
        )
        outcomes = run.run()
        served = [o for o in outcomes if o.served_by == "primary" and o.priority == "sheddable"]
        return len(served), outcomes

    unlimited, _ = primary_sheddable(None)
    held, outcomes = primary_sheddable(0.0)  # under overload, sheddable gets no slot at all
    assert held < unlimited / 2
    critical = [o for o in outcomes if o.priority == "critical"]
    assert critical and all(o.status == "ok" for o in critical)
