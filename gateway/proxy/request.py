"""Reading and validating an OpenAI request before it costs anything: body size, JSON shape, field types."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from capacity.units import TYPICAL_OUTPUT_TOKENS, MUCoefficients, estimate_prompt_tokens, estimate_request_mu
from gateway.admission import CLASSES
from gateway.proxy.errors import ProxyError
from gateway.proxy.isolation import CONTROLLED_FIELDS, STRIPPED_FIELDS, FieldRefused, engine_field_errors

PRIORITY_HEADER = b"x-infercap-priority"


@dataclass
class ParsedRequest:
    kind: str  # "chat", "completions" or "embeddings"
    body: dict
    raw: bytes
    model: str
    stream: bool
    client_wants_usage: bool
    max_tokens: int | None
    prompt_chars: int
    completions: int = 1  # sequences the engine generates: prompts × max(n, best_of)
    prompts: int = 1  # a /v1/completions batch: each prompt is its own prefill and its own n sequences
    min_tokens: int = 0  # the output each sequence is held to at least (vLLM's ``min_tokens``)
    controlled: bool = False  # the body names a field the proxy sets or removes (see ``upstream_payload``)


async def read_body(receive, *, limit: int, content_length: int | None, timeout_s: float = 10.0) -> bytes:
    if content_length is not None and content_length > limit:
        raise ProxyError(
            413, f"Request body is {content_length} bytes; the limit is {limit} bytes.", code="body_too_large"
        )
    # A client that trickles its body (slow loris) would otherwise hold a connection and a task forever.
    try:
        async with asyncio.timeout(timeout_s):
            return await _read_chunks(receive, limit=limit)
    except TimeoutError:
        raise ProxyError(
            408, f"The request body was not received within {timeout_s:g} s.", code="request_timeout"
        ) from None


async def _read_chunks(receive, *, limit: int) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ProxyError(499, "client disconnected", code="client_closed")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise ProxyError(413, f"Request body exceeds the limit of {limit} bytes.", code="body_too_large")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks) if len(chunks) != 1 else chunks[0]


def _bad(message: str, param: str | None = None) -> ProxyError:
    return ProxyError(400, message, param=param, code="invalid_value" if param else "invalid_request")


def _opt_int(body: dict, name: str, *, minimum: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"'{name}' must be an integer.", name)
    if value < minimum:
        raise _bad(f"'{name}' must be at least {minimum}.", name)
    return value


def _json_len(value) -> int:
    """Characters of ``value`` as JSON: what vLLM's chat template renders of a tool, a document or a part that is
    not text is at least about that much prompt (an image costs far more, and is settled to its real count)."""
    try:
        return len(json.dumps(value, separators=(",", ":")))
    except (TypeError, ValueError):
        return 0


def _text_len(content) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(
            len(p["text"]) if isinstance(p, dict) and isinstance(p.get("text"), str) else _json_len(p) for p in content
        )
    return 0


# Chat fields the template renders into the prompt besides the messages' content (docs/security.md, metering).
_RENDERED_CHAT_FIELDS = ("tools", "documents", "functions", "tool_choice", "chat_template_kwargs")


def parse_request(kind: str, raw: bytes, *, max_n: int = 8) -> ParsedRequest:
    """Check a body's JSON shape and field types (each error a 400 naming the field) and count its prompt."""
    body = _json_object(raw)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("'model' is required and must be a non-empty string.", "model")
    stream, stream_options = _stream_fields(body)
    if kind == "embeddings":
        if stream:
            raise _bad("Embeddings do not stream; leave 'stream' out.", "stream")
        prompt_chars, max_tokens, prompts = _embedding_fields(body)
        completions = 1
    else:
        prompt_chars, max_tokens, prompts = _chat_fields(body) if kind == "chat" else _completion_fields(body)
        completions = _completions(body, prompts=prompts, max_n=max_n)
    try:
        engine_field_errors(body)
    except FieldRefused as refused:
        raise _bad(str(refused), refused.param) from None
    # vLLM 0.32 streams usage only when the client sets include_usage to true: a present but empty stream_options
    # asks for none (measured on the engine; the simulator's contract test holds it to that).
    wants_usage = bool(stream and stream_options is not None and stream_options.get("include_usage") is True)
    return ParsedRequest(
        kind=kind,
        body=body,
        raw=raw,
        model=model,
        stream=stream,
        client_wants_usage=wants_usage,
        max_tokens=max_tokens,
        prompt_chars=prompt_chars,
        completions=completions,
        prompts=prompts,
        min_tokens=_opt_int(body, "min_tokens", minimum=0) or 0,
        controlled=not CONTROLLED_FIELDS.isdisjoint(body),
    )


