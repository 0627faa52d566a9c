"""The requests both sides get: served ones (usage and finish fixed by ``ignore_eos``), bad input, and routes."""

from __future__ import annotations

from dataclasses import dataclass

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
MESSAGES = [{"role": "user", "content": "Hello there, what is the model?"}]
# How the proxy resumes a broken stream (gateway/proxy/resume.py): the streamed text as an open final message.
CONTINUED = {
    "messages": [*MESSAGES, {"role": "assistant", "content": "The model is"}],
    "continue_final_message": True,
    "add_generation_prompt": False,
    "max_tokens": 3,
    "ignore_eos": True,
    "stream": True,
}


@dataclass
class Case:
    name: str
    path: str
    body: object = None
    method: str = "POST"
    raw: bytes | None = None
    completion_tokens: int | None = None  # what usage must say on both sides (ignore_eos, max_tokens)
    finish: str | None = None  # the finish reason both must give


def _ok(name: str, path: str, *, tokens: int | None = None, finish: str | None = "length", **fields) -> Case:
    body = {"messages": MESSAGES} if path == CHAT else {"prompt": "Hello there"}
    if fields.get("stream") is True and fields.get("n", 1) == 1:
        # Streams decode greedily: vLLM sends no chunk for a token whose text is empty (a partial UTF-8 byte, a
        # special token), so with sampling a two-token stream's content chunk was there on most runs and missing on
        # some. The tiny model's weights are seeded, so greedy text is the same on every run and machine. (Greedy
        # with n > 1 is refused: the bad-input cases below.)
        fields.setdefault("temperature", 0)
    return Case(name, path, body | fields, completion_tokens=tokens, finish=finish)


