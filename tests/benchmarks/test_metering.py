"""``bench metering``: the books reconcile the replicas' own counters with the usage records (pure arithmetic
below); the run against a real proxy and simulated replicas meets every goal in tests/benchmarks/test_smoke.py."""

import pytest

from benchmarks.billing.metering_books import Charge, Phase, Tokens, by_kind, goals, phase_books, summarize
from capacity.units import MUCoefficients

COEFFS = MUCoefficients(alpha=0.001, alpha_cached=0.0002, beta=0.01, gamma=0.05, mu_per_min=1000)
TENANT, OTHER = 1, 2


def charge(rid, *, prompt=0, cached=0, output=0, tenant=TENANT, factor=1.0, mu=None, status="ok"):
    tokens = Tokens(prompt, cached, output)
    if mu is None:  # the list price: what a correct proxy charges
        mu = factor * (COEFFS.alpha * (prompt - cached) + COEFFS.alpha_cached * cached + COEFFS.beta * output)
        mu += factor * COEFFS.gamma
    return Charge(rid, tenant, tokens, mu, adapter_factor=factor, status=status)


def phase(computed, charges, *, sent=None, ids=None, strays=()):
    return Phase(
        kind="k",
        tenant_id=TENANT,
        sent=len(charges) if sent is None else sent,
        response_ids=[c.request_id for c in charges] if ids is None else ids,
        computed=computed,
        charges=list(charges),
        strays=list(strays),
        coeffs=COEFFS,
    )


def test_records_at_their_list_price_balance_the_engine_counters():
    books = phase_books(
        phase(
            Tokens(300, 100, 50), [charge("a", prompt=200, cached=100, output=30), charge("b", prompt=100, output=20)]
        )
    )
    assert books.unbilled_work == pytest.approx(0) and books.overbilled_work == pytest.approx(0)
    assert books.computed_work == pytest.approx(0.001 * 200 + 0.0002 * 100 + 0.01 * 50)
    assert (books.lost, books.duplicates, books.misattributed_work) == (0, 0, 0)


def test_a_record_of_tokens_at_zero_mu_charges_none_of_them():
    # The disconnect before the usage chunk: 390 output tokens recorded, 0 MU charged.
    books = phase_books(phase(Tokens(10, 0, 390), [charge("a", prompt=10, output=390, mu=0.0)]))
    assert books.billed == Tokens(0, 0, 0)
    assert books.unbilled_work == pytest.approx(books.computed_work) == pytest.approx(0.01 + 3.9)


def test_an_adapter_record_is_read_at_the_adapter_price_and_half_price_charges_half():
    full = phase_books(phase(Tokens(100, 0, 10), [charge("a", prompt=100, output=10, factor=1.1)]))
    assert full.unbilled_work == pytest.approx(0)
    half_mu = 0.5 * 1.1 * (0.1 + 0.1 + 0.05)
    half = phase_books(phase(Tokens(100, 0, 10), [charge("a", prompt=100, output=10, factor=1.1, mu=half_mu)]))
    assert half.unbilled_work == pytest.approx(0.5 * (0.1 + 0.1))


def test_an_adapter_load_charged_with_a_request_is_set_apart_not_read_as_tokens():
    # 0.25 MU of list price plus 3 MU for the load the request caused: its tokens balance, the load is its own line.
    listed = charge("a", prompt=100, output=10, factor=1.0)
    loaded = Charge("a", TENANT, listed.tokens, listed.mu + 3.0, load_mu=3.0)
    books = phase_books(phase(Tokens(100, 0, 10), [loaded]))
    assert books.overbilled_work == pytest.approx(0) and books.unbilled_work == pytest.approx(0)
    assert (books.adapter_loads, books.adapter_load_mu) == (1, 3.0)
    total = summarize([books, phase_books(phase(Tokens(100, 0, 10), [listed]))])
    assert (total["adapter_loads"], total["adapter_load_mu"]) == (1, 3.0)


def test_a_resumed_streams_second_prefill_is_charged_to_the_operators_not_unbilled():
    # The engine prefilled 100 prompt tokens, then 140 again on the replica that resumed the stream (100 + 40 sent).
    resumed = Charge("a", TENANT, Tokens(100, 0, 60), charge("a", prompt=100, output=60).mu, platform_prompt=140)
    books = phase_books(phase(Tokens(240, 0, 60), [resumed]))
    assert books.unbilled_work == pytest.approx(0) and books.overbilled_work == pytest.approx(0)
    assert books.platform_prompt == 140 and summarize([books])["platform_prompt_tokens"] == 140
    unrecorded = phase_books(phase(Tokens(240, 0, 60), [charge("a", prompt=100, output=60)]))
    assert unrecorded.unbilled_work == pytest.approx(140 * COEFFS.alpha)


def test_prefill_billed_too_much_does_not_hide_decode_billed_too_little():
    # The engine prefilled nothing (aborted before its first token) but decoded 50 tokens of another request.
    books = phase_books(phase(Tokens(0, 0, 50), [charge("a", prompt=1000), charge("b", output=0)]))
    assert books.overbilled_work == pytest.approx(1.0)  # 1000 prompt tokens billed, none computed
    assert books.unbilled_work == pytest.approx(0.5)  # 50 output tokens computed, none billed


def test_lost_duplicated_and_misattributed_records():
    lost = phase_books(phase(Tokens(), [charge("a")], sent=3, ids=["a", "b"]))
    assert (lost.lost, lost.duplicates) == (2, 0)
    missing_id = phase_books(phase(Tokens(), [charge("a"), charge("x")], sent=2, ids=["a", "b"]))
    assert missing_id.lost == 1  # as many records as requests, but one answered id has none
    duplicated = phase_books(phase(Tokens(), [charge("a"), charge("a2")], sent=1, ids=["a"]))
    assert duplicated.duplicates == 1
    wrong = phase_books(
        phase(
            Tokens(100, 0, 10),
            [charge("a", prompt=100, output=10, tenant=OTHER)],
            strays=[charge("s", output=10, tenant=OTHER), charge("t", output=10, tenant=TENANT)],
        )
    )
    assert wrong.misattributed_work == pytest.approx(0.1 + 0.1 + 0.1)  # its own record and one stray of OTHER
    assert wrong.unbilled_work == pytest.approx(0.2)  # nothing charged to the tenant that sent it


def test_totals_are_fractions_of_the_computed_work_and_goals_say_pass_or_fail():
    good = phase_books(phase(Tokens(100, 0, 10), [charge("a", prompt=100, output=10)]))
    free = phase_books(phase(Tokens(0, 0, 10), [charge("b", output=10, mu=0.0)]))
    total = summarize([good, free])
    assert total["unbilled_fraction"] == pytest.approx(0.1 / 0.3, abs=1e-6)
    assert total["overbilled_fraction"] == 0 and total["requests"] == 2
    checks = goals(total, kinds=12)
    assert not checks["unbilled_fraction"]["passed"] and checks["kinds"]["passed"]
    assert checks["lost_records"]["passed"] and checks["duplicate_records"]["passed"]
    assert set(by_kind([good, free])) == {"k"}
    assert goals(summarize([good]), kinds=11)["kinds"]["passed"] is False
