"""Request validation in vLLM 0.32's words: pydantic's lax types and format errors, vLLM's own messages in its
order, the clamp of max_tokens to the context, and n / prompt batches / stream options as vLLM reads them."""

import pytest

from simulator.protocol import parse_request
from simulator.validation import BadRequest


def parse(body, *, chat=True, max_model_len=4096):
    return parse_request(
        body,
        chat=chat,
        served_model="m",
        max_model_len=max_model_len,
        scheduling_policy="priority",
        header_request_id=None,
        vocab_size=4096,
    )


def refused(body, **kwargs) -> BadRequest:
    with pytest.raises(BadRequest) as caught:
        parse(body, **kwargs)
    return caught.value


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_lax_types_are_accepted_as_pydantic_accepts_them():
    parsed = parse(CHAT | {"max_tokens": "5", "n": 2.0, "stream": "yes", "ignore_eos": 1, "temperature": "0.5"})
    assert (parsed.max_tokens, parsed.n, parsed.stream, parsed.ignore_eos) == ([5], 2, True, True)


def test_a_field_of_the_wrong_type_is_a_format_error_naming_body_dot_field():
    error = refused(CHAT | {"priority": "high"})
    assert (error.status, error.kind, error.param) == (400, "Bad Request", "body.priority")
    assert str(error) == (
        "1 validation error:\n  {'type': 'int_parsing', 'loc': 'body.priority', 'msg': 'Input should be a valid "
        "integer, unable to parse string as an integer', 'input': 'high'}"
    )
    both = refused(CHAT | {"max_tokens": 5.5, "stop": 5})
    assert str(both).startswith("3 validation errors:\n") and both.param == "body.max_tokens"


@pytest.mark.parametrize(
    ("fields", "message", "param"),
    [
        (
            {"temperature": -1},
            "temperature must be non-negative, got -1.0. (parameter=temperature, value=-1.0)",
            "temperature",
        ),
        (
            {"temperature": 3},
            "temperature must be in [0, 2], got 3.0. (parameter=temperature, value=3.0)",
            "temperature",
        ),
        ({"top_p": 0}, "top_p must be in (0, 1], got 0.0. (parameter=top_p, value=0.0)", "top_p"),
        ({"n": 0}, "n must be at least 1, got 0.", None),
        ({"n": 2, "temperature": 0}, "n must be 1 when using greedy sampling, got 2.", None),
        (
            {"n": 2, "temperature": 3},
            "temperature must be in [0, 2], got 3.0. (parameter=temperature, value=3.0)",
            "temperature",
        ),
        (
            {"max_tokens": 9000},
            "max_tokens=9000 cannot be greater than max_model_len=4096. Please request fewer output tokens. (parameter=max_tokens, value=9000)",
            "max_tokens",
        ),
        (
            {"logprobs": True, "top_logprobs": 21},
            "Requested sample logprobs of 21, which is greater than max allowed: 20 (parameter=logprobs, value=21)",
            "logprobs",
        ),
        (
            {"logprobs": True, "top_logprobs": -1},
            "Requested sample logprobs of 4096, which is greater than max allowed: 20 (parameter=logprobs, value=4096)",
            "logprobs",
        ),
        (
            {"top_logprobs": 2},
            "when using `top_logprobs`, `logprobs` must be set to true. (parameter=top_logprobs)",
            "top_logprobs",
        ),
        ({"stop": [""]}, "stop cannot contain an empty string.", None),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens must be less than or equal to max_tokens=2, got 5.", None),
        ({"model": "x"}, "The model `x` does not exist. Valid aliases: m.", "model"),
        ({"messages": []}, "Cannot apply chat template to an empty conversation. Provide at least one message.", None),
    ],
)
def test_vllms_own_refusals_word_for_word(fields, message, param):
    error = refused(CHAT | fields)
    assert (str(error), error.param) == (message, param)


def test_a_prompt_over_the_context_is_at_least_one_past_it_and_max_tokens_is_clamped_to_the_rest():
    error = refused({"model": "m", "prompt": "abcd" * 200}, chat=False, max_model_len=100)
    assert error.param == "input_tokens" and "at least 101 input tokens" in str(error)
    assert parse({"model": "m", "prompt": "abcd" * 90}, chat=False, max_model_len=100).max_tokens == [10]
    assert parse(CHAT, max_model_len=100).max_tokens == [100 - parse(CHAT).prompts[0].tokens]  # chat: the rest
    exact = refused({"model": "m", "prompt": "abcd" * 100}, chat=False, max_model_len=100)
    assert str(exact).startswith("max_tokens must be at least 1, got 0.")


def test_n_prompt_batches_and_token_ids_make_choices():
    parsed = parse({"model": "m", "prompt": ["a", "b"], "n": 3, "max_tokens": 2}, chat=False)
    assert parsed.choices == 6 and parsed.prompt_tokens == 2
    ids = parse({"model": "m", "prompt": [[1, 2], [3, 4, 5]], "max_tokens": 2}, chat=False)
    assert [p.tokens for p in ids.prompts] == [2, 3] and ids.prompts[1].token_ids == [3, 4, 5]


def test_stream_options_default_to_no_usage_and_continuous_stats_need_usage():
    assert not parse(CHAT | {"stream": True, "stream_options": {}}).include_usage
    parsed = parse(CHAT | {"stream": True, "stream_options": {"continuous_usage_stats": True}})
    assert (parsed.include_usage, parsed.continuous_usage) == (False, False)
    parsed = parse(CHAT | {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": 1}})
    assert (parsed.include_usage, parsed.continuous_usage) == (True, True)


def test_malformed_content_parts_and_an_n_past_vllms_limit_are_400s_not_crashes():
    parts = refused(CHAT | {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]})
    assert parts.kind == "Bad Request" and parts.param.startswith("body.messages.0.")
    assert refused(CHAT | {"messages": [{"role": "user", "content": [5]}]}).kind == "Bad Request"
    assert str(refused(CHAT | {"n": 16385})).startswith("n must be at most 16384, got 16385.")
