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

import ast
import json
import random
import re
import uuid
from dataclasses import dataclass, field

import httpx

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
MESSAGES = [{"role": "user", "content": "Hello there, what is the model?"}]


# -- shapes ---------------------------------------------------------------------------------------------------
@dataclass
class Shape:
    """The keys and value types seen at one place of a JSON document, merged over every value seen there."""

    types: set = field(default_factory=set)
    keys: dict = field(default_factory=dict)
    items: Shape | None = None

    def add(self, value, path: str = "") -> Shape:
        if value is None:
            self.types.add("null")
        elif isinstance(value, bool):
            self.types.add("bool")
        elif isinstance(value, int):
            self.types.add("int")
        elif isinstance(value, float):
            self.types.add("float")
        elif isinstance(value, str):
            self.types.add("str")
        elif isinstance(value, list):
            self.types.add("array")
            for item in value:
                self.items = (self.items or Shape()).add(item, f"{path}[]")
        elif isinstance(value, dict):
            if path.endswith("logprobs.top_logprobs[]") and all(isinstance(v, float) for v in value.values()):
                # A completion's top logprobs map tokens to values: the keys are generated text.
                self.types.add("map")
                for item in value.values():
                    self.items = (self.items or Shape()).add(item, f"{path}{{}}")
            else:
                self.types.add("object")
                for key, item in value.items():
                    self.keys[key] = self.keys.get(key, Shape()).add(item, f"{path}.{key}")
        return self


def shape_of(*values, path: str = "") -> Shape:
    shape = Shape()
    for value in values:
        shape.add(value, path)
    return shape


def shape_diff(engine: Shape, sim: Shape, path: str = "$") -> list[str]:
    out = []
    if engine.types != sim.types:
        out.append(f"{path}: engine {sorted(engine.types)}, simulator {sorted(sim.types)}")
    for key in sorted(set(engine.keys) - set(sim.keys)):
        out.append(f"{path}.{key}: missing in the simulator")
    for key in sorted(set(sim.keys) - set(engine.keys)):
        out.append(f"{path}.{key}: only in the simulator")
    for key in sorted(set(engine.keys) & set(sim.keys)):
        out += shape_diff(engine.keys[key], sim.keys[key], f"{path}.{key}")
    if engine.items is not None and sim.items is not None:  # an empty list fits any items
        out += shape_diff(engine.items, sim.items, f"{path}[]")
    return out


# -- answers --------------------------------------------------------------------------------------------------
@dataclass
class Answer:
    status: int
    content_type: str | None
    request_id: str | None
    body: object = None  # JSON, or the text when it is not JSON
    events: list | None = None  # SSE data, decoded; "[DONE]" stays a string


def ask(client: httpx.Client, method: str, path: str, *, body=None, raw: bytes | None = None, headers=None) -> Answer:
    kwargs = {"headers": headers or {}}
    if raw is not None:
        kwargs["content"] = raw
        kwargs["headers"] = {"Content-Type": "application/json", **kwargs["headers"]}
    elif body is not None:
        kwargs["json"] = body
    response = client.request(method, path, **kwargs)
    content_type = response.headers.get("content-type")
    answer = Answer(response.status_code, content_type, response.headers.get("x-request-id"))
    if content_type and content_type.startswith("text/event-stream"):
        answer.events = []
        for frame in response.text.split("\n\n"):
            if frame.startswith("data: "):
                data = frame[len("data: ") :]
                answer.events.append(data if data == "[DONE]" else json.loads(data))
        return answer
    try:
        answer.body = response.json()
    except ValueError:
        answer.body = response.text
    return answer


# -- the corpus -----------------------------------------------------------------------------------------------
@dataclass
class Case:
    name: str
    path: str
    body: object = None
    method: str = "POST"
    raw: bytes | None = None
    completion_tokens: int | None = None  # what usage must say on both sides (ignore_eos, max_tokens)
    finish: str | None = None  # the finish reason both must give


