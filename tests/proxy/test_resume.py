"""The continuation of a broken stream, built from what the client read (``gateway.proxy.resume``, pure)."""

import json

from gateway.proxy.request import parse_request, upstream_payload
from gateway.proxy.resume import Continued, continuation, merged_usage, streamed


def sse(*objs) -> bytes:
    return b"".join(b"data: " + json.dumps(o, separators=(",", ":")).encode() + b"\n\n" for o in objs)


def chat_chunk(content=None, role=None, finish=None) -> dict:
    delta = {k: v for k, v in (("role", role), ("content", content)) if v is not None}
    return {"id": "chatcmpl-r1", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def chat(**fields):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True, **fields}
    return parse_request("chat", json.dumps(body).encode())


def test_streamed_reads_the_text_back_and_counts_every_chunk_after_the_role_chunk():
    relayed = [sse(chat_chunk("", role="assistant"), chat_chunk("Hel"), chat_chunk("")), sse(chat_chunk("lo"))]
    done = streamed(relayed, "chat")
    # An empty chunk is a token the detokenizer held back (an incomplete UTF-8 character): it counts.
    assert (done.text, done.tokens, done.finished) == ("Hello", 3, False)
    assert streamed([sse(chat_chunk("!", finish="length"))], "chat").finished
    text = sse(*({"id": "cmpl-1", "choices": [{"index": 0, "text": t, "finish_reason": None}]} for t in ("a", "b")))
    assert streamed([text], "completions").text == "ab"


def test_a_chat_continues_as_a_final_assistant_message_with_what_is_left_to_generate():
    req = chat(max_completion_tokens=10, min_tokens=4, cache_salt="client-set")
    nxt = continuation(req, streamed([sse(chat_chunk("", role="assistant"), chat_chunk("Hel"))], "chat"))
    assert nxt.body["messages"][-1] == {"role": "assistant", "content": "Hel"}
    assert nxt.body["continue_final_message"] is True and nxt.body["add_generation_prompt"] is False
    assert (nxt.body["max_completion_tokens"], nxt.body["min_tokens"], nxt.max_tokens) == (9, 3, 9)
    # The proxy's own fields still replace the client's on the way to the engine.
    body = json.loads(upstream_payload(nxt, cache_salt="tenant-salt", engine_priority=2))
    assert body["cache_salt"] == "tenant-salt" and body["priority"] == 2
    assert body["stream_options"] == {"include_usage": True}
    assert req.body["messages"] == [{"role": "user", "content": "hi"}]  # the client's request is untouched


def test_a_client_s_own_continued_message_grows_and_a_completion_s_prompt_grows():
    req = chat(
        messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure: "}],
        continue_final_message=True,
        add_generation_prompt=False,
    )
    nxt = continuation(req, streamed([sse(chat_chunk("one"))], "chat"))
    assert nxt.body["messages"] == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure: one"}]
    text = parse_request("completions", json.dumps({"model": "m", "prompt": "Once", "stream": True}).encode())
    nxt = continuation(text, streamed([sse({"choices": [{"text": " upon", "finish_reason": None}]})], "completions"))
    assert nxt.body["prompt"] == "Once upon" and nxt.body["max_tokens"] == 15  # of vLLM's default 16


def test_what_cannot_be_one_continuation_is_not_resumed():
    half = streamed([sse(chat_chunk("x"))], "chat")
    assert continuation(chat(n=2), half) is None
    assert continuation(chat(tools=[{"type": "function", "function": {"name": "f"}}]), half) is None
    assert continuation(chat(response_format={"type": "json_object"}), half) is None
    assert continuation(chat(max_tokens=1), half) is None  # nothing left to generate
    assert continuation(chat(), streamed([sse(chat_chunk("x", finish="stop"))], "chat")) is None
    ids = parse_request("completions", json.dumps({"model": "m", "prompt": [1, 2], "stream": True}).encode())
    assert continuation(ids, half) is None


def test_the_continuation_s_stream_drops_its_role_chunk_and_counts_usage_as_one_answer():
    transform = Continued(streamed_tokens=12)
    out = transform(
        sse(
            chat_chunk("", role="assistant"),
            chat_chunk("lo"),
            {
                "id": "chatcmpl-r1",
                "choices": [],
                "usage": {"prompt_tokens": 30, "completion_tokens": 8, "prompt_tokens_details": {"cached_tokens": 25}},
            },
        )
    )
    events = [json.loads(e[6:]) for e in out.split(b"\n\n") if e]
    assert [e["choices"][0]["delta"] for e in events[:-1]] == [{"content": "lo"}]
    assert events[-1]["usage"] == {
        "prompt_tokens": 18, "completion_tokens": 20, "total_tokens": 38, "prompt_tokens_details": {"cached_tokens": 18}
    }  # fmt: skip
    plain = sse(chat_chunk("abc"))
    assert transform(plain) is plain
    assert merged_usage({"prompt_tokens": 5, "completion_tokens": 1}, 9)["prompt_tokens"] == 0


def test_with_the_original_prompt_counted_the_split_is_the_engines_not_the_chunks():
    # The client read 120 chunks, but a lagging client gets several tokens in one: the continuing engine's prompt
    # holds the original 20 tokens and 160 of streamed text, so the answer is 160 tokens plus what it generated.
    continued = {"prompt_tokens": 180, "completion_tokens": 40, "prompt_tokens_details": {"cached_tokens": 0}}
    assert merged_usage(continued, 120)["prompt_tokens"] == 60  # by chunks alone: off by the 40 merged tokens
    exact = merged_usage(continued, 120, prompt_tokens=20)
    assert (exact["prompt_tokens"], exact["completion_tokens"], exact["total_tokens"]) == (20, 200, 220)
    assert merged_usage(continued, 120, prompt_tokens=500)["prompt_tokens"] == 60  # a count that cannot be: ignored
    transform = Continued(streamed_tokens=120, prompt_tokens=20)
    out = transform(sse({"id": "c", "object": "chat.completion.chunk", "choices": [], "usage": continued}))
    [event] = [json.loads(e[6:]) for e in out.split(b"\n\n") if e]
    assert event["usage"]["prompt_tokens"] == 20 and event["usage"]["completion_tokens"] == 200
