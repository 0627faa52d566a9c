"""The usage of a request that reached a replica but ended before the replica's usage block: the client left
mid-stream (or before its first token), or the stream stopped and was ended with an error event. The replica spent
the prompt's prefill the moment it took the request and every token the client was sent, so both are metered
(docs/request-path.md, metering): the prompt's exact token count from the replica's own ``POST /tokenize`` (the
chat template, tools and special tokens as the engine renders them), else the proxy's estimate; the output as
the token chunks relayed, one token per choice's chunk as vLLM streams. Off the request path: only these requests
pay for it, after their client has gone."""

from __future__ import annotations

import asyncio
import json
import logging

import aiohttp

from capacity.units import estimate_prompt_tokens
from gateway.proxy.relay import Outcome
from gateway.proxy.request import ParsedRequest

log = logging.getLogger(__name__)

TOKENIZE_TIMEOUT_S = 2.0
# Chat fields ``/tokenize`` renders the way the completion did (vLLM's TokenizeChatRequest).
_CHAT_TOKENIZE_FIELDS = (
    "messages",
    "tools",
    "add_generation_prompt",
    "continue_final_message",
    "chat_template_kwargs",
    "add_special_tokens",
)


def needs_partial_usage(outcome: Outcome | None, cancel_reason: str | None) -> bool:
    """A request with no usage block whose replica computed something: it streamed tokens to the client, or the
    client left after it was dispatched (the prefill had started). A replica's refusal (4xx) computed nothing."""
    if outcome is None or outcome.usage is not None or outcome.error.startswith("replica answered 4"):
        return False
    return outcome.content_events > 0 or cancel_reason == "client"


def partial_usage(prompt_tokens: int, outcome: Outcome) -> dict:
    """The usage block the replica would have sent for what it delivered (no cached tokens known: all counted as
    computed, the higher rate)."""
    output = max(0, outcome.content_events)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": output,
        "total_tokens": prompt_tokens + output,
        "estimated": True,
    }


def tokenize_bodies(req: ParsedRequest) -> list[dict] | None:
    """The ``/tokenize`` bodies that count ``req``'s prompt (one per prompt of a batch); None for token ids, whose
    count is their length."""
    body = req.body
    if req.kind == "chat":
        return [{k: body[k] for k in _CHAT_TOKENIZE_FIELDS if k in body}]
    prompt = body.get("prompt")
    special = body.get("add_special_tokens", True)
    if isinstance(prompt, str):
        return [{"prompt": prompt, "add_special_tokens": special}]
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        return [{"prompt": p, "add_special_tokens": special} for p in prompt]
    return None


async def prompt_token_count(session: aiohttp.ClientSession | None, url: str | None, req: ParsedRequest) -> int:
    """The prompt's tokens as the replica at ``url`` counts them; the estimate if it cannot answer."""
    counted = await replica_prompt_tokens(session, url, req)
    return counted if counted is not None else estimate_prompt_tokens(req.prompt_chars)


async def replica_prompt_tokens(
    session: aiohttp.ClientSession | None, url: str | None, req: ParsedRequest
) -> int | None:
    """The prompt's tokens as the replica at ``url`` counts them (token ids: their number); None if it cannot say."""
    bodies = tokenize_bodies(req)
    if bodies is None:
        prompt = req.body.get("prompt")
        return len(prompt) if isinstance(prompt, list) else None
    if session is None or url is None:
        return None
    try:
        async with asyncio.timeout(TOKENIZE_TIMEOUT_S):
            counts = await asyncio.gather(*(_tokenize(session, url, body) for body in bodies))
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError, KeyError, TypeError) as exc:
        log.info("prompt not tokenized by %s (%s)", url, exc)
        return None
    return sum(counts)


async def _tokenize(session: aiohttp.ClientSession, url: str, body: dict) -> int:
    payload = json.dumps(body, separators=(",", ":")).encode()
    async with session.post(url + "/tokenize", data=payload, headers={"content-type": "application/json"}) as resp:
        if resp.status != 200:
            raise ValueError(f"/tokenize answered {resp.status}")
        count = (await resp.json(content_type=None))["count"]
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError("/tokenize answered no count")
    return count
