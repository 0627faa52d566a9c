"""vLLM 0.32's OpenAI-compatible request parsing and validation, pure (checked against a real engine by
``tests/engine/test_contract.py``).

Checks run in vLLM's order: the body's field types (pydantic, ``validation.Body``), the request model's own
validators (stream options, logprobs, cache salt), the model name, the prompt (rendered and counted), the
context limits, then the sampling parameters. Messages are vLLM's, word for word (``tests/engine/test_contract.py``
compares them with a real engine).

How long an answer runs is decided per choice by ``outputs.plan_output``: EOS after a length drawn from the
profile, a stop string, or ``max_tokens`` (by default the rest of the context for chat, 16 for completions).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Collection
from dataclasses import dataclass, field
from types import SimpleNamespace

from simulator.tokens import count_tokens, render_chat
from simulator.validation import BadRequest, Body, FormatErrors, body_not_an_object, error_body, vllm_error

__all__ = ["BadRequest", "ParsedRequest", "Prompt", "error_body", "parse_request"]

MAX_LOGPROBS = 20  # vLLM's default --max-logprobs
MAX_N = 16384  # vLLM's VLLM_MAX_N_SEQUENCES default
SAMPLING_EPS = 1e-5  # below this temperature vLLM samples greedily (``vllm.sampling_params._SAMPLING_EPS``)
VLLM_VERSION = "0.32.0"
# The branch of vLLM's message union that pydantic reports first for a malformed chat message.
_FIRST_MESSAGE_BRANCH = "ChatCompletionDeveloperMessageParam"


@dataclass
class Prompt:
    text: str
    tokens: int
    token_ids: list[int] | None = None  # when the client sent token ids


@dataclass
class ParsedRequest:
    chat: bool
    request_id: str
    model: str
    prompts: list[Prompt]
    max_tokens_param: int | None  # what the client asked for (vllm:request_params_max_tokens)
    stream: bool
    include_usage: bool
    continuous_usage: bool
    priority: int
    cache_salt: str | None
    n: int = 1
    max_tokens: list[int] = field(default_factory=list)  # per prompt: the cap after vLLM's clamp to the context
    min_tokens: int = 0
    ignore_eos: bool = False
    stop: list[str] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    seed: int | None = None
    logprobs: int | None = None  # alternatives per token; None: no logprobs
    echo: bool = False

    @property
    def prompt_text(self) -> str:
        return self.prompts[0].text

    @property
    def prompt_tokens(self) -> int:
        return sum(prompt.tokens for prompt in self.prompts)

    @property
    def choices(self) -> int:
        return self.n * len(self.prompts)


def _render_messages(
    messages, format_errors: FormatErrors, *, generation_prompt: bool, continue_final: bool
) -> str | None:
    if not isinstance(messages, list):
        format_errors.add("list_type", "body.messages", "Input should be a valid list", messages)
        return None
    for i, message in enumerate(messages):
        loc = f"body.messages.{i}.{_FIRST_MESSAGE_BRANCH}"
        if not isinstance(message, dict):
            format_errors.add(
                "dict_type",
                f"body.messages.{i}.{_FIRST_MESSAGE_BRANCH}",
                "Input should be a valid dictionary",
                message,
            )
        elif not isinstance(message.get("role"), str):
            format_errors.add("missing", f"{loc}.role", "Field required", message)
        elif not isinstance(message.get("content"), (str, list, type(None))):
            format_errors.add("string_type", f"{loc}.content", "Input should be a valid string", message["content"])
        elif isinstance(message.get("content"), list):
            for j, part in enumerate(message["content"]):
                if not isinstance(part, dict):
                    format_errors.add("dict_type", f"{loc}.content.{j}", "Input should be a valid dictionary", part)
                elif not isinstance(part.get("text", ""), str):
                    format_errors.add("string_type", f"{loc}.content.{j}.text", "Input should be a valid string", part)
    if format_errors.errors:
        return None
    return render_chat(messages, add_generation_prompt=generation_prompt, continue_final=continue_final)


def _completion_prompts(body: dict, format_errors: FormatErrors) -> list[Prompt] | None:
    prompt = body.get("prompt")
    if prompt is None or prompt == "":
        return None
    if isinstance(prompt, str):
        return [Prompt(prompt, count_tokens(prompt))]
    if isinstance(prompt, list):
        if all(isinstance(p, str) for p in prompt):
            return [Prompt(p, count_tokens(p)) for p in prompt]
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return [_token_prompt(prompt)] if prompt else []
        if all(isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p) for p in prompt):
            return [_token_prompt(p) for p in prompt]
    # pydantic tries each branch of the prompt union: list[int], list[list[int]], str, list[str].
    for kind, msg in (
        ("list_type", "Input should be a valid list"),
        ("list_type", "Input should be a valid list"),
        ("string_type", "Input should be a valid string"),
        ("list_type", "Input should be a valid list"),
    ):
        format_errors.add(kind, "body.prompt", msg, prompt)
    return []


def _token_prompt(token_ids: list[int]) -> Prompt:
    return Prompt(" ".join(map(str, token_ids)), len(token_ids), list(token_ids))


def _check_request_validators(fields: Body, *, chat: bool, stream: bool, options) -> None:
    """The request model's validators (raised at parse time, before the model name is checked)."""
    body = fields.body
    if options is not None and not stream:
        raise vllm_error("Stream options can only be defined when `stream=True`.", param="stream_options")
    if chat:
        if body.get("continue_final_message") and body.get("add_generation_prompt"):
            raise vllm_error("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
        top = fields.int("top_logprobs")
        if top is not None:
            if top < 0 and top != -1:
                raise vllm_error("`top_logprobs` must be a positive value or -1.", param="top_logprobs", value=top)
            if not fields.bool("logprobs", False):
                raise vllm_error("when using `top_logprobs`, `logprobs` must be set to true.", param="top_logprobs")
    else:
        logprobs = fields.int("logprobs")
        if logprobs is not None and logprobs < 0 and logprobs != -1:
            raise vllm_error("`logprobs` must be a positive value or -1.", param="logprobs", value=logprobs)
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise vllm_error("Parameter 'cache_salt' must be a non-empty string if provided.", param="cache_salt")


def parse_request(
    body,
    *,
    chat: bool,
    served_model: str,
    max_model_len: int,
    scheduling_policy: str,
    header_request_id: str | None,
    vocab_size: int = 32000,
    adapters: Collection[str] = (),
) -> ParsedRequest:
    if not isinstance(body, dict):
        raise body_not_an_object(body)
    fields = Body(body)
    v = _typed_fields(fields, chat=chat)
    fields.check()
    _check_request_validators(fields, chat=chat, stream=v.stream, options=v.options)
    model = v.model or served_model
    if model != served_model and model not in adapters:  # a loaded LoRA adapter is served under its own name
        raise BadRequest(
            f"The model `{model}` does not exist. Valid aliases: {served_model}.", status=404, param="model"
        )
    if chat and body.get("continue_final_message") and body.get("add_generation_prompt", True) is not False:
        # Raised when the chat template is applied (the tokenizer's), after the model name is checked.
        raise vllm_error(
            "continue_final_message and add_generation_prompt are not compatible. Use continue_final_message when "
            "you want the model to continue the final message, and add_generation_prompt when you want to add a "
            "header that will prompt it to start a new assistant message instead."
        )
    prompts = _checked_prompts(body, v, chat=chat, max_model_len=max_model_len)
    # -- the sampling parameters (vLLM's SamplingParams._verify_args, in its order) -------------------
    default = None if chat else 16
    wanted = v.requested if v.requested is not None else default
    # vLLM clamps to what the context leaves (an exact fit leaves 0: "max_tokens must be at least 1").
    caps = [max_model_len - p.tokens if wanted is None else min(max_model_len - p.tokens, wanted) for p in prompts]
    _verify_sampling(
        n=v.n,
        presence=v.presence,
        frequency=v.frequency,
        repetition=v.repetition,
        temperature=v.temperature,
        top_p=v.top_p,
        top_k=v.top_k,
        min_p=v.min_p,
        max_tokens=min(caps),
        min_tokens=v.min_tokens,
        stop=v.stop,
    )
    logprobs = _logprobs(fields, chat=chat, vocab_size=vocab_size)
    if v.priority and scheduling_policy != "priority":
        raise vllm_error(f"Got priority {v.priority} but Priority scheduling is not enabled.", param="priority")
    return ParsedRequest(
        chat=chat,
        request_id=str(header_request_id or v.request_id or f"{uuid.uuid4().int & (2**64 - 1):016x}"),
        model=model,
        prompts=prompts,
        max_tokens_param=v.requested,
        stream=v.stream,
        include_usage=bool(v.include_usage),
        continuous_usage=bool(v.continuous),
        priority=v.priority,
        cache_salt=body.get("cache_salt"),
        n=v.n,
        max_tokens=caps,
        min_tokens=v.min_tokens,
        ignore_eos=v.ignore_eos,
        stop=v.stop,
        include_stop_str_in_output=v.include_stop,
        seed=v.seed,
        logprobs=logprobs,
        echo=v.echo,
    )


def _typed_fields(fields: Body, *, chat: bool) -> SimpleNamespace:
    """The body's types (pydantic): every wrong field is collected in ``fields.format``, reported at once by
    ``fields.check()``. Read in the order vLLM's request model declares them, so the errors come in its order."""
    body = fields.body
    v = SimpleNamespace(model=fields.str("model"), prompt_text=None, prompts=None)
    if chat:
        if "messages" not in body:
            fields.format.add("missing", "body.messages", "Field required", body)
        else:
            v.prompt_text = _render_messages(
                body["messages"],
                fields.format,
                generation_prompt=fields.bool("add_generation_prompt", True),
                continue_final=fields.bool("continue_final_message", False),
            )
    else:
        v.prompts = _completion_prompts(body, fields.format)
    v.requested = fields.int("max_completion_tokens") if chat else None
    if v.requested is None:
        v.requested = fields.int("max_tokens")
    v.n = fields.int("n", 1)
    v.temperature = fields.float("temperature")
    v.top_p = fields.float("top_p")
    v.top_k = fields.int("top_k")
    v.min_p = fields.float("min_p")
    v.presence = fields.float("presence_penalty", 0.0)
    v.frequency = fields.float("frequency_penalty", 0.0)
    v.repetition = fields.float("repetition_penalty", 1.0)
    v.seed = fields.int("seed")
    v.stream = fields.bool("stream", False)
    v.options = fields.object("stream_options")
    v.stop = fields.str_or_list("stop")
    v.include_stop = fields.bool("include_stop_str_in_output", False)
    v.ignore_eos = fields.bool("ignore_eos", False)
    v.min_tokens = fields.int("min_tokens", 0)
    v.priority = fields.int("priority", 0)
    v.echo = fields.bool("echo", False) if not chat else False
    v.request_id = fields.str("request_id")
    v.include_usage = v.continuous = False
    if v.options is not None:  # vLLM's defaults: no usage chunk unless asked for
        v.include_usage = _option(fields, v.options, "include_usage")
        v.continuous = v.include_usage and _option(fields, v.options, "continuous_usage_stats")
    return v


def _checked_prompts(body: dict, v: SimpleNamespace, *, chat: bool, max_model_len: int) -> list[Prompt]:
    """The prompts (a chat's rendered conversation, or the completion's prompts), refused when empty, or when they
    or ``max_tokens`` exceed the model's context."""
    if chat:
        if not body["messages"]:
            raise BadRequest("Cannot apply chat template to an empty conversation. Provide at least one message.")
        prompts = [Prompt(v.prompt_text, count_tokens(v.prompt_text))]
    else:
        if body.get("suffix") is not None:
            raise BadRequest("suffix is only supported for models with FIM completion rendering", param="suffix")
        if v.prompts is None:
            raise vllm_error("Either prompt or prompt_embeds must be provided and non-empty.", param="prompt")
        if not v.prompts:
            raise BadRequest("You must pass at least one prompt")
        prompts = v.prompts
    if v.requested is not None and v.requested > max_model_len:
        raise vllm_error(
            f"max_tokens={v.requested} cannot be greater than max_model_len={max_model_len}. "
            "Please request fewer output tokens.",
            param="max_tokens",
            value=v.requested,
        )
    for prompt in prompts:
        # The tokenizer stops one token past the limit, so a long text is "at least" that long.
        counted = prompt.tokens if prompt.token_ids is not None else min(prompt.tokens, max_model_len + 1)
        if counted > max_model_len:
            qualifier = "at least " if counted == max_model_len + 1 and prompt.token_ids is None else ""
            raise vllm_error(
                f"This model's maximum context length is {max_model_len} tokens. However, your prompt contains "
                f"{qualifier}{counted} input tokens, which exceeds this limit even without any output tokens. "
                "Please reduce the length of the input prompt.",
                param="input_tokens",
                value=counted,
            )
    return prompts


def _option(fields: Body, options: dict, name: str) -> bool:
    nested = Body(options)
    value = nested.bool(name, False)
    for error in nested.format.errors:
        error["loc"] = error["loc"].replace("body.", "body.stream_options.", 1)
        fields.format.errors.append(error)
    return value


def _verify_sampling(
    *, n, presence, frequency, repetition, temperature, top_p, top_k, min_p, max_tokens, min_tokens, stop
) -> None:
    if n < 1:
        raise BadRequest(f"n must be at least 1, got {n}.")
    if n > MAX_N:
        raise BadRequest(
            f"n must be at most {MAX_N}, got {n}. To increase this limit, set the VLLM_MAX_N_SEQUENCES "
            "environment variable."
        )
    if not -2.0 <= presence <= 2.0:
        raise BadRequest(f"presence_penalty must be in [-2, 2], got {presence}.")
    if not -2.0 <= frequency <= 2.0:
        raise BadRequest(f"frequency_penalty must be in [-2, 2], got {frequency}.")
    if not math.isfinite(repetition):
        raise BadRequest(f"repetition_penalty must be a finite number, got {repetition}.")
    if repetition <= 0.0:
        raise BadRequest(f"repetition_penalty must be greater than zero, got {repetition}.")
    if temperature is not None:
        if not math.isfinite(temperature):
            raise vllm_error(
                f"temperature must be a finite number, got {temperature}.", param="temperature", value=temperature
            )
        if temperature < 0.0:
            raise vllm_error(
                f"temperature must be non-negative, got {temperature}.", param="temperature", value=temperature
            )
        if temperature > 2.0:
            raise vllm_error(
                f"temperature must be in [0, 2], got {temperature}.", param="temperature", value=temperature
            )
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise vllm_error(f"top_p must be in (0, 1], got {top_p}.", param="top_p", value=top_p)
    if top_k is not None and top_k < -1:
        raise BadRequest(f"top_k must be 0 (disable), or at least 1, got {top_k}.")
    if min_p is not None and not 0.0 <= min_p <= 1.0:
        raise BadRequest(f"min_p must be in [0, 1], got {min_p}.")
    if max_tokens < 1:
        raise vllm_error(f"max_tokens must be at least 1, got {max_tokens}.", param="max_tokens", value=max_tokens)
    if min_tokens < 0:
        raise BadRequest(f"min_tokens must be greater than or equal to 0, got {min_tokens}.")
    if min_tokens > max_tokens:
        raise BadRequest(f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}.")
    if any(not s for s in stop):
        raise BadRequest("stop cannot contain an empty string.")
    if temperature is not None and temperature < SAMPLING_EPS and n > 1:
        # vLLM checks this after the ranges above (``SamplingParams._verify_greedy_sampling``).
        raise vllm_error(f"n must be 1 when using greedy sampling, got {n}.")


def _logprobs(fields: Body, *, chat: bool, vocab_size: int) -> int | None:
    """Alternatives per token (None: no logprobs); -1 asks for the whole vocabulary, which vLLM refuses."""
    if chat:
        if not fields.bool("logprobs", False):
            return None
        wanted = fields.int("top_logprobs", 0)
    else:
        wanted = fields.int("logprobs")
        if wanted is None:
            return None
    count = vocab_size if wanted == -1 else wanted
    if count > MAX_LOGPROBS:
        raise vllm_error(
            f"Requested sample logprobs of {count}, which is greater than max allowed: {MAX_LOGPROBS}",
            param="logprobs",
            value=count,
        )
    return count


def tokenize_text(body: dict) -> str:
    """The text ``POST /tokenize`` counts: a chat's ``messages`` rendered as its completion renders them, or a
    completion's string ``prompt`` (vLLM's TokenizeChatRequest and TokenizeCompletionRequest)."""
    format_errors = FormatErrors()
    if "messages" in body:
        continue_final = bool(body.get("continue_final_message"))
        text = _render_messages(
            body["messages"],
            format_errors,
            generation_prompt=bool(body.get("add_generation_prompt", not continue_final)),
            continue_final=continue_final,
        )
    else:
        text = body.get("prompt")
        if not isinstance(text, str):
            format_errors.add("string_type", "body.prompt", "Input should be a valid string", text)
    format_errors.raise_if_any()
    return text
