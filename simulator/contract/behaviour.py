"""What each side must do beyond one request's shape: prefix-cache accounting in whole blocks, stop strings cut
the greedy answer, and the same ``vllm:*`` metric families, types and labels."""

from __future__ import annotations

import random
import uuid

import httpx
from prometheus_client.parser import text_string_to_metric_families

from simulator.contract.compare import ask
from simulator.contract.corpus import CHAT


def unique_prompt(words: int = 160) -> str:
    """A prompt no earlier request began with, several KV blocks long on either tokenizer."""
    rng = random.Random()
    vocabulary = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]
    return uuid.uuid4().hex + " " + " ".join(f"{rng.choice(vocabulary)}{rng.randint(0, 99)}" for _ in range(words))


def _metrics(client: httpx.Client) -> dict[str, dict]:
    families = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        if family.name.startswith("vllm:"):
            families[family.name] = {
                "type": family.type,
                "labels": sorted({k for s in family.samples for k in s.labels if k != "le"}),
                "samples": {(s.name, tuple(sorted(s.labels.items()))): s.value for s in family.samples},
            }
    return families


def _sample(families: dict, name: str, **labels) -> float:
    family = families.get(name.removesuffix("_total"), {})
    for (sample, sample_labels), value in family.get("samples", {}).items():
        if sample == name and all(dict(sample_labels).get(k) == v for k, v in labels.items()):
            return value
    return 0.0


def _block_size(families: dict) -> int:
    for (_, labels), _value in families.get("vllm:cache_config_info", {}).get("samples", {}).items():
        return int(dict(labels)["block_size"])
    return 0


def compare_metrics(engine: httpx.Client, sim: httpx.Client) -> list[str]:
    e, s = _metrics(engine), _metrics(sim)
    out = []
    for name in sorted(set(e) - set(s)):
        out.append(f"metrics: {name} missing in the simulator")
    for name in sorted(set(s) - set(e)):
        out.append(f"metrics: {name} only in the simulator")
    for name in sorted(set(e) & set(s)):
        for key in ("type", "labels"):
            if e[name][key] != s[name][key]:
                out.append(f"metrics: {name} {key} engine {e[name][key]} simulator {s[name][key]}")
    for label in ("block_size", "num_gpu_blocks", "enable_prefix_caching"):
        values = []
        for families in (e, s):
            samples = families.get("vllm:cache_config_info", {}).get("samples", {})
            values.append(next((dict(labels).get(label) for (_, labels) in samples), None))
        if values[0] != values[1]:
            out.append(f"metrics: cache_config_info {label} engine {values[0]} simulator {values[1]}")
    return out


def _guarded(check):
    """A check that cannot read an answer reports that as a divergence instead of failing with a traceback."""

    def run(client: httpx.Client, model: str, who: str, **kwargs) -> list[str]:
        try:
            return check(client, model, who, **kwargs)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            return [f"{check.__name__}: {who} answered something unreadable ({type(exc).__name__}: {exc})"]

    run.__name__ = check.__name__
    return run


def _details(usage: dict) -> dict:
    return usage.get("prompt_tokens_details") or {}


