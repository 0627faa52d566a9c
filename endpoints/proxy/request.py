"""Reading and validating an OpenAI request before it costs anything: body size, JSON shape, field types."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from capacity.units import TYPICAL_OUTPUT_TOKENS, MUCoefficients, estimate_prompt_tokens, estimate_request_mu
from endpoints.admission import CLASSES
from endpoints.proxy.errors import ProxyError
from endpoints.proxy.isolation import CONTROLLED_FIELDS, STRIPPED_FIELDS, FieldRefused, engine_field_errors

PRIORITY_HEADER = b"x-infercap-priority"


@dataclass
class ParsedRequest:
    kind: str  # "chat" or "completions"
    body: dict
    raw: bytes
    model: str
    stream: bool
    client_wants_usage: bool
    max_tokens: int | None
    prompt_chars: int
    completions: int = 1  # sequences the engine generates: max(n, best_of)
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


def _text_len(content) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(p.get("text", "")) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return 0


def parse_request(kind: str, raw: bytes, *, max_n: int = 8) -> ParsedRequest:
    """Check a body's JSON shape and field types (each error a 400 naming the field) and count its prompt."""
    body = _json_object(raw)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("'model' is required and must be a non-empty string.", "model")
    stream, stream_options = _stream_fields(body)
    prompt_chars, max_tokens = _chat_fields(body) if kind == "chat" else _completion_fields(body)
    completions = _completions(body, max_n=max_n)
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


def _chat_fields(body: dict) -> tuple[int, int | None]:
    """(prompt characters, max_tokens) of a chat request; ``max_completion_tokens`` wins over ``max_tokens``."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("'messages' is required and must be a non-empty array.", "messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _bad(f"'messages[{i}]' must be an object with a string 'role'.", f"messages[{i}]")
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise _bad(f"'messages[{i}].content' must be a string or an array of parts.", f"messages[{i}].content")
    prompt_chars = sum(_text_len(m.get("content")) for m in messages)
    max_tokens = _opt_int(body, "max_completion_tokens", minimum=1)
    if max_tokens is None:
        max_tokens = _opt_int(body, "max_tokens", minimum=1)
    return prompt_chars, max_tokens


def _completion_fields(body: dict) -> tuple[int, int]:
    """(prompt characters, max_tokens) of a completions request: a string, strings or token ids."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        prompt_chars = len(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompt_chars = sum(len(p) for p in prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
        prompt_chars = 4 * len(prompt)  # token ids
    else:
        raise _bad("'prompt' is required: a string, an array of strings or an array of token ids.", "prompt")
    max_tokens = _opt_int(body, "max_tokens", minimum=1)
    if max_tokens is None:
        max_tokens = 16  # vLLM's and OpenAI's default for completions
    return prompt_chars, max_tokens


def _completions(body: dict, *, max_n: int) -> int:
    """How many sequences one request makes the engine generate; bounded, since one admission slot and one
    up-front charge would otherwise buy ``n`` times the work."""
    n = _opt_int(body, "n", minimum=1) or 1
    if n > max_n:
        raise _bad(f"'n' is {n}; at most {max_n} completions per request are allowed.", "n")
    best_of = _opt_int(body, "best_of", minimum=1)
    if best_of is None:
        return n
    if best_of < n:
        raise _bad(f"'best_of' ({best_of}) must be at least 'n' ({n}).", "best_of")
    if best_of > max_n:
        raise _bad(f"'best_of' is {best_of}; at most {max_n} candidates per request are allowed.", "best_of")
    return best_of


def request_cost(req: ParsedRequest, coeffs: MUCoefficients) -> tuple[float, int]:
    """(MU, tokens) charged at admission and to the tenant's limits: the prompt once (its blocks are shared by
    the request's sequences), the output once per sequence (``n`` or ``best_of``)."""
    prompt_tokens = estimate_prompt_tokens(req.prompt_chars)
    output_each = req.max_tokens if req.max_tokens is not None else TYPICAL_OUTPUT_TOKENS
    mu = estimate_request_mu(coeffs, prompt_tokens=prompt_tokens, max_tokens=output_each * req.completions)
    return mu, prompt_tokens + (req.max_tokens or 256) * req.completions


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
