"""The upstream exchange against a scripted replica response (no sockets): SSE events are forwarded whole, the
usage chunk is read and dropped unless asked for, [DONE] closes the client's response in the same write, and what
can still be retried elsewhere is told apart from what has reached the client."""

import json

import pytest

from gateway.proxy.relay import (
    Outcome,
    PriorityRefused,
    StreamBroken,
    UpstreamFailed,
    end_stream,
    plain_exchange,
    stream_exchange,
)


def event(obj) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


ROLE = event({"id": "c1", "choices": [{"delta": {"role": "assistant"}}]})
TOKEN = event({"id": "c1", "choices": [{"delta": {"content": "hi"}}]})
USAGE = event({"id": "c1", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})
DONE = b"data: [DONE]\n\n"


class Content:
    def __init__(self, chunks, error=None):
        self.chunks, self.error = list(chunks), error

    async def readany(self):
        if self.chunks:
            return self.chunks.pop(0)
        if self.error is not None:
            raise self.error
        return b""


class Response:
    def __init__(self, status=200, chunks=(), body=b"", error=None):
        self.status, self.content, self.body = status, Content(chunks, error), body

    async def read(self):
        return self.body

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return False


class Session:
    def __init__(self, response):
        self.response, self.posted = response, []

    async def post(self, url, *, data, headers, timeout):
        url = str(url)  # the proxy hands aiohttp a parsed yarl.URL
        self.posted.append((url, data))
        if isinstance(self.response, Exception):
            raise self.response
        return self.response


async def stream(response, *, forward_usage=False, priority_sent=False, rename=None):
    return await _exchange(
        stream_exchange,
        response,
        "http://replica/v1/chat/completions",
        forward_usage=forward_usage,
        priority_sent=priority_sent,
        rename=rename,
    )


async def plain(response, *, rename=None):
    return await _exchange(plain_exchange, response, "http://replica/v1/completions", rename=rename)


async def _exchange(exchange, response, url: str, **options):
    sent, outcome = [], Outcome()

    async def send(message):
        sent.append(message)

    await exchange(
        Session(response),
        url,
        b"{}",
        {},
        send,
        response_headers=[(b"x-request-id", b"req-1")],
        outcome=outcome,
        connect_timeout_s=1.0,
        **options,
    )
    return sent, outcome


def bodies(sent) -> list[tuple[bytes, bool]]:
    return [(m["body"], m.get("more_body", False)) for m in sent if m["type"] == "http.response.body"]


async def test_events_go_out_whole_and_done_ends_the_response_in_the_same_write():
    split = len(TOKEN) // 2
    chunks = [ROLE + TOKEN[:split], TOKEN[split:], USAGE + DONE]
    sent, outcome = await stream(Response(chunks=chunks))
    assert sent[0] == {"type": "http.response.start", "status": 200, "headers": [(b"x-request-id", b"req-1")]}
    assert bodies(sent) == [(ROLE, True), (TOKEN, True), (DONE, False)]  # the usage event was not asked for
    assert outcome.usage == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert outcome.done and outcome.status == "ok" and outcome.content_events == 1
    assert outcome.first_token_at <= outcome.last_read_at <= outcome.finished_at
    sent, _ = await stream(Response(chunks=[TOKEN, USAGE + DONE]), forward_usage=True)
    assert bodies(sent) == [(TOKEN, True), (USAGE + DONE, False)]


async def test_a_stream_that_breaks_after_its_head_raises_stream_broken_and_end_stream_closes_it():
    # Ended without [DONE]: the caller gets the incomplete event it left, to resume elsewhere (resume.py).
    sent = []

    async def send(message):
        sent.append(message)

    outcome = Outcome()
    with pytest.raises(StreamBroken) as broken:
        await stream_exchange(
            Session(Response(chunks=[TOKEN, b'data: {"id":"c1","cho'])),
            "http://replica/v1/chat/completions",
            b"{}",
            {},
            send,
            response_headers=[],
            forward_usage=False,
            outcome=outcome,
            connect_timeout_s=1.0,
        )
    assert broken.value.buf == b'data: {"id":"c1","cho' and outcome.started_client
    assert outcome.relayed == [TOKEN] and outcome.status == "ok"
    # Not resumable: end_stream sends what is left and an error event, then [DONE].
    await end_stream(send, [], outcome, buf=broken.value.buf, done=False)
    assert outcome.status == "upstream_error" and outcome.error == "replica stream ended early"
    tail = [body for body, _ in bodies(sent)]
    assert tail[0] == TOKEN and tail[1] == b'data: {"id":"c1","cho'
    assert b'"type": "upstream_error"' in tail[2] and tail[2].endswith(DONE) and tail[-1] == b""
    # Reset after the head went out: the same.
    with pytest.raises(StreamBroken):
        await stream(Response(chunks=[TOKEN], error=ConnectionResetError()))


