"""Serving one completion request on the simulated replica: its choices in the engine, then the answer, streamed
or whole, in vLLM 0.32's shapes (``responses``).

A request becomes one engine sequence per choice (``n`` per prompt; a completion may carry several prompts), as
vLLM fans ``n`` out into child requests: the first child's prompt blocks are cached as they are allocated, so its
siblings hit them. Each choice's end (EOS, stop string, ``max_tokens``) is planned up front (``outputs``), so the
engine only runs it to that length. A client that goes away aborts every choice still running.
"""

from __future__ import annotations

import asyncio
import json
import time

from aiohttp import web

from simulator.engine import FINISHED, Sequence
from simulator.outputs import (
    OutputPlan,
    chat_logprobs,
    completion_logprobs,
    natural_length,
    plan_output,
    prompt_token_ids,
)
from simulator.protocol import ParsedRequest, Prompt
from simulator.responses import (
    chat_choice,
    chat_chunk,
    chat_role_chunk,
    completion_choice,
    completion_chunk,
    continuous_usage,
    full_response,
    usage_block,
    usage_chunk,
)
from simulator.tokens import CHARS_PER_TOKEN, block_hashes, output_text, partial_block
from simulator.validation import BadRequest, error_body

_TEXT_MARK = "\u0000text\u0000"


def json_response(payload, *, status: int = 200, headers: dict | None = None) -> web.Response:
    """JSON as vLLM's FastAPI sends it: compact, ``Content-Type: application/json`` without a charset."""
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
    return web.Response(body=body, status=status, headers={"Content-Type": "application/json", **(headers or {})})


def error_response(exc: BadRequest) -> web.Response:
    return json_response(error_body(str(exc), status=exc.status, kind=exc.kind, param=exc.param), status=exc.status)


