"""The contract's comparison itself (simulator.contract), without an engine: it must name what
differs and let through what is allowed to differ (generated text, token maps, union error listings)."""

from simulator.contract import CHAT, COMPLETIONS, Answer, Case, compare_case, shape_diff, shape_of


def test_shapes_differ_by_missing_keys_and_types_not_by_text_or_list_lengths():
    engine = {"id": "a", "usage": {"prompt_tokens_details": {"cached_tokens": 0}}, "choices": [{"text": "xy"}] * 2}
    same = {"id": "b", "usage": {"prompt_tokens_details": {"cached_tokens": 7}}, "choices": [{"text": "other"}]}
    assert shape_diff(shape_of(engine), shape_of(same)) == []
    broken = {"id": "b", "usage": {"prompt_tokens_details": None}, "choices": [{"text": 3, "extra": 1}]}
    assert shape_diff(shape_of(engine), shape_of(broken)) == [
        "$.choices[].extra: only in the simulator",
        "$.choices[].text: engine ['str'], simulator ['int']",
        "$.usage.prompt_tokens_details: engine ['object'], simulator ['null']",
        "$.usage.prompt_tokens_details.cached_tokens: missing in the simulator",
    ]
    assert shape_diff(shape_of({"bytes": [1, 2]}), shape_of({"bytes": []})) == []  # an empty list fits


def test_a_completions_top_logprobs_map_is_keyed_by_generated_text():
    def body(token):
        return {"choices": [{"logprobs": {"top_logprobs": [{token: -1.0, "x": -2.0}]}}]}

    assert shape_diff(shape_of(body(" the")), shape_of(body("zzz"))) == []


def test_errors_compare_type_param_and_message_but_only_the_first_entry_of_a_union_listing():
    case = Case("bad", CHAT, {})

    def error(kind, param, message, status=400):
        body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
        return Answer(status, "application/json", "rid", body)

    union = "2 validation errors:\n  {'type': 'missing', 'loc': 'body.x', 'msg': 'Field required', 'input': 'None'}"
    first_only = (
        "1 validation error:\n  {'type': 'missing', 'loc': 'body.x', 'msg': 'Field required', 'input': 'None'}"
    )
    assert compare_case(case, error("Bad Request", "body.x", union), error("Bad Request", "body.x", first_only)) == []
    assert compare_case(case, error("BadRequestError", "n", "n bad"), error("BadRequestError", "n", "n worse")) == [
        "bad: error.message engine 'n bad' simulator 'n worse'"
    ]
    assert compare_case(case, error("BadRequestError", "n", "m"), error("Bad Request", "body.n", "m"))[:2] == [
        "bad: error.type engine 'BadRequestError' simulator 'Bad Request'",
        "bad: error.param engine 'n' simulator 'body.n'",
    ]
    differs = compare_case(case, error("X", None, "m", 404), Answer(400, "application/json", "rid", {}))
    assert differs[0].startswith("bad: status engine 404 simulator 400")


def test_streams_are_checked_for_order_per_choice_and_chunk_shapes_by_kind():
    case = Case("s", COMPLETIONS, {"stream": True, "stream_options": {"include_usage": True}}, completion_tokens=2)

    def chunk(text, finish=None):
        return {"id": "c", "created": 1, "choices": [{"index": 0, "text": text, "finish_reason": finish}]}

    usage = {
        "id": "c",
        "created": 1,
        "choices": [],
        "usage": {"prompt_tokens": 1, "total_tokens": 3, "completion_tokens": 2},
    }
    good = Answer(
        200, "text/event-stream; charset=utf-8", "rid", events=[chunk("a"), chunk("b", "length"), usage, "[DONE]"]
    )
    assert compare_case(case, good, good) == []
    late_usage = Answer(
        good.status, good.content_type, "rid", events=[chunk("a"), usage, chunk("b", "length"), "[DONE]"]
    )
    assert "s: the simulator usage chunk is not the last" in compare_case(case, good, late_usage)
    no_done = Answer(good.status, good.content_type, "rid", events=[chunk("a"), chunk("b", "length"), usage])
    assert "s: the simulator stream does not end with [DONE]" in compare_case(case, good, no_done)


def test_an_engine_stream_merged_into_its_finish_chunk_is_allowed_but_a_missing_answer_is_not():
    """vLLM merges a request's pending deltas when its API server falls behind: under load a two-token answer can
    come as the finish chunk alone. That is not a divergence; a finish chunk without the answer's text still is."""
    case = Case("m", COMPLETIONS, {"stream": True}, completion_tokens=2)

    def chunk(text, finish=None):
        return {"id": "c", "created": 1, "choices": [{"index": 0, "text": text, "finish_reason": finish}]}

    def stream(*chunks):
        return Answer(200, "text/event-stream; charset=utf-8", "rid", events=[*chunks, "[DONE]"])

    sim = stream(chunk("a"), chunk("b", "length"))
    assert compare_case(case, stream(chunk("ab", "length")), sim) == []
    assert compare_case(case, stream(chunk("", "length")), sim) == ["m: content chunks only in the simulator"]
    assert compare_case(case, sim, stream(chunk("ab", "length"))) == ["m: content chunks only in the engine"]