@pytest.mark.parametrize(
    "response",
    [
        ConnectionRefusedError(),
        Response(status=503),
        Response(chunks=[]),
        Response(chunks=[b'data: {"id"'], error=ConnectionResetError()),
    ],
    ids=["unreachable", "5xx", "empty", "reset-before-an-event"],
)
async def test_failures_before_the_client_saw_a_byte_are_retryable(response):
    with pytest.raises(UpstreamFailed):
        await stream(response)
    if isinstance(response, Response):
        assert response.content.chunks == []


async def test_a_replica_refusing_priority_is_told_apart_from_a_client_error():
    refusal = b'{"error": {"message": "priority is not supported by fcfs"}}'
    with pytest.raises(PriorityRefused):
        await stream(Response(status=400, body=refusal), priority_sent=True)
    sent, outcome = await stream(Response(status=400, body=refusal), priority_sent=False)
    assert sent[0]["status"] == 400 and bodies(sent) == [(refusal, False)]
    assert outcome.status == "upstream_error" and outcome.started_client


async def test_plain_answers_are_passed_with_their_length_and_usage():
    body = json.dumps({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2}}).encode()
    sent, outcome = await plain(Response(body=body))
    assert (b"content-length", str(len(body)).encode()) in sent[0]["headers"]
    assert sent[1]["body"] == body and outcome.usage == {"prompt_tokens": 1, "completion_tokens": 2}
    assert outcome.first_token_at == outcome.finished_at


async def test_a_stream_keeps_what_it_relayed_up_to_a_bound(monkeypatch):
    from gateway.proxy import relay

    monkeypatch.setattr(relay, "RELAYED_BYTES_KEPT", len(TOKEN) * 2 + len(DONE))
    _, outcome = await stream(Response(chunks=[TOKEN, TOKEN, DONE]))
    assert outcome.relayed == [TOKEN, TOKEN, DONE] and outcome.relayed_bytes == 2 * len(TOKEN) + len(DONE)
    # Past the bound nothing is kept: a break then cannot be resumed (stages.resumed), the stream ends as before.
    _, outcome = await stream(Response(chunks=[TOKEN, TOKEN, TOKEN, DONE]))
    assert outcome.relayed is None


ROLE_1 = event({"id": "c1", "choices": [{"index": 1, "delta": {"role": "assistant"}}]})
ERROR = b'data: {"error":{"message":"engine died","type":"server_error"}}\n\n'


@pytest.mark.parametrize("reads", ["one-event-per-read", "all-in-one-read"])
async def test_events_are_accounted_alike_whether_read_one_by_one_or_together(reads):
    # Two choices: a role chunk each (no token), then three tokens; the accounting meters a stream that breaks.
    events = [ROLE, ROLE_1, TOKEN, TOKEN, TOKEN, USAGE, DONE]
    chunks = events if reads == "one-event-per-read" else [b"".join(events)]
    sent, outcome = await stream(Response(chunks=chunks))
    assert outcome.content_events == 3 and outcome.usage["completion_tokens"] == 2
    assert outcome.done and outcome.status == "ok" and outcome.finished_at is not None
    assert b"".join(body for body, _ in bodies(sent)) == b"".join([ROLE, ROLE_1, TOKEN, TOKEN, TOKEN, DONE])
    # An engine's error event mid-stream marks the request failed, however it was read.
    error_chunks = [TOKEN, ERROR, DONE] if reads == "one-event-per-read" else [TOKEN + ERROR + DONE]
    _, outcome = await stream(Response(chunks=error_chunks))
    assert outcome.status == "upstream_error" and outcome.error == "replica reported an error mid-stream"
    assert outcome.content_events == 1 and outcome.done