def _ok(name: str, path: str, *, tokens: int | None = None, finish: str | None = "length", **fields) -> Case:
    body = {"messages": MESSAGES} if path == CHAT else {"prompt": "Hello there"}
    return Case(name, path, body | fields, completion_tokens=tokens, finish=finish)


def served_cases() -> list[Case]:
    """Requests both must serve, with the usage and finish reason ``ignore_eos`` fixes."""
    stream, usage = {"stream": True}, {"stream_options": {"include_usage": True}}
    continuous = {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    return [
        _ok("chat", CHAT, tokens=5, max_tokens=5, ignore_eos=True),
        _ok("chat stream", CHAT, tokens=4, max_tokens=4, ignore_eos=True, **stream),
        _ok("chat stream with usage", CHAT, tokens=4, max_tokens=4, ignore_eos=True, **stream, **usage),
        _ok("chat stream continuous usage", CHAT, tokens=3, max_tokens=3, ignore_eos=True, **stream, **continuous),
        _ok("chat n=2", CHAT, tokens=6, max_tokens=3, n=2, ignore_eos=True),
        _ok("chat n=2 stream", CHAT, tokens=6, max_tokens=3, n=2, ignore_eos=True, **stream, **usage),
        _ok("chat logprobs", CHAT, tokens=2, max_tokens=2, ignore_eos=True, logprobs=True, top_logprobs=2),
        _ok(
            "chat logprobs stream",
            CHAT,
            tokens=2,
            max_tokens=2,
            ignore_eos=True,
            logprobs=True,
            top_logprobs=2,
            **stream,
        ),
        _ok("chat logprobs without top", CHAT, tokens=2, max_tokens=2, ignore_eos=True, logprobs=True),
        _ok("chat min_tokens", CHAT, tokens=3, max_tokens=3, min_tokens=3),
        _ok("chat lax types", CHAT, tokens=3, max_tokens="3", n="1", ignore_eos="true", stream="no"),
        _ok(
            "chat custom role",
            CHAT,
            tokens=2,
            max_tokens=2,
            ignore_eos=True,
            messages=[{"role": "wizard", "content": "x"}],
        ),
        _ok("chat unknown field", CHAT, tokens=2, max_tokens=2, ignore_eos=True, not_a_field=1),
        _ok("chat with priority and salt", CHAT, tokens=2, max_tokens=2, ignore_eos=True, priority=-3, cache_salt="a"),
        _ok("completion", COMPLETIONS, tokens=3, max_tokens=3, ignore_eos=True),
        _ok("completion default max_tokens", COMPLETIONS, tokens=16, ignore_eos=True),
        _ok("completion stream", COMPLETIONS, tokens=3, max_tokens=3, ignore_eos=True, **stream),
        _ok("completion stream with usage", COMPLETIONS, tokens=3, max_tokens=3, ignore_eos=True, **stream, **usage),
        _ok(
            "completion stream continuous",
            COMPLETIONS,
            tokens=2,
            max_tokens=2,
            ignore_eos=True,
            **stream,
            **continuous,
        ),
        _ok("completion n=2 stream", COMPLETIONS, tokens=4, max_tokens=2, n=2, ignore_eos=True, **stream, **usage),
        _ok("completion prompts batch", COMPLETIONS, tokens=4, max_tokens=2, ignore_eos=True, prompt=["a b", "c d"]),
        _ok("completion token ids", COMPLETIONS, tokens=2, max_tokens=2, ignore_eos=True, prompt=[11, 12, 13]),
        _ok("completion logprobs", COMPLETIONS, tokens=2, max_tokens=2, ignore_eos=True, logprobs=2),
        _ok("completion logprobs stream", COMPLETIONS, tokens=2, max_tokens=2, ignore_eos=True, logprobs=1, **stream),
        _ok("completion echo", COMPLETIONS, tokens=2, max_tokens=2, ignore_eos=True, echo=True),
        _ok(
            "completion echo stream",
            COMPLETIONS,
            tokens=2,
            max_tokens=2,
            ignore_eos=True,
            echo=True,
            **stream,
            **continuous,
        ),
        _ok("completion best_of", COMPLETIONS, tokens=2, max_tokens=2, ignore_eos=True, best_of=2),
        Case(
            "chat without model",
            CHAT,
            {"messages": MESSAGES, "max_tokens": 2, "ignore_eos": True},
            completion_tokens=2,
            finish="length",
        ),
    ]


def refused_cases(max_model_len: int) -> list[Case]:
    """Bad input: both must refuse it alike (status, error type, param, message)."""
    m = MESSAGES
    long_text = "hello " * (max_model_len + 500)

    def chat(name, **fields):
        return Case(name, CHAT, {"messages": m, "max_tokens": 2} | fields)

    def comp(name, **fields):
        return Case(name, COMPLETIONS, {"prompt": "hi", "max_tokens": 2} | fields)

    return [
        Case("chat no messages", CHAT, {"max_tokens": 2}),
        chat("chat empty messages", messages=[]),
        chat("chat messages not a list", messages="hi"),
        chat("chat message without role", messages=[{"content": "x"}]),
        chat("chat content a number", messages=[{"role": "user", "content": 5}]),
        chat("chat unknown model", model="no-such-model"),
        chat("chat max_tokens 0", max_tokens=0),
        chat("chat max_tokens -1", max_tokens=-1),
        chat("chat max_tokens fractional", max_tokens=5.5),
        chat("chat max_tokens over the context", max_tokens=100_000),
        chat("chat max_completion_tokens 0", max_completion_tokens=0),
        chat("chat temperature -1", temperature=-1),
        chat("chat temperature 3", temperature=3),
        chat("chat temperature text", temperature="hot"),
        chat("chat top_p 0", top_p=0),
        chat("chat top_p 1.5", top_p=1.5),
        chat("chat top_k -2", top_k=-2),
        chat("chat n 0", n=0),
        chat("chat n -1", n=-1),
        chat("chat top_logprobs 21", logprobs=True, top_logprobs=21),
        chat("chat top_logprobs without logprobs", top_logprobs=5),
        chat("chat top_logprobs -1", logprobs=True, top_logprobs=-1),
        chat("chat top_logprobs -2", logprobs=True, top_logprobs=-2),
        chat("chat stream_options without stream", stream_options={"include_usage": True}),
        chat("chat stream_options not an object", stream=True, stream_options="x"),
        chat("chat stream not a boolean", stream="x"),
        chat("chat priority text", priority="high"),
        chat("chat priority fractional", priority=1.5),
        chat("chat cache_salt empty", cache_salt=""),
        chat("chat cache_salt a number", cache_salt=5),
        chat("chat stop a number", stop=5),
        chat("chat stop empty", stop=""),
        chat("chat stop list with an empty string", stop=[""]),
        chat("chat min_tokens -1", min_tokens=-1),
        chat("chat min_tokens over max_tokens", min_tokens=5),
        chat("chat ignore_eos not a boolean", ignore_eos="x"),
        chat("chat seed text", seed="x"),
        chat("chat presence_penalty 3", presence_penalty=3),
        chat("chat frequency_penalty -3", frequency_penalty=-3),
        chat("chat repetition_penalty 0", repetition_penalty=0),
        chat("chat prompt over the context", messages=[{"role": "user", "content": long_text}]),
        Case("chat body an array", CHAT, []),
        Case("chat body a string", CHAT, "hello"),
        Case("chat body not JSON", CHAT, raw=b"{nope"),
        Case("completion empty body", COMPLETIONS, raw=b""),
        Case("completion no prompt", COMPLETIONS, {"max_tokens": 2}),
        comp("completion prompt a number", prompt=5),
        comp("completion prompt empty list", prompt=[]),
        comp("completion prompt empty string", prompt=""),
        comp("completion logprobs 21", logprobs=21),
        comp("completion logprobs -1", logprobs=-1),
        comp("completion logprobs -2", logprobs=-2),
        comp("completion max_tokens 0", max_tokens=0),
        comp("completion max_tokens over the context", max_tokens=100_000),
        comp("completion prompt over the context", prompt=long_text),
        comp("completion unknown model", model="no-such-model"),
        comp("completion temperature -1", temperature=-1),
        comp("completion suffix", suffix="x"),
    ]


def route_cases() -> list[Case]:
    return [
        Case("models", "/v1/models", method="GET"),
        Case("health", "/health", method="GET"),
        Case("ping", "/ping", method="GET"),
        Case("version", "/version", method="GET"),
        Case("load", "/load", method="GET"),
        Case("unknown route", "/no-such-route", method="GET"),
        Case("wrong method on chat", CHAT, method="GET"),
        Case("wrong method on models", "/v1/models", method="POST"),
        Case("wrong method on health", "/health", method="POST"),
    ]


# -- comparing one case ---------------------------------------------------------------------------------------
_VALIDATION_LINE = re.compile(r"^\s+(\{.*\})$")


def _first_validation_error(message: str) -> tuple:
    """A pydantic error message's count line and first entry (its later entries list the branches of a union)."""
    lines = message.splitlines()
    first = ast.literal_eval(_VALIDATION_LINE.match(lines[1]).group(1)) if len(lines) > 1 else {}
    plural = lines[0].split(" ", 1)[1] if lines else ""
    return plural.startswith("validation error"), first.get("type"), first.get("loc"), first.get("msg")


def _compare_error(case: Case, engine: Answer, sim: Answer) -> list[str]:
    e, s = engine.body.get("error") if isinstance(engine.body, dict) else None, None
    if isinstance(sim.body, dict):
        s = sim.body.get("error")
    if e is None or s is None:
        return [f"{case.name}: error body engine {engine.body!r} simulator {sim.body!r}"] if e or s else []
    out = []
    for key in ("type", "code", "param"):
        if e.get(key) != s.get(key):
            out.append(f"{case.name}: error.{key} engine {e.get(key)!r} simulator {s.get(key)!r}")
    if e.get("type") == "Bad Request":
        if _first_validation_error(e["message"]) != _first_validation_error(s["message"]):
            out.append(f"{case.name}: validation message engine {e['message']!r} simulator {s['message']!r}")
    elif e.get("message") != s.get("message"):
        out.append(f"{case.name}: error.message engine {e.get('message')!r} simulator {s.get('message')!r}")
    return out


def _usage_invariants(case: Case, usage: dict, who: str) -> list[str]:
    out = []
    if usage["total_tokens"] != usage["prompt_tokens"] + usage["completion_tokens"]:
        out.append(f"{case.name}: {who} usage total_tokens is not prompt + completion")
    if case.completion_tokens is not None and usage["completion_tokens"] != case.completion_tokens:
        out.append(f"{case.name}: {who} completion_tokens {usage['completion_tokens']} != {case.completion_tokens}")
    return out


def _chunk_kind(chunk: dict) -> str:
    if "error" in chunk:
        return "error"
    if not chunk.get("choices"):
        return "usage"
    choice = chunk["choices"][0]
    if "delta" in choice and "role" in choice["delta"]:
        return "role"
    return "final" if choice.get("finish_reason") is not None else "content"


def _stream_facts(case: Case, answer: Answer, who: str) -> tuple[dict, list[str]]:
    """Chunk shapes by kind, and what is wrong with the stream's order on its own."""
    events, problems = answer.events or [], []
    if not events or events[-1] != "[DONE]":
        problems.append(f"{case.name}: {who} stream does not end with [DONE]")
    chunks = [e for e in events if isinstance(e, dict)]
    by_kind: dict[str, list] = {}
    for chunk in chunks:
        by_kind.setdefault(_chunk_kind(chunk), []).append(chunk)
    if len({c.get("id") for c in chunks}) > 1 or len({c.get("created") for c in chunks}) > 1:
        problems.append(f"{case.name}: {who} chunks do not share one id and created")
    per_choice: dict[int, list[str]] = {}
    for position, chunk in enumerate(chunks):
        kind = _chunk_kind(chunk)
        if kind == "usage":
            if position != len(chunks) - 1:
                problems.append(f"{case.name}: {who} usage chunk is not the last")
            continue
        per_choice.setdefault(chunk["choices"][0]["index"], []).append(kind)
    expected_choices = (case.body.get("n") and int(case.body["n"])) or 1
    if isinstance(case.body.get("prompt"), list) and case.body["prompt"] and isinstance(case.body["prompt"][0], str):
        expected_choices *= len(case.body["prompt"])
    if sorted(per_choice) != list(range(expected_choices)):
        problems.append(f"{case.name}: {who} choices {sorted(per_choice)}")
    for index, kinds in per_choice.items():
        if kinds[-1] != "final" or kinds.count("final") != 1:
            problems.append(f"{case.name}: {who} choice {index} does not end with one finish chunk: {kinds}")
        if case.path == CHAT and kinds[0] != "role":
            problems.append(f"{case.name}: {who} choice {index} does not open with a role chunk")
    if case.path == CHAT and by_kind.get("role") and chunks.index(by_kind["role"][-1]) >= len(by_kind["role"]):
        problems.append(f"{case.name}: {who} role chunks are not the first chunks")
    usage_chunks = by_kind.get("usage", [])
    wants_usage = bool((case.body.get("stream_options") or {}).get("include_usage"))
    if wants_usage != bool(usage_chunks):
        problems.append(f"{case.name}: {who} usage chunk {'missing' if wants_usage else 'unasked for'}")
    for chunk in usage_chunks:
        problems += _usage_invariants(case, chunk["usage"], who)
    if case.finish:
        for chunk in by_kind.get("final", []):
            if chunk["choices"][0]["finish_reason"] != case.finish:
                problems.append(f"{case.name}: {who} finish_reason {chunk['choices'][0]['finish_reason']!r}")
    return by_kind, problems


def compare_case(case: Case, engine: Answer, sim: Answer, *, request_id: str | None = None) -> list[str]:
    out = []
    if engine.status != sim.status:
        return [f"{case.name}: status engine {engine.status} simulator {sim.status} ({str(sim.body)[:300]})"]
    if engine.content_type != sim.content_type:
        out.append(f"{case.name}: content-type engine {engine.content_type!r} simulator {sim.content_type!r}")
    if request_id is not None and (engine.request_id, sim.request_id) != (request_id, request_id):
        out.append(f"{case.name}: X-Request-Id engine {engine.request_id!r} simulator {sim.request_id!r}")
    if request_id is None and bool(engine.request_id) != bool(sim.request_id):
        out.append(f"{case.name}: X-Request-Id engine {engine.request_id!r} simulator {sim.request_id!r}")
    if engine.events is not None:
        engine_kinds, engine_problems = _stream_facts(case, engine, "the engine")
        sim_kinds, sim_problems = _stream_facts(case, sim, "the simulator")
        # What both get wrong is the case's assumption, not a divergence; either side alone is one.
        shared = {p.replace("the engine", "the simulator") for p in engine_problems} & set(sim_problems)
        out += [p for p in sim_problems if p not in shared]
        out += [p for p in engine_problems if p.replace("the engine", "the simulator") not in shared]
        for kind in sorted(set(engine_kinds) | set(sim_kinds)):
            if kind not in sim_kinds or kind not in engine_kinds:
                out.append(
                    f"{case.name}: {kind} chunks only in the {'engine' if kind in engine_kinds else 'simulator'}"
                )
                continue
            for line in shape_diff(shape_of(*engine_kinds[kind]), shape_of(*sim_kinds[kind]), f"<{kind} chunk>"):
                out.append(f"{case.name}: {line}")
        return out
    if engine.status >= 400 and isinstance(engine.body, dict) and "error" in engine.body:
        return out + _compare_error(case, engine, sim)
    for line in shape_diff(shape_of(engine.body), shape_of(sim.body)):
        out.append(f"{case.name}: {line}")
    if isinstance(engine.body, dict) and isinstance(sim.body, dict):
        if "usage" in engine.body and "usage" in sim.body:
            for who, body in (("engine", engine.body), ("simulator", sim.body)):
                out += _usage_invariants(case, body["usage"], who)
        if case.finish and "choices" in sim.body:
            finishes = {c.get("finish_reason") for c in sim.body["choices"]}
            if finishes != {case.finish}:
                out.append(f"{case.name}: simulator finish_reason {sorted(map(str, finishes))}, want {case.finish!r}")
        for key in ("object", "model", "version", "detail", "owned_by", "max_model_len"):
            if key in engine.body and engine.body.get(key) != sim.body.get(key):
                out.append(f"{case.name}: {key} engine {engine.body.get(key)!r} simulator {sim.body.get(key)!r}")
        if request_id is not None and "id" in engine.body:
            if engine.body["id"].split("-", 1)[1] != request_id or sim.body.get("id") != engine.body["id"]:
                out.append(f"{case.name}: id engine {engine.body['id']!r} simulator {sim.body.get('id')!r}")
    elif engine.body != sim.body and not (
        engine.status == 200 and engine.body in ("", None) and sim.body in ("", None)
    ):
        out.append(f"{case.name}: body engine {engine.body!r} simulator {sim.body!r}")
    return out


def _models_card(answer: Answer) -> dict:
    return answer.body["data"][0] if isinstance(answer.body, dict) and answer.body.get("data") else {}


# -- behaviour beyond one request -----------------------------------------------------------------------------
def unique_prompt(words: int = 160) -> str:
    """A prompt no earlier request began with, several KV blocks long on either tokenizer."""
    rng = random.Random()
    vocabulary = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]
    return uuid.uuid4().hex + " " + " ".join(f"{rng.choice(vocabulary)}{rng.randint(0, 99)}" for _ in range(words))


