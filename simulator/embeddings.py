"""``POST /v1/embeddings`` as vLLM serves it for a pooling model (``vllm serve --runner pooling``), measured on
vLLM 0.32's CPU build with the tiny test model: one prefill per input, then an ``embd-…`` list of vectors
(``encoding_format`` float, or base64 of little-endian float32), usage with the prompt tokens only. A model that
is not Matryoshka refuses ``dimensions``; an empty prompt is a 400. A pooling replica serves no completions and
a generating one no embeddings: both routes are then FastAPI's 404 ``{"detail": "Not Found"}``.

The simulated engine runs each input as a sequence of one output token (its prefill is the work; the engine has
no pooling step), so ``vllm:generation_tokens_total`` counts one per input where vLLM counts none.
docs/request-path.md#embeddings.
"""

from __future__ import annotations

import base64
import hashlib
import math
import random
import struct
import time
import uuid

from aiohttp import web

from simulator.protocol import parse_request
from simulator.serving import build_exchange, error_response, json_response
from simulator.validation import BadRequest

EMBEDDING_DIM = 256  # the tiny test model's hidden size: the length of the vectors vLLM returns for it


def _prompts(body: dict):
    """The ``input`` as a completions ``prompt`` (the same accepted shapes), or a BadRequest as vLLM words it."""
    inp = body.get("input")
    if inp == "" or (isinstance(inp, list) and any(p == "" or p == [] for p in inp)):
        raise BadRequest("The decoder prompt cannot be empty")
    if body.get("dimensions") is not None:
        raise BadRequest(
            f"Model '{body.get('model')}' does not support Matryoshka embeddings; dimensions must be unset "
            f"(received dimensions={body.get('dimensions')})."
        )
    if body.get("encoding_format", "float") not in ("float", "base64"):
        raise BadRequest("encoding_format must be 'float' or 'base64'")
    return inp


def vector(prompt) -> list[float]:
    """A unit vector determined by the prompt (the same input, the same embedding)."""
    seed = hashlib.sha256(repr(prompt.token_ids or prompt.text).encode()).digest()
    rng = random.Random(seed)
    values = [rng.gauss(0.0, 1.0) for _ in range(EMBEDDING_DIM)]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


def encoded(values: list[float], fmt: str):
    if fmt == "base64":
        return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()
    return values


async def embeddings(server, request: web.Request) -> web.StreamResponse:
    server.received += 1
    try:
        body = await server._read_body(request)
        if not isinstance(body, dict):
            raise BadRequest("Expected an object")
        prompt = _prompts(body)
        fields = {k: body[k] for k in ("model", "priority", "cache_salt") if k in body}
        parsed = parse_request(
            {**fields, "prompt": prompt, "max_tokens": 1},
            chat=False,
            served_model=server.model,
            max_model_len=server.profile.max_model_len,
            scheduling_policy=server.scheduling_policy,
            header_request_id=request.headers.get("X-Request-Id"),
            vocab_size=server.profile.vocab_size,
        )
    except BadRequest as exc:
        return error_response(exc)
    server.log_received(parsed, body)
    exchange = build_exchange(parsed, server.profile, server.now())
    added = []
    try:
        for choice in exchange.choices:
            added.append(server.engine.add(choice.seq))
        server._live.add(exchange)
        server._wake.set()
        while not exchange.finished:
            await exchange.event.wait()
            exchange.event.clear()
    except ValueError as exc:
        return error_response(BadRequest(str(exc)))
    finally:
        server._live.discard(exchange)
        for choice in exchange.choices:
            if choice.seq in added and not exchange.finished:
                server.engine.abort(choice.seq, server.now())
    fmt = body.get("encoding_format", "float")
    tokens = sum(p.tokens for p in parsed.prompts)
    return json_response(
        {
            # vLLM names the answer after the request's X-Request-Id when it has one (measured), else a fresh id.
            "id": f"embd-{request.headers.get('X-Request-Id') or uuid.uuid4().hex[:16]}",
            "object": "list",
            "created": int(time.time()),
            "model": parsed.model,
            "data": [
                {"index": i, "object": "embedding", "embedding": encoded(vector(p), fmt)}
                for i, p in enumerate(parsed.prompts)
            ],
            "usage": {
                "prompt_tokens": tokens,
                "total_tokens": tokens,
                "completion_tokens": 0,
                "prompt_tokens_details": None,
                "completion_tokens_details": None,
            },
        }
    )
