"""vLLM 0.32's response bodies and SSE chunks, key for key (pure).

What the real engine sends (``tests/engine/test_contract.py`` compares both): ``system_fingerprint``
(``vllm-<version>-<hash8>``) on every full response, on a stream's terminal chunk of each choice, or on the usage
chunk when there is one; ``prompt_tokens_details`` always, with ``created_cache_tokens`` for chat (``null`` for
completions); ``null`` fields dropped from a stream's usage chunk; a chat stream opening with one role chunk per
choice; completion chunks without a ``usage`` key unless continuous usage stats were asked for.
"""

from __future__ import annotations

import hashlib

from simulator.protocol import VLLM_VERSION, ParsedRequest


def system_fingerprint(*parts: object) -> str:
    """``vllm-<version>-<hash8>``: vLLM hashes its whole configuration; the simulator hashes what defines it."""
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()
    return f"vllm-{VLLM_VERSION}-{digest[:8]}"


def response_id(req: ParsedRequest) -> str:
    return f"{'chatcmpl' if req.chat else 'cmpl'}-{req.request_id}"


def usage_block(
    req: ParsedRequest, completion_tokens: int, cached_tokens: int, created_cache_tokens: int, *, final_chunk=False
) -> dict:
    """The usage of a whole response (``final_chunk``: a stream's last chunk, where vLLM drops null fields)."""
    prompt_tokens = req.prompt_tokens
    details = {
        "cached_tokens": cached_tokens,
        "created_cache_tokens": created_cache_tokens if req.chat else None,
        "multimodal_tokens": None,
    }
    usage = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": details,
        "completion_tokens_details": None,
    }
    if final_chunk:
        usage.pop("completion_tokens_details")
        usage["prompt_tokens_details"] = {k: v for k, v in details.items() if v is not None}
    return usage


def continuous_usage(req: ParsedRequest, prompt_tokens: int, completion_tokens: int) -> dict:
    """``continuous_usage_stats``: the usage so far of one choice, on each of its chunks."""
    usage = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }
    if req.chat:
        usage["completion_tokens_details"] = None
    return usage


def chat_role_chunk(req: ParsedRequest, created: int, index: int, usage: dict | None = None) -> dict:
    chunk = {
        "id": response_id(req),
        "object": "chat.completion.chunk",
        "created": created,
        "model": req.model,
        "choices": [
            {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        ],
    }
    if usage is not None:
        chunk["usage"] = usage
    chunk["prompt_token_ids"] = None
    chunk["prompt_text"] = None
    return chunk


def chat_chunk(
    req: ParsedRequest,
    created: int,
    delta: dict,
    finish_reason: str | None = None,
    final: bool = False,
    *,
    index: int = 0,
    logprobs: dict | None = None,
    stop_reason: str | None = None,
) -> dict:
    choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
    if final:
        choice["stop_reason"] = stop_reason
    choice["token_ids"] = None
    return {
        "id": response_id(req),
        "object": "chat.completion.chunk",
        "created": created,
        "model": req.model,
        "choices": [choice],
    }


def completion_chunk(
    req: ParsedRequest,
    created: int,
    text: str,
    finish_reason: str | None = None,
    *,
    index: int = 0,
    logprobs: dict | None = None,
    stop_reason: str | None = None,
    prompt_token_ids: list[int] | None = None,
) -> dict:
    return {
        "id": response_id(req),
        "object": "text_completion",
        "created": created,
        "model": req.model,
        "choices": [
            {
                "index": index,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": finish_reason,
                "stop_reason": stop_reason,
                "prompt_token_ids": prompt_token_ids,
                "token_ids": None,
            }
        ],
    }


def usage_chunk(req: ParsedRequest, created: int, usage: dict, fingerprint: str) -> dict:
    return {
        "id": response_id(req),
        "object": "chat.completion.chunk" if req.chat else "text_completion",
        "created": created,
        "model": req.model,
        "choices": [],
        "usage": usage,
        "system_fingerprint": fingerprint,
    }


def chat_choice(index: int, text: str, finish_reason: str, stop_reason, logprobs: dict | None) -> dict:
    message = {
        "role": "assistant",
        "content": text,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "reasoning": None,
    }
    return {
        "index": index,
        "message": message,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
        "token_ids": None,
        "routed_experts": None,
    }


def completion_choice(index: int, text: str, finish_reason: str, stop_reason, logprobs: dict | None) -> dict:
    return {
        "index": index,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
        "token_ids": None,
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "routed_experts": None,
    }


def full_response(req: ParsedRequest, created: int, choices: list[dict], usage: dict, fingerprint: str) -> dict:
    body = {
        "id": response_id(req),
        "object": "chat.completion" if req.chat else "text_completion",
        "created": created,
        "model": req.model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": fingerprint,
        "usage": usage,
    }
    if req.chat:
        body |= {"prompt_logprobs": None, "prompt_token_ids": None, "prompt_text": None}
    return body | {"kv_transfer_params": None, "ec_transfer_params": None, "metrics": None}