def _json_object(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _bad(f"The request body is not valid JSON: {exc}.") from None
    except RecursionError:
        raise _bad("The request body nests too deeply.") from None
    if not isinstance(body, dict):
        raise _bad("The request body must be a JSON object.")
    return body


def _stream_fields(body: dict) -> tuple[bool, dict | None]:
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("'stream' must be a boolean.", "stream")
    stream_options = body.get("stream_options")
    if stream_options is not None:
        if not isinstance(stream_options, dict):
            raise _bad("'stream_options' must be an object.", "stream_options")
        if not stream:
            raise _bad("'stream_options' is only allowed when 'stream' is true.", "stream_options")
    return stream, stream_options


def _chat_fields(body: dict) -> tuple[int, int | None, int]:
    """(prompt characters, max_tokens, prompts) of a chat request; ``max_completion_tokens`` wins over
    ``max_tokens``. The characters count every part of every message (a part that is not text by its JSON) and the
    tools and documents the template renders into the prompt, so none of them rides free."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("'messages' is required and must be a non-empty array.", "messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _bad(f"'messages[{i}]' must be an object with a string 'role'.", f"messages[{i}]")
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise _bad(f"'messages[{i}].content' must be a string or an array of parts.", f"messages[{i}].content")
    prompt_chars = sum(_text_len(m.get("content")) + _message_extras_len(m) for m in messages)
    prompt_chars += sum(_json_len(body[name]) for name in _RENDERED_CHAT_FIELDS if body.get(name) is not None)
    max_tokens = _opt_int(body, "max_completion_tokens", minimum=1)
    if max_tokens is None:
        max_tokens = _opt_int(body, "max_tokens", minimum=1)
    return prompt_chars, max_tokens, 1


def _message_extras_len(message: dict) -> int:
    """What the template renders of a message besides its content and its role: its name and tool calls."""
    name = message.get("name")
    extra = len(name) if isinstance(name, str) else 0
    if message.get("tool_calls") is not None:
        extra += _json_len(message["tool_calls"])
    return extra


def _completion_fields(body: dict) -> tuple[int, int, int]:
    """(prompt characters, max_tokens, prompts) of a completions request: a string, strings (a batch: each one
    its own prompt) or token ids."""
    prompt = body.get("prompt")
    prompts = 1
    if isinstance(prompt, str):
        prompt_chars = len(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompt_chars, prompts = sum(len(p) for p in prompt), len(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
        prompt_chars = 4 * len(prompt)  # token ids
    else:
        raise _bad("'prompt' is required: a string, an array of strings or an array of token ids.", "prompt")
    max_tokens = _opt_int(body, "max_tokens", minimum=1)
    if max_tokens is None:
        max_tokens = 16  # vLLM's and OpenAI's default for completions
    return prompt_chars, max_tokens, prompts


MAX_EMBEDDING_INPUTS = 2048  # OpenAI's limit on an embeddings batch


def _embedding_fields(body: dict) -> tuple[int, int, int]:
    """(prompt characters, 0 tokens out, inputs) of an embeddings request: a string, strings, token ids or arrays of
    token ids, as OpenAI and vLLM take them; each input its own prompt."""
    inp = body.get("input")
    if isinstance(inp, str) and inp:
        chars, inputs = len(inp), 1
    elif isinstance(inp, list) and inp and all(isinstance(p, str) and p for p in inp):
        chars, inputs = sum(len(p) for p in inp), len(inp)
    elif isinstance(inp, list) and inp and all(_token_ids(p) for p in inp):
        chars, inputs = 4 * sum(len(p) for p in inp), len(inp)
    elif _token_ids(inp):
        chars, inputs = 4 * len(inp), 1
    else:
        raise _bad(
            "'input' is required: a non-empty string, an array of non-empty strings, an array of token ids or an "
            "array of such arrays.",
            "input",
        )
    if inputs > MAX_EMBEDDING_INPUTS:
        raise _bad(f"'input' holds {inputs} items; at most {MAX_EMBEDDING_INPUTS} per request.", "input")
    fmt = body.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise _bad("'encoding_format' must be 'float' or 'base64'.", "encoding_format")
    _opt_int(body, "dimensions", minimum=1)
    return chars, 0, inputs


def _token_ids(value) -> bool:
    return (
        isinstance(value, list) and bool(value) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    )


def _completions(body: dict, *, prompts: int, max_n: int) -> int:
    """How many sequences one request makes the engine generate: each prompt of a batch times ``n`` (or
    ``best_of``). Bounded, since one admission slot would otherwise carry that many times the work; priced per
    sequence (``request_cost``)."""
    n = _opt_int(body, "n", minimum=1) or 1
    if n > max_n:
        raise _bad(f"'n' is {n}; at most {max_n} completions per request are allowed.", "n")
    best_of = _opt_int(body, "best_of", minimum=1)
    if best_of is not None:
        if best_of < n:
            raise _bad(f"'best_of' ({best_of}) must be at least 'n' ({n}).", "best_of")
        if best_of > max_n:
            raise _bad(f"'best_of' is {best_of}; at most {max_n} candidates per request are allowed.", "best_of")
        n = best_of
    if prompts * n > max_n:
        raise _bad(
            f"{prompts} prompts × {n} completions each is {prompts * n} sequences; at most {max_n} sequences per "
            "request are allowed (send the prompts in several requests).",
            "prompt",
        )
    return prompts * n


@dataclass(slots=True)
class RequestCost:
    """A request's cost before it runs. ``mu`` is what admission weighs on a replica (a missing ``max_tokens``
    counts a typical answer); ``charge_mu`` and ``charge_tokens`` are what the tenant's limits take up front, the
    most it can cost (a missing ``max_tokens`` counts all the context it may fill). Metering settles both to the
    real cost."""

    mu: float
    charge_mu: float
    charge_tokens: int


def request_cost(req: ParsedRequest, coeffs: MUCoefficients, *, max_model_len: int | None = None) -> RequestCost:
    """The prompt counted once per prompt of a batch (``n`` sequences of one prompt share its blocks), the output
    once per sequence; no sequence counted below its ``min_tokens``."""
    prompt_tokens = estimate_prompt_tokens(req.prompt_chars)
    floor = req.min_tokens
    expected_each = max(req.max_tokens if req.max_tokens is not None else TYPICAL_OUTPUT_TOKENS, floor)
    if req.max_tokens is not None:
        most_each = max(req.max_tokens, floor)
    elif max_model_len:
        # vLLM generates up to the context's end: what one prompt of the batch leaves of it.
        most_each = max(max_model_len - prompt_tokens // req.prompts, floor, 1)
    else:
        most_each = expected_each
    mu = estimate_request_mu(coeffs, prompt_tokens=prompt_tokens, max_tokens=expected_each * req.completions)
    charge_mu = estimate_request_mu(coeffs, prompt_tokens=prompt_tokens, max_tokens=most_each * req.completions)
    return RequestCost(mu=mu, charge_mu=charge_mu, charge_tokens=prompt_tokens + most_each * req.completions)


def upstream_payload(
    req: ParsedRequest, *, cache_salt: str, engine_priority: int | None, engine_model: str | None = None
) -> bytes:
    """The body sent to the replica: the tenant's cache salt and the admitted class's engine priority replace
    whatever the client sent (``engine_priority`` None: the replica runs fcfs, which refuses the field, so it is
    removed), fields no tenant may hand the engine are dropped, and usage is always requested on streams so
    metering is exact. ``engine_model``: the model name the replica serves, when it is not the endpoint's."""
    options = req.body.get("stream_options") if req.stream else None
    need_usage = req.stream and not (isinstance(options, dict) and options.get("include_usage") is True)
    if not req.controlled and engine_model is None and (options is None or not need_usage):
        # The common case: splice the proxy's fields in before the object's closing brace instead of serialising
        # the whole body again (the body was parsed as a JSON object, so its last non-blank byte is that brace;
        # it names none of these fields, so no key is duplicated).
        raw = req.raw.rstrip()
        if raw.endswith(b"}") and raw.lstrip()[:1] == b"{":
            tail = b',"cache_salt":"' + cache_salt.encode() + b'"'
            if engine_priority is not None:
                tail += b',"priority":' + str(int(engine_priority)).encode()
            if need_usage:
                tail += b',"stream_options":{"include_usage":true}'
            return raw[:-1] + tail + b"}"
    body = {k: v for k, v in req.body.items() if k not in STRIPPED_FIELDS}
    if engine_model is not None:
        # Serialised again rather than spliced: "model" is already in the raw bytes, and the first such key there
        # need not be the top-level one (a tool's JSON schema may name a "model" property).
        body["model"] = engine_model
    body["cache_salt"] = cache_salt
    if engine_priority is not None:
        body["priority"] = int(engine_priority)
    else:
        body.pop("priority", None)
    if need_usage:
        body["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    return json.dumps(body, separators=(",", ":")).encode()


def requested_priority(headers: dict[bytes, bytes]) -> str | None:
    raw = headers.get(PRIORITY_HEADER)
    if raw is None:
        return None
    value = raw.decode("latin-1").strip().lower()
    if value not in CLASSES:
        raise ProxyError(
            400,
            f"x-infercap-priority must be one of {', '.join(CLASSES)}.",
            param="x-infercap-priority",
            code="invalid_value",
        )
    return value