def served_cases() -> list[Case]:
    """Requests both must serve, with the usage and finish reason ``ignore_eos`` fixes."""
    stream, usage = {"stream": True}, {"stream_options": {"include_usage": True}}
    continuous = {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    return [
        _ok("chat", CHAT, tokens=5, max_tokens=5, ignore_eos=True),
        _ok("chat stream", CHAT, tokens=4, max_tokens=4, ignore_eos=True, **stream),
        _ok("chat stream with usage", CHAT, tokens=4, max_tokens=4, ignore_eos=True, **stream, **usage),
        _ok("chat stream continuous usage", CHAT, tokens=3, max_tokens=3, ignore_eos=True, **stream, **continuous),
        _ok("chat n=2", CHAT, tokens=6, max_tokens=3, n=2, ignore_eos=True),
        _ok("chat n=2 stream", CHAT, tokens=6, max_tokens=3, n=2, ignore_eos=True, **stream, **usage),
        _ok("chat logprobs", CHAT, tokens=2, max_tokens=2, ignore_eos=True, logprobs=True, top_logprobs=2),
        _ok(
            "chat logprobs stream",
            CHAT,
            tokens=2,
            max_tokens=2,
            ignore_eos=True,
            logprobs=True,
            top_logprobs=2,
            **stream,
        ),
        _ok("chat logprobs without top", CHAT, tokens=2, max_tokens=2, ignore_eos=True, logprobs=True),
        _ok("chat min_tokens", CHAT, tokens=3, max_tokens=3, min_tokens=3),
        _ok("chat lax types", CHAT, tokens=3, max_tokens="3", n="1", ignore_eos="true", stream="no"),
        _ok(
            "chat custom role",
            CHAT,
            tokens=2,
            max_tokens=2,
            ignore_eos=True,
            messages=[{"role": "wizard", "content": "x"}],
        ),
        _ok("chat unknown field", CHAT, tokens=2, max_tokens=2, ignore_eos=True, not_a_field=1),
        _ok("chat with priority and salt", CHAT, tokens=2, max_tokens=2, ignore_eos=True, priority=-3, cache_salt="a"),
        _ok("chat continuing the final message (the proxy's resumption)", CHAT, tokens=3, **CONTINUED, **usage),
        _ok("completion", COMPLETIONS, tokens=3, max_tokens=3, ignore_eos=True),
        _ok("completion default max_tokens", COMPLETIONS, tokens=16, ignore_eos=True),
        _ok("completion stream", COMPLETIONS, tokens=3, max_tokens=3, ignore_eos=True, **stream),
        _ok("completion stream with usage", COMPLETIONS, tokens=3, max_tokens=3, ignore_eos=True, **stream, **usage),
        _ok(
            "completion stream continuous",
            COMPLETIONS,
            tokens=2,
            max_tokens=2,
            ignore_eos=True,
            **stream,
            **continuous,
        ),
        _ok("completion n=2 stream", COMPLETIONS, tokens=4, max_tokens=2, n=2, ignore_eos=True, **stream, **usage),
        _ok("completion prompts batch", COMPLETIONS, tokens=4, max_tokens=2, ignore_eos=True, prompt=["a b", "c d"]),
        _ok("completion token ids", COMPLETIONS, tokens=2, max_tokens=2, ignore_eos=True, prompt=[11, 12, 13]),
        _ok("completion logprobs", COMPLETIONS, tokens=2, max_tokens=2, ignore_eos=True, logprobs=2),
        _ok("completion logprobs stream", COMPLETIONS, tokens=2, max_tokens=2, ignore_eos=True, logprobs=1, **stream),
        _ok("completion echo", COMPLETIONS, tokens=2, max_tokens=2, ignore_eos=True, echo=True),
        _ok(
            "completion echo stream",
            COMPLETIONS,
            tokens=2,
            max_tokens=2,
            ignore_eos=True,
            echo=True,
            **stream,
            **continuous,
        ),
        _ok("completion best_of", COMPLETIONS, tokens=2, max_tokens=2, ignore_eos=True, best_of=2),
        Case(
            "chat without model",
            CHAT,
            {"messages": MESSAGES, "max_tokens": 2, "ignore_eos": True},
            completion_tokens=2,
            finish="length",
        ),
    ]


def refused_cases(max_model_len: int) -> list[Case]:
    """Bad input: both must refuse it alike (status, error type, param, message)."""
    m = MESSAGES
    long_text = "hello " * (max_model_len + 500)

    def chat(name, **fields):
        return Case(name, CHAT, {"messages": m, "max_tokens": 2} | fields)

    def comp(name, **fields):
        return Case(name, COMPLETIONS, {"prompt": "hi", "max_tokens": 2} | fields)

    return [
        Case("chat no messages", CHAT, {"max_tokens": 2}),
        chat("chat empty messages", messages=[]),
        chat("chat messages not a list", messages="hi"),
        chat("chat message without role", messages=[{"content": "x"}]),
        chat("chat content a number", messages=[{"role": "user", "content": 5}]),
        chat("chat unknown model", model="no-such-model"),
        chat("chat max_tokens 0", max_tokens=0),
        chat("chat max_tokens -1", max_tokens=-1),
        chat("chat max_tokens fractional", max_tokens=5.5),
        chat("chat max_tokens over the context", max_tokens=100_000),
        chat("chat max_completion_tokens 0", max_completion_tokens=0),
        chat("chat temperature -1", temperature=-1),
        chat("chat temperature 3", temperature=3),
        chat("chat temperature text", temperature="hot"),
        chat("chat top_p 0", top_p=0),
        chat("chat top_p 1.5", top_p=1.5),
        chat("chat top_k -2", top_k=-2),
        chat("chat n 0", n=0),
        chat("chat n=2 greedy", n=2, temperature=0),
        chat("chat n -1", n=-1),
        chat("chat top_logprobs 21", logprobs=True, top_logprobs=21),
        chat("chat top_logprobs without logprobs", top_logprobs=5),
        chat("chat top_logprobs -1", logprobs=True, top_logprobs=-1),
        chat("chat top_logprobs -2", logprobs=True, top_logprobs=-2),
        chat("chat stream_options without stream", stream_options={"include_usage": True}),
        chat("chat stream_options not an object", stream=True, stream_options="x"),
        chat("chat stream not a boolean", stream="x"),
        chat(
            "chat continue_final_message and add_generation_prompt",
            continue_final_message=True,
            add_generation_prompt=True,
        ),
        chat("chat continue_final_message with the default generation prompt", continue_final_message=True),
        chat("chat priority text", priority="high"),
        chat("chat priority fractional", priority=1.5),
        chat("chat cache_salt empty", cache_salt=""),
        chat("chat cache_salt a number", cache_salt=5),
        chat("chat stop a number", stop=5),
        chat("chat stop empty", stop=""),
        chat("chat stop list with an empty string", stop=[""]),
        chat("chat min_tokens -1", min_tokens=-1),
        chat("chat min_tokens over max_tokens", min_tokens=5),
        chat("chat ignore_eos not a boolean", ignore_eos="x"),
        chat("chat seed text", seed="x"),
        chat("chat presence_penalty 3", presence_penalty=3),
        chat("chat frequency_penalty -3", frequency_penalty=-3),
        chat("chat repetition_penalty 0", repetition_penalty=0),
        chat("chat prompt over the context", messages=[{"role": "user", "content": long_text}]),
        Case("chat body an array", CHAT, []),
        Case("chat body a string", CHAT, "hello"),
        Case("chat body not JSON", CHAT, raw=b"{nope"),
        Case("completion empty body", COMPLETIONS, raw=b""),
        Case("completion no prompt", COMPLETIONS, {"max_tokens": 2}),
        comp("completion prompt a number", prompt=5),
        comp("completion prompt empty list", prompt=[]),
        comp("completion prompt empty string", prompt=""),
        comp("completion logprobs 21", logprobs=21),
        comp("completion logprobs -1", logprobs=-1),
        comp("completion logprobs -2", logprobs=-2),
        comp("completion max_tokens 0", max_tokens=0),
        comp("completion n=2 greedy", n=2, temperature=0.0),
        comp("completion max_tokens over the context", max_tokens=100_000),
        comp("completion prompt over the context", prompt=long_text),
        comp("completion unknown model", model="no-such-model"),
        comp("completion temperature -1", temperature=-1),
        comp("completion suffix", suffix="x"),
    ]


def route_cases() -> list[Case]:
    return [
        Case("models", "/v1/models", method="GET"),
        Case("health", "/health", method="GET"),
        Case("ping", "/ping", method="GET"),
        Case("version", "/version", method="GET"),
        Case("load", "/load", method="GET"),
        # How the proxy counts the prompt of a request that ended before its usage (gateway/proxy/unfinished.py).
        Case("tokenize chat", "/tokenize", body={"messages": MESSAGES}),
        Case("tokenize completion", "/tokenize", body={"prompt": "Hello there", "add_special_tokens": True}),
        Case("unknown route", "/no-such-route", method="GET"),
        Case("wrong method on chat", CHAT, method="GET"),
        Case("wrong method on models", "/v1/models", method="POST"),
        Case("wrong method on health", "/health", method="POST"),
    ]
