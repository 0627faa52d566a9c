"""vLLM's OpenAI-compatible request validation and response shapes (VLLM_CONTRACT.md §2–§5), pure.

Output length: with ``max_tokens`` / ``max_completion_tokens`` the simulator generates exactly that many tokens
(``finish_reason: "length"``, as ``ignore_eos`` gives); without it a chat reply has a deterministic natural
length of 16–255 tokens (``"stop"``), capped by the context; completions default to 16 tokens like vLLM.
"""

from __future__ import annotations

import uuid
import zlib
from dataclasses import dataclass

from .tokens import count_tokens, render_chat


class BadRequest(ValueError):
    def __init__(self, message: str, *, status: int = 400, param: str | None = None, kind: str | None = None):
        super().__init__(message)
        self.status = status
        self.param = param
        self.kind = kind or {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")


def error_body(message: str, *, status: int, kind: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


@dataclass
class ParsedRequest:
    chat: bool
    request_id: str
    model: str
    prompt_text: str
    prompt_tokens: int
    max_tokens: int
    max_tokens_param: int | None
    finish_reason: str
    stream: bool
    include_usage: bool
    continuous_usage: bool
    priority: int
    cache_salt: str | None


def _int_field(body: dict, name: str, *, minimum: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{name} must be an integer (parameter={name}, value={value!r})", param=name)
    if minimum is not None and value < minimum:
        raise BadRequest(
            f"{name} must be at least {minimum}, got {value}. (parameter={name}, value={value})", param=name
        )
    return value


def parse_request(
    body, *, chat: bool, served_model: str, max_model_len: int, scheduling_policy: str, header_request_id: str | None
) -> ParsedRequest:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    model = body.get("model") or served_model
    if model != served_model:
        raise BadRequest(f"The model `{model}` does not exist.", status=404, param="model")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list of {role, content} objects", param="messages")
        if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            raise BadRequest("every message must be an object with a string 'role'", param="messages")
        prompt_text = render_chat(messages)
        prompt_tokens = count_tokens(prompt_text)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            prompt_text, prompt_tokens = prompt, count_tokens(prompt)
        elif (
            isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        ):
            prompt_text, prompt_tokens = " ".join(map(str, prompt)), len(prompt)
        else:
            raise BadRequest("prompt must be a string or a list of token ids (one prompt per request)", param="prompt")
    if prompt_tokens < 1:
        raise BadRequest("the prompt is empty", param="prompt")
    n = _int_field(body, "n", minimum=1)
    if n not in (None, 1):
        raise BadRequest(f"the simulator serves n=1 only (parameter=n, value={n})", param="n")
    requested = _int_field(body, "max_completion_tokens", minimum=1) if chat else None
    if requested is None:
        requested = _int_field(body, "max_tokens", minimum=1)
    if prompt_tokens >= max_model_len:
        raise BadRequest(
            f"This model's maximum context length is {max_model_len} tokens. However, your request has "
            f"{prompt_tokens} input tokens. Please reduce the length of the input messages. "
            f"(parameter=input_tokens, value={prompt_tokens})",
            param="input_tokens",
        )
    room = max_model_len - prompt_tokens
    if requested is not None:
        if requested > room:
            raise BadRequest(
                f"'max_tokens' or 'max_completion_tokens' is too large: {requested}. This model's maximum context "
                f"length is {max_model_len} tokens and your request has {prompt_tokens} input tokens "
                f"({requested} > {max_model_len} - {prompt_tokens}). (parameter=max_tokens, value={requested})",
                param="max_tokens",
            )
        max_tokens, finish_reason = requested, "length"
    elif chat:
        max_tokens, finish_reason = min(room, 16 + zlib.crc32(prompt_text.encode()) % 240), "stop"
    else:
        max_tokens, finish_reason = min(room, 16), "length"
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("stream must be a boolean", param="stream")
    options = body.get("stream_options")
    if options is not None:
        if not stream:
            raise BadRequest("Stream options can only be defined when `stream=True`.", param="stream_options")
        if not isinstance(options, dict):
            raise BadRequest("stream_options must be an object", param="stream_options")
    priority = _int_field(body, "priority") or 0
    if priority and scheduling_policy != "priority":
        raise BadRequest(f"Got priority {priority} but Priority scheduling is not enabled.", param="priority")
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise BadRequest("Parameter 'cache_salt' must be a non-empty string if provided.", param="cache_salt")
    request_id = header_request_id or body.get("request_id") or uuid.uuid4().hex
    return ParsedRequest(
        chat=chat,
        request_id=str(request_id),
        model=model,
        prompt_text=prompt_text,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        max_tokens_param=requested,
        finish_reason=finish_reason,
        stream=stream,
        include_usage=options is not None and options.get("include_usage", True) is not False,
        continuous_usage=bool(options and options.get("continuous_usage_stats")),
        priority=priority,
        cache_salt=salt,
    )


def usage_block(prompt_tokens: int, completion_tokens: int, cached_tokens: int, *, streaming: bool) -> dict:
    usage = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }
    if cached_tokens > 0:
        usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    elif not streaming:
        usage["prompt_tokens_details"] = None
    return usage


def chat_chunk(
    req: ParsedRequest, created: int, delta: dict, finish_reason: str | None = None, final: bool = False
) -> dict:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    if final:
        choice["stop_reason"] = None
    return {
        "id": f"chatcmpl-{req.request_id}",
        "object": "chat.completion.chunk",
        "created": created,
        "model": req.model,
        "choices": [choice],
    }


def completion_chunk(req: ParsedRequest, created: int, text: str, finish_reason: str | None = None) -> dict:
    return {
        "id": f"cmpl-{req.request_id}",
        "object": "text_completion",
        "created": created,
        "model": req.model,
        "choices": [
            {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
                "prompt_token_ids": None,
                "token_ids": None,
            }
        ],
        "usage": None,
    }


def usage_chunk(req: ParsedRequest, created: int, usage: dict) -> dict:
    kind = "chat.completion.chunk" if req.chat else "text_completion"
    prefix = "chatcmpl" if req.chat else "cmpl"
    return {
        "id": f"{prefix}-{req.request_id}",
        "object": kind,
        "created": created,
        "model": req.model,
        "choices": [],
        "usage": usage,
    }


def full_response(req: ParsedRequest, created: int, text: str, finish_reason: str, usage: dict) -> dict:
    if req.chat:
        return {
            "id": f"chatcmpl-{req.request_id}",
            "object": "chat.completion",
            "created": created,
            "model": req.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text, "reasoning_content": None, "tool_calls": []},
                    "logprobs": None,
                    "finish_reason": finish_reason,
                    "stop_reason": None,
                }
            ],
            "usage": usage,
            "service_tier": None,
            "system_fingerprint": None,
            "prompt_logprobs": None,
            "kv_transfer_params": None,
        }
    return {
        "id": f"cmpl-{req.request_id}",
        "object": "text_completion",
        "created": created,
        "model": req.model,
        "choices": [
            {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
                "prompt_logprobs": None,
            }
        ],
        "usage": usage,
    }