@_guarded
def prefix_cache_facts(client: httpx.Client, model: str, who: str) -> list[str]:
    """A full repeat of a long prompt, then an n=3 request of a fresh one: usage and counters in whole blocks."""
    out = []
    block = _block_size(_metrics(client))
    prompt = [{"role": "user", "content": unique_prompt()}]
    body = {"model": model, "messages": prompt, "max_tokens": 1, "ignore_eos": True}
    before = _metrics(client)
    first = client.post(CHAT, json=body).json()["usage"]
    second = client.post(CHAT, json=body).json()["usage"]
    after = _metrics(client)
    tokens = second["prompt_tokens"]
    if tokens < 2 * block:
        return [f"prefix cache: {who} prompt of {tokens} tokens is shorter than two {block}-token blocks"]
    full = tokens // block * block
    want = {
        "first cached_tokens": (_details(first).get("cached_tokens"), 0),
        "first created_cache_tokens": (_details(first).get("created_cache_tokens"), full),
        "repeat cached_tokens": (_details(second).get("cached_tokens"), (tokens - 1) // block * block),
        "repeat created_cache_tokens": (
            _details(second).get("created_cache_tokens"),
            full - (tokens - 1) // block * block,
        ),
        "prefix_cache_queries delta": (
            _sample(after, "vllm:prefix_cache_queries_total") - _sample(before, "vllm:prefix_cache_queries_total"),
            2 * tokens,
        ),
        "prefix_cache_hits delta": (
            _sample(after, "vllm:prefix_cache_hits_total") - _sample(before, "vllm:prefix_cache_hits_total"),
            (tokens - 1) // block * block,
        ),
        "prompt_tokens_cached delta": (
            _sample(after, "vllm:prompt_tokens_cached_total") - _sample(before, "vllm:prompt_tokens_cached_total"),
            (tokens - 1) // block * block,
        ),
    }
    fresh = {"model": model, "messages": [{"role": "user", "content": unique_prompt()}], "max_tokens": 1, "n": 3}
    before = _metrics(client)
    usage = client.post(CHAT, json=fresh | {"ignore_eos": True}).json()["usage"]
    after = _metrics(client)
    hits = (usage["prompt_tokens"] - 1) // block * block
    want["n=3 prefix_cache_queries delta"] = (
        _sample(after, "vllm:prefix_cache_queries_total") - _sample(before, "vllm:prefix_cache_queries_total"),
        3 * usage["prompt_tokens"],
    )
    want["n=3 prefix_cache_hits delta (siblings hit the first)"] = (
        _sample(after, "vllm:prefix_cache_hits_total") - _sample(before, "vllm:prefix_cache_hits_total"),
        2 * hits,
    )
    want["n=3 completion_tokens"] = (usage["completion_tokens"], 3)
    for what, (got, expected) in want.items():
        if got != expected:
            out.append(
                f"prefix cache: {who} {what} {got}, want {expected} ({tokens}-token prompt, {block}-token blocks)"
            )
    return out


@_guarded
def stop_string_facts(client: httpx.Client, model: str, who: str, *, stream: bool) -> list[str]:
    """A stop string taken from the greedy answer ends the same greedy answer there, as vLLM's detokenizer does."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "temperature": 0, "max_tokens": 12}
    text = client.post(CHAT, json=body | {"ignore_eos": True}).json()["choices"][0]["message"]["content"]
    stop = next(
        (
            text[i : i + 3]
            for i in range(len(text) // 3, len(text) - 3)
            if text[i : i + 3].isascii() and text[i : i + 3].isalpha() and text.find(text[i : i + 3]) == i
        ),
        None,
    )
    if stop is None:
        return []  # no usable stop string in this answer: nothing to compare on this side
    cut = text.find(stop)
    request = body | {"stop": [stop, "never-matches"], "ignore_eos": True}
    if stream:
        request |= {"stream": True, "stream_options": {"include_usage": True}}
        answer = ask(client, "POST", CHAT, body=request)
        chunks = [e for e in answer.events if isinstance(e, dict) and e.get("choices")]
        shown = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
        finish = chunks[-1]["choices"][0]
    else:
        choice = client.post(CHAT, json=request).json()["choices"][0]
        shown, finish = choice["message"]["content"], choice
    out = []
    if (finish["finish_reason"], finish["stop_reason"]) != ("stop", stop):
        out.append(
            f"stop string: {who} finish {finish['finish_reason']!r}/{finish['stop_reason']!r}, want 'stop'/{stop!r}"
        )
    if shown != text[:cut]:
        out.append(
            f"stop string: {who} {'streamed' if stream else 'returned'} {shown!r}, want the text before {stop!r}"
        )
    return out