def _metrics(client: httpx.Client) -> dict[str, dict]:
    from prometheus_client.parser import text_string_to_metric_families

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


def contract_divergences(engine_url: str, sim_url: str, *, model: str, max_model_len: int = 4096) -> list[str]:
    """Every divergence between the simulator and the engine over the whole corpus (empty when they agree)."""
    out: list[str] = []
    with httpx.Client(base_url=engine_url, timeout=180) as engine, httpx.Client(base_url=sim_url, timeout=180) as sim:
        for case in route_cases():
            out += compare_case(case, ask(engine, case.method, case.path), ask(sim, case.method, case.path))
        models = [_models_card(ask(c, "GET", "/v1/models")) for c in (engine, sim)]
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


def run_case(case: Case, engine: httpx.Client, sim: httpx.Client, *, model: str) -> list[str]:
    body = case.body
    if isinstance(body, dict) and "model" not in body and case.name != "chat without model":
        body = {"model": model} | body
    request_id = f"contract-{uuid.uuid4().hex[:12]}"
    headers = {"X-Request-Id": request_id}
    answers = [ask(c, case.method, case.path, body=body, raw=case.raw, headers=headers) for c in (engine, sim)]
    try:
        return compare_case(case, *answers, request_id=request_id)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        return [f"{case.name}: an answer the comparison cannot read ({type(exc).__name__}: {exc})"]