def _sse(payload: dict | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def _content_template(parsed: ParsedRequest, created: int, index: int = 0) -> tuple[bytes, bytes]:
    """The SSE frame of a plain content chunk split around its text: the same bytes ``_sse`` writes, built once.

    Output words (``tokens.OUTPUT_WORDS``) need no JSON escaping, so a frame is prefix + text + suffix.
    """
    if parsed.chat:
        chunk = chat_chunk(parsed, created, {"content": _TEXT_MARK}, index=index)
    else:
        chunk = completion_chunk(parsed, created, _TEXT_MARK, index=index)
    head, tail = _sse(chunk).split(json.dumps(_TEXT_MARK)[1:-1].encode())
    return head, tail


class Choice:
    """One choice of a request: its engine sequence, its planned end and what the client has seen of it."""

    __slots__ = (
        "seq",
        "request",
        "index",
        "plan",
        "prompt",
        "first_token_s",
        "last_token_s",
        "sent_tokens",
        "sent_chars",
    )

    def __init__(self, seq: Sequence, request: Exchange, index: int, plan: OutputPlan, prompt: Prompt):
        self.seq = seq
        self.request = request
        self.index = index
        self.plan = plan
        self.prompt = prompt
        self.first_token_s: float | None = None  # on the server's clock (engine times ignore the slow factor)
        self.last_token_s = request.arrival_s
        self.sent_tokens = 0
        self.sent_chars = 0

    def token_text(self, position: int) -> str:
        """The text of output token ``position`` (0-based); an EOS shows none."""
        plan = self.plan
        if plan.finish_reason == "stop" and plan.stop_reason is None and position == plan.tokens - 1:
            return ""
        return output_text(position, 1)


class Exchange:
    """A request being served: the parsed body, its choices and the event the engine loop sets on progress."""

    __slots__ = ("parsed", "arrival_s", "event", "choices", "done", "vocab_size")

    def __init__(self, parsed: ParsedRequest, arrival_s: float, vocab_size: int = 32000):
        self.parsed = parsed
        self.arrival_s = arrival_s
        self.vocab_size = vocab_size
        self.event = asyncio.Event()
        self.choices: list[Choice] = []
        self.done = 0  # choices finished (the last one observes the request's own metrics)

    @property
    def finished(self) -> bool:
        return all(choice.seq.state == FINISHED for choice in self.choices)


def build_exchange(parsed: ParsedRequest, profile, now: float) -> Exchange:
    """The request's choices as engine sequences (not yet added), each with its planned end."""
    exchange = Exchange(parsed, now, profile.vocab_size)
    for p, prompt in enumerate(parsed.prompts):
        hashes = block_hashes(prompt.text, salt=parsed.cache_salt)
        tail = partial_block(prompt.text)
        for j in range(parsed.n):
            index = p * parsed.n + j
            plan = plan_output(
                natural_tokens=natural_length(profile, prompt_text=prompt.text, seed=parsed.seed, index=j),
                max_tokens=parsed.max_tokens[p],
                min_tokens=parsed.min_tokens,
                ignore_eos=parsed.ignore_eos,
                stop=parsed.stop,
                include_stop_str_in_output=parsed.include_stop_str_in_output,
            )
            seq = Sequence(
                request_id=parsed.request_id if parsed.choices == 1 else f"{index}_{parsed.request_id}",
                prompt_tokens=prompt.tokens,
                max_tokens=plan.tokens,
                block_hashes=hashes,
                priority=parsed.priority,
                arrival_s=now,
                stop_reason=plan.finish_reason,
                prompt_tail=tail,
                cache_salt=parsed.cache_salt,
            )
            choice = Choice(seq, exchange, index, plan, prompt)
            seq.tag = choice
            exchange.choices.append(choice)
    return exchange


def _usage_source(exchange: Exchange, *, streaming: bool) -> Sequence:
    """Whose prefix-cache figures a response reports: a stream's first result, else the final one (vLLM)."""
    return exchange.choices[0].seq if streaming else exchange.choices[-1].seq


def _logprobs(choice: Choice, start: int, count: int, text_offset: int) -> dict | None:
    top = choice.request.parsed.logprobs
    if top is None:
        return None
    tokens = [choice.token_text(position) for position in range(start, start + count)]
    if choice.request.parsed.chat:
        return chat_logprobs(start, tokens, top)
    return completion_logprobs(start, tokens, top, text_offset)


def full_body(exchange: Exchange, created: int, fingerprint: str) -> dict:
    parsed = exchange.parsed
    choices = []
    for choice in exchange.choices:
        plan, text = choice.plan, choice.plan.text()
        echo = choice.prompt.text if parsed.echo else ""
        logprobs = _logprobs(choice, 0, plan.tokens, len(echo))
        build = chat_choice if parsed.chat else completion_choice
        choices.append(build(choice.index, echo + text, plan.finish_reason, plan.stop_reason, logprobs))
    source = _usage_source(exchange, streaming=False)
    generated = sum(choice.seq.generated for choice in exchange.choices)
    usage = usage_block(parsed, generated, source.cached_tokens, source.created_cache_tokens)
    return full_response(parsed, created, choices, usage, fingerprint)


async def stream(
    request: web.Request, exchange: Exchange, *, fingerprint: str, fail_after_tokens, reset_after_tokens=None
) -> web.StreamResponse:
    """Chunks as the engine produces tokens; the role chunks first (chat), the usage chunk and [DONE] last."""
    parsed = exchange.parsed
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
    await response.prepare(request)
    created = int(time.time())  # one value for every chunk of a response, as vLLM
    templates: dict[int, tuple[bytes, bytes]] = {}
    roles_sent = False
    while True:
        await exchange.event.wait()
        exchange.event.clear()
        frames = []
        if parsed.chat and not roles_sent and any(c.seq.generated for c in exchange.choices):
            roles_sent = True
            for choice in exchange.choices:
                usage = continuous_usage(parsed, choice.prompt.tokens, 0) if parsed.continuous_usage else None
                frames.append(_sse(chat_role_chunk(parsed, created, choice.index, usage)))
        for choice in exchange.choices:
            generated = choice.seq.generated
            while choice.sent_tokens < generated:
                if fail_after_tokens is not None and choice.sent_tokens >= fail_after_tokens:
                    # vLLM's mid-stream failure: an error event, then [DONE]; the request is aborted.
                    error = error_body(
                        "simulated engine failure mid-stream (fault injection)", status=500, kind="InternalServerError"
                    )
                    await response.write(b"".join(frames) + _sse(error) + _sse("[DONE]"))
                    await response.write_eof()
                    return response
                frames.append(_token_frame(choice, parsed, created, fingerprint, templates))
        if frames:
            await response.write(b"".join(frames))
        if reset_after_tokens is not None and any(c.sent_tokens >= reset_after_tokens for c in exchange.choices):
            # A replica that died mid-answer: the connection goes without an error event or [DONE].
            if request.transport is not None:
                request.transport.abort()
            raise ConnectionResetError("simulated connection reset mid-stream (fault injection)")
        if exchange.finished:
            break
    if parsed.include_usage:
        source = _usage_source(exchange, streaming=True)
        generated = sum(choice.seq.generated for choice in exchange.choices)
        usage = usage_block(parsed, generated, source.cached_tokens, source.created_cache_tokens, final_chunk=True)
        await response.write(_sse(usage_chunk(parsed, created, usage, fingerprint)))
    await response.write(_sse("[DONE]"))
    await response.write_eof()
    return response


def _text_between(start_char: int, end_char: int) -> str:
    """Characters ``start_char .. end_char`` of any answer's text, without building the text before them."""
    if end_char <= start_char:
        return ""
    first = start_char // CHARS_PER_TOKEN
    count = -(-end_char // CHARS_PER_TOKEN) - first
    offset = start_char - first * CHARS_PER_TOKEN
    return output_text(first, count)[offset : offset + end_char - start_char]


def _token_frame(choice: Choice, parsed: ParsedRequest, created: int, fingerprint: str, templates: dict) -> bytes:
    """The chunk of ``choice``'s next token (held-back text of a possible stop string stays unsent)."""
    position = choice.sent_tokens
    choice.sent_tokens += 1
    plan = choice.plan
    last = choice.sent_tokens == plan.tokens
    plain = (
        not last and parsed.logprobs is None and not parsed.continuous_usage and not (parsed.echo and position == 0)
    )
    if plain and not plan.holdback_chars:
        # The hot path: a whole token's text (only the last token of an answer can be cut), no JSON encoding.
        template = templates.get(choice.index)
        if template is None:
            template = templates[choice.index] = _content_template(parsed, created, choice.index)
        choice.sent_chars = choice.sent_tokens * CHARS_PER_TOKEN
        return template[0] + output_text(position, 1).encode() + template[1]
    shown = plan.visible_chars(choice.sent_tokens, last)
    start_chars = choice.sent_chars
    text = _text_between(start_chars, shown)
    choice.sent_chars = max(shown, start_chars)
    echo = parsed.echo and position == 0
    logprobs = _logprobs(choice, position, 1, start_chars + (len(choice.prompt.text) if parsed.echo else 0))
    if plain:
        template = templates.get(choice.index)
        if template is None:
            template = templates[choice.index] = _content_template(parsed, created, choice.index)
        return template[0] + text.encode() + template[1]
    reason = choice.plan.finish_reason if last else None
    stop_reason = choice.plan.stop_reason if last else None
    if parsed.chat:
        chunk = chat_chunk(
            parsed,
            created,
            {"content": text},
            reason,
            final=last,
            index=choice.index,
            logprobs=logprobs,
            stop_reason=stop_reason,
        )
    else:
        chunk = completion_chunk(
            parsed,
            created,
            (choice.prompt.text + text) if echo else text,
            reason,
            index=choice.index,
            logprobs=logprobs,
            stop_reason=stop_reason,
            prompt_token_ids=prompt_token_ids(choice.prompt.text, choice.request.vocab_size) if echo else None,
        )
    if parsed.continuous_usage:
        chunk["usage"] = continuous_usage(parsed, choice.prompt.tokens, choice.sent_tokens)
    if last and not parsed.include_usage:
        chunk["system_fingerprint"] = fingerprint
    return _sse(chunk)
