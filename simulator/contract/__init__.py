"""The contract between the simulator and vLLM: the same requests to a real engine and to a simulated replica, and
every way their answers differ where the platform could tell (``tests/engine/test_contract.py``).

    divergences = contract_divergences(engine_url, sim_url, model="tiny-llama")   # [] when they agree

What is compared: status codes, content types, ``X-Request-Id``; the JSON shape of every body (keys and value
types, recursively; generated text is a string on both sides, never compared); SSE chunk shapes by kind (role,
content, final, usage) and their order per choice; ids and ``created`` shared by a stream's chunks; usage by the
invariants each side must satisfy with its own tokenizer (``total = prompt + completion``, ``completion_tokens`` =
``max_tokens`` under ``ignore_eos``, summed over ``n``, cached tokens in whole KV blocks); finish and stop reasons;
error bodies (type, code, param, message; for format errors the first pydantic entry); ``/v1/models``,
``/health``, ``/version``, ``/load``, unknown routes and methods; the ``vllm:*`` metric families, their types and
label names; and prefix-cache accounting (a repeated prompt's cached tokens, the counters' deltas in tokens).

Not compared, because they are not divergences: generated text and logprob values, prompt token counts (two
tokenizers), ids, timestamps and the fingerprint's hash, how many chunks carry a text and how the choices of an
``n > 1`` stream interleave, a finish reason that EOS may decide (unless ``ignore_eos`` fixes it), and the other
entries pydantic lists for a union-typed field (one per branch of the union).
"""

from __future__ import annotations

import httpx

from simulator.contract.behaviour import compare_metrics, prefix_cache_facts, stop_string_facts, unique_prompt
from simulator.contract.compare import Answer, ask, compare_case, models_card, run_case
from simulator.contract.corpus import CHAT, COMPLETIONS, MESSAGES, Case, refused_cases, route_cases, served_cases
from simulator.contract.shapes import Shape, shape_diff, shape_of

__all__ = [
    "CHAT",
    "COMPLETIONS",
    "MESSAGES",
    "Answer",
    "Case",
    "Shape",
    "ask",
    "compare_case",
    "compare_metrics",
    "contract_divergences",
    "prefix_cache_facts",
    "refused_cases",
    "route_cases",
    "run_case",
    "served_cases",
    "shape_diff",
    "shape_of",
    "stop_string_facts",
    "unique_prompt",
]


def contract_divergences(engine_url: str, sim_url: str, *, model: str, max_model_len: int = 4096) -> list[str]:
    """Every divergence between the simulator and the engine over the whole corpus (empty when they agree)."""
    out: list[str] = []
    with httpx.Client(base_url=engine_url, timeout=180) as engine, httpx.Client(base_url=sim_url, timeout=180) as sim:
        for case in route_cases():
            out += compare_case(
                case,
                ask(engine, case.method, case.path, body=case.body),
                ask(sim, case.method, case.path, body=case.body),
            )
        models = [models_card(ask(c, "GET", "/v1/models")) for c in (engine, sim)]
        for key in ("id", "root", "max_model_len", "owned_by"):
            if models[0].get(key) != models[1].get(key):
                out.append(f"models: {key} engine {models[0].get(key)!r} simulator {models[1].get(key)!r}")
        for case in served_cases() + refused_cases(max_model_len):
            out += run_case(case, engine, sim, model=model)
        for who, client in (("engine", engine), ("simulator", sim)):
            facts = prefix_cache_facts(client, model, who) + stop_string_facts(client, model, who, stream=False)
            out += facts + stop_string_facts(client, model, who, stream=True)
        out += compare_metrics(engine, sim)
    return out
