"""One request to both sides and every way the two answers differ (status, headers, shapes, streams, errors)."""

from __future__ import annotations

import ast
import json
import re
import uuid
from dataclasses import dataclass

import httpx

from simulator.contract.corpus import CHAT, Case
from simulator.contract.shapes import shape_diff, shape_of


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


def _final_carries_text(finals: list[dict]) -> bool:
    """Whether every finish chunk carries generated text. vLLM's output collector merges a request's pending deltas
    into one when the API server's consumer falls behind the engine (``RequestOutputCollector``), so under load a
    short answer can arrive as its finish chunk alone, with no content chunk before it."""
    texts = [c["choices"][0].get("text") or (c["choices"][0].get("delta") or {}).get("content") for c in finals]
    return bool(texts) and all(texts)


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
            if kind == "content" and kind not in engine_kinds and _final_carries_text(engine_kinds.get("final", [])):
                continue  # the engine merged its deltas into the finish chunk, as vLLM does when its client lags
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


def models_card(answer: Answer) -> dict:
    return answer.body["data"][0] if isinstance(answer.body, dict) and answer.body.get("data") else {}


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
