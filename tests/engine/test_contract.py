"""The simulator speaks what vLLM 0.32 speaks: the same requests (a corpus of bad input included) go to the real
engine (tests/engine's session fixture) and to a simulated replica process of the ``tiny-cpu`` profile, and every
divergence the platform could see is named (``simulator.contract``). Each test asserts there is none.

What is deliberately not compared (generated text, prompt token counts from two tokenizers, ids, timestamps,
how chunks split a text, the interleaving of ``n > 1`` streams) is listed in the contract module's docstring.
"""

from __future__ import annotations

import httpx
import pytest

from simulator import contract
from simulator.process import start_replica

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MAX_MODEL_LEN = 4096  # the tiny model's context, as the engine's /v1/models says


@pytest.fixture(scope="module")
def sim(engine):
    """A simulated replica serving the engine's model name, with the engine's model path as its ``root``."""
    with engine.client() as client:
        root = client.get("/v1/models").json()["data"][0]["root"]
    replica = start_replica(
        profile="tiny-cpu", speed=10.0, served_model_name=engine.model, profile_opts={"model_path": root}
    )
    try:
        yield replica
    finally:
        replica.stop()


@pytest.fixture(scope="module")
def clients(engine, sim):
    with httpx.Client(base_url=engine.url, timeout=180) as e, httpx.Client(base_url=sim.url, timeout=180) as s:
        yield e, s


def assert_agree(divergences: list[str]) -> None:
    assert not divergences, "the simulator diverges from vLLM:\n  " + "\n  ".join(divergences)


def test_routes_models_health_and_version_agree(clients):
    engine, sim = clients
    divergences = []
    for case in contract.route_cases():
        divergences += contract.compare_case(
            case,
            contract.ask(engine, case.method, case.path, body=case.body),
            contract.ask(sim, case.method, case.path, body=case.body),
        )
    cards = [contract.ask(c, "GET", "/v1/models").body["data"][0] for c in clients]
    for key in ("id", "root", "max_model_len", "owned_by"):
        if cards[0][key] != cards[1][key]:
            divergences.append(f"models: {key} engine {cards[0][key]!r} simulator {cards[1][key]!r}")
    assert_agree(divergences)


@pytest.mark.parametrize("case", contract.served_cases(), ids=lambda case: case.name)
def test_served_requests_agree(clients, engine, case):
    assert_agree(contract.run_case(case, *clients, model=engine.model))


@pytest.mark.parametrize("case", contract.refused_cases(MAX_MODEL_LEN), ids=lambda case: case.name)
def test_bad_input_is_refused_alike(clients, engine, case):
    assert_agree(contract.run_case(case, *clients, model=engine.model))


def test_prefix_cache_accounting_agrees(clients, engine):
    """A full repeat caches (prompt − 1) // block whole blocks, counted in tokens; n = 3 siblings hit the first."""
    engine_client, sim_client = clients
    engine_facts = contract.prefix_cache_facts(engine_client, engine.model, "engine")
    assert not engine_facts, f"the engine broke the contract's own assumptions: {engine_facts}"
    assert_agree(contract.prefix_cache_facts(sim_client, engine.model, "simulator"))


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_stop_strings_end_the_answer_alike(clients, engine, stream):
    engine_client, sim_client = clients
    engine_facts = contract.stop_string_facts(engine_client, engine.model, "engine", stream=stream)
    assert not engine_facts, f"the engine broke the contract's own assumptions: {engine_facts}"
    assert_agree(contract.stop_string_facts(sim_client, engine.model, "simulator", stream=stream))


def test_metric_families_types_and_labels_agree(clients, engine):
    engine_client, sim_client = clients
    for client in clients:  # every series has moved at least once
        client.post("/v1/completions", json={"model": engine.model, "prompt": "hi", "max_tokens": 2})
    assert_agree(contract.compare_metrics(engine_client, sim_client))
