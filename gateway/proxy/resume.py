"""Resuming a stream whose replica went away mid-answer: a spot reclaim past its notice, a crash, a reset
connection (docs/algorithms.md#stream-resumption). Pure: ``stages.relay`` runs the exchange.

The proxy has relayed part of the answer; it asks another replica to go on from there. A chat request gets the
streamed text as a final assistant message with vLLM's ``continue_final_message`` (and ``add_generation_prompt``
false, which vLLM requires with it), a completion gets the text appended to its prompt; ``max_tokens`` (and
``min_tokens``) shrink by the tokens already streamed. The client's stream goes on under the same id (vLLM names
a completion after the X-Request-Id the proxy sends, and the proxy sends the same one), without a second role
chunk, and its usage chunk counts one answer: the streamed tokens move from the continuation's prompt back to
its completion tokens, so the tenant is billed as if nothing had happened.

What is not resumed (the stream ends with an error event, as before): several choices (``n``, ``best_of``), tool
calls and structured outputs (a grammar restarts at the continuation's first token), echoed or scored prompts,
token-id and batched prompts, and a client message that cannot take more text (content parts)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from gateway.proxy.request import ParsedRequest

MAX_RESUMES = 2  # per request: a second replica failing as well is a fleet problem, not a reclaim

# Fields with which a continuation would not be the same answer: tools and grammars constrain the whole output
# (the engine would restart them at the continuation's first token); echo and prompt_logprobs return the prompt,
# which now holds the streamed text.
UNRESUMABLE_FIELDS = frozenset(
    {
        "tools",
        "tool_choice",
        "functions",
        "function_call",
        "response_format",
        "structured_outputs",
        "guided_json",
        "guided_regex",
        "guided_grammar",
        "guided_choice",
        "echo",
        "prompt_logprobs",
    }
)
_ROLE_MARKER = b'"role":"assistant"'


@dataclass(frozen=True)
class Streamed:
    """What the client has read of the answer: its text, its tokens and whether a ``finish_reason`` already went
    out (only the usage chunk and [DONE] were missing). ``tokens`` counts the chunks after the role chunk: vLLM
    streams each engine step's new tokens as one chunk (at the default ``--stream-interval`` of 1), an empty one
    while the detokenizer holds an incomplete UTF-8 character; now and then a chunk carries two tokens (1,485
    chunks for 1,500 tokens of the tiny test model's byte soup, fewer misses on real text). So ``tokens`` is at
    most what was generated: the continuation's ``max_tokens`` is at least what is left, and the merged usage
    says exactly ``max_tokens`` when the answer runs to it (the engines did up to that 1 % more)."""

    text: str
    tokens: int
    finished: bool


def streamed(relayed: list[bytes], kind: str) -> Streamed:
    """Read the text back from the SSE bytes relayed to the client."""
    parts, tokens, finished = [], 0, False
    for event in b"".join(relayed).split(b"\n\n"):
        if not event.startswith(b"data: {"):
            continue
        try:
            obj = json.loads(event[6:])
        except ValueError:
            continue
        for choice in obj.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            if kind == "chat":
                delta = choice.get("delta") or {}
                text = delta.get("content")
                if delta.get("role") is not None and not text:
                    continue  # the chunk that opens the message
            else:
                text = choice.get("text")
            if isinstance(text, str):
                parts.append(text)
                tokens += 1
            if choice.get("finish_reason") is not None:
                finished = True
    return Streamed(text="".join(parts), tokens=tokens, finished=finished)


def continuation(req: ParsedRequest, done: Streamed) -> ParsedRequest | None:
    """The request that makes a replica continue ``req``'s answer after ``done``, or None when it cannot be
    resumed (see the module's docstring) or nothing is left to generate."""
    body = req.body
    if req.completions != 1 or not UNRESUMABLE_FIELDS.isdisjoint(body) or done.finished:
        return None
    remaining = None if req.max_tokens is None else req.max_tokens - done.tokens
    if remaining is not None and remaining < 1:
        return None
    new = dict(body)
    # A disaggregated request's KV hand-over (NIXL's transfer params) was for the prompt it was sent with: the
    # continuation's longer prompt is prefilled where it goes (docs/request-path.md, prefill/decode disaggregation).
    new.pop("kv_transfer_params", None)
    if req.kind == "chat":
        messages = list(body["messages"])
        last = messages[-1]
        if body.get("continue_final_message"):
            # The client was continuing its own assistant message: the answer goes on after it.
            if not isinstance(last.get("content"), str):
                return None
            messages[-1] = {**last, "content": last["content"] + done.text}
        else:
            messages.append({"role": "assistant", "content": done.text})
        new.update(messages=messages, continue_final_message=True, add_generation_prompt=False)
        limit = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    else:
        if not isinstance(body.get("prompt"), str):
            return None
        new["prompt"] = body["prompt"] + done.text
        limit = "max_tokens"
    if remaining is not None:
        new[limit] = remaining
    if isinstance(body.get("min_tokens"), int) and not isinstance(body["min_tokens"], bool):
        new["min_tokens"] = max(0, body["min_tokens"] - done.tokens)
    return dataclasses.replace(
        req,
        body=new,
        raw=b"",
        max_tokens=remaining,
        prompt_chars=req.prompt_chars + len(done.text),
        controlled=True,  # serialised again, not spliced: the body changed
    )


def merged_usage(usage: dict, streamed_tokens: int, prompt_tokens: int | None = None) -> dict:
    """The continuation's usage as the client's one answer: the streamed tokens were its prompt, they are the
    answer's completion tokens (cached tokens stay within the prompt that is left). The engine re-tokenized the
    streamed text, which can take more or fewer tokens than were generated: the prompt left is then that much off the
    original's (-1 to +38 tokens after ~200 streamed ones of the tiny test model's byte soup, in
    tests/engine/test_stream_resume_real_engine.py; not measured on a real model's text)."""
    continued_prompt = int(usage.get("prompt_tokens") or 0)
    if prompt_tokens is not None and 0 <= prompt_tokens <= continued_prompt:
        # The original prompt as this engine counts it: what its prompt held beyond it is the streamed text, in the
        # engine's own tokens (a lagging client gets several tokens in one chunk, so chunks undercount them).
        streamed_tokens = continued_prompt - prompt_tokens
    prompt = max(0, continued_prompt - streamed_tokens)
    completion = int(usage.get("completion_tokens") or 0) + streamed_tokens
    merged = {**usage, "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        merged["prompt_tokens_details"] = {**details, "cached_tokens": min(details["cached_tokens"], prompt)}
    return merged


class Continued:
    """The transform a continuation's SSE goes through on its way to the client (``relay._relay_events``): no
    second role chunk, and usage merged with what the earlier replicas streamed. Whole events in, whole events out;
    chunks that carry neither pass untouched (the common case: a substring test)."""

    __slots__ = ("streamed_tokens", "prompt_tokens")

    def __init__(self, streamed_tokens: int, prompt_tokens: int | None = None) -> None:
        self.streamed_tokens = streamed_tokens
        self.prompt_tokens = prompt_tokens  # the original prompt as the continuing replica counts it, when known

    def __call__(self, out: bytes) -> bytes:
        if _ROLE_MARKER not in out and b'"usage"' not in out:
            return out
        kept = []
        for event in out.split(b"\n\n"):
            if not event:
                continue
            if event.startswith(b"data: {") and (_ROLE_MARKER in event or b'"usage"' in event):
                try:
                    obj = json.loads(event[6:])
                except ValueError:
                    kept.append(event)
                    continue
                if _opens_the_message(obj):
                    continue
                if isinstance(obj.get("usage"), dict):
                    obj["usage"] = merged_usage(obj["usage"], self.streamed_tokens, self.prompt_tokens)
                    event = b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
            kept.append(event)
        return b"\n\n".join(kept) + b"\n\n" if kept else b""


def _opens_the_message(obj: dict) -> bool:
    """The chunk that opens the assistant's message (role, empty content): the client already had one."""
    choices = obj.get("choices") or ()
    return bool(choices) and all(
        isinstance(c, dict)
        and (c.get("delta") or {}).get("role") == "assistant"
        and not (c.get("delta") or {}).get("content")
        and c.get("finish_reason") is None
        for c in choices
    )
