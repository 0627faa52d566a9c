"""A replica whose engine serves the endpoint under another model name (an attached vLLM server started with its own
``--served-model-name``): the proxy sends that name as ``model``, only to that replica, and the client reads the
endpoint's name in every answer, streamed or not. A replica serving the endpoint's own name costs nothing extra:
its body is spliced, not serialised again. The real engine behind the real proxy:
tests/engine/test_proxy_real_engine.py."""

import json
from dataclasses import replace

import pytest

from endpoints.models import ReplicaState
from gateway.proxy.model_names import model_rename
from gateway.proxy.relay import Outcome, StreamBroken
from gateway.proxy.request import parse_request, upstream_payload
from gateway.proxy.snapshot_loader import read_snapshot
from gateway.proxy.stages import Upstream
from tests.factories import EndpointFactory, ReplicaFactory
from tests.proxy.snapshots import endpoint
from tests.proxy.test_relay import DONE, Response, Session, bodies, event, plain, stream
from tests.proxy.test_stages import runtime_for

ENGINE, ENDPOINT = "meta/tiny-llama", "team-chat"


def chunk(model: str, content: str) -> bytes:
    return event(
        {"id": "c1", "object": "chat.completion.chunk", "model": model, "choices": [{"delta": {"content": content}}]}
    )


def test_only_a_replica_serving_another_name_needs_a_rename():
    assert model_rename(served_model_name="", endpoint_name=ENDPOINT) is None
    assert model_rename(served_model_name=ENDPOINT, endpoint_name=ENDPOINT) is None
    rename = model_rename(served_model_name=ENGINE, endpoint_name=ENDPOINT)
    assert (rename.engine, rename.endpoint) == (ENGINE, ENDPOINT)


def test_the_rename_touches_the_model_member_and_never_generated_text():
    rename = model_rename(served_model_name=ENGINE, endpoint_name=ENDPOINT)
    # The engine's name as text (even a quoted JSON fragment the model generated) stays: inside a JSON string every
    # quote is escaped, so only the member itself matches.
    text = f'I am {ENGINE}; "model":"{ENGINE}"'
    compact = json.dumps({"model": ENGINE, "choices": [{"text": text}]}, separators=(",", ":")).encode()
    assert json.loads(rename.to_client(compact)) == {"model": ENDPOINT, "choices": [{"text": text}]}
    spaced = json.dumps({"model": ENGINE, "x": 1}).encode()  # '"model": "…"', as some servers write it
    assert json.loads(rename.to_client(spaced)) == {"model": ENDPOINT, "x": 1}
    non_ascii = model_rename(served_model_name="modèle", endpoint_name=ENDPOINT)
    for ascii_only in (False, True):
        data = json.dumps({"model": "modèle"}, ensure_ascii=ascii_only).encode()
        assert json.loads(non_ascii.to_client(data)) == {"model": ENDPOINT}
    other = chunk("another-model", "hi")
    assert rename.to_client(other) is other  # nothing to replace: the same bytes, no copy


def chat(**fields) -> object:
    body = {"model": ENDPOINT, "messages": [{"role": "user", "content": "hello"}], **fields}
    return parse_request("chat", json.dumps(body).encode())


def test_the_body_names_the_engines_model_only_when_it_differs():
    tool = {"type": "function", "function": {"name": "pick", "parameters": {"properties": {"model": {}}}}}
    req = chat(stream=True, tools=[tool])
    spliced = upstream_payload(req, cache_salt="salt", engine_priority=1)
    assert spliced.startswith(req.raw[:-1]) and json.loads(spliced)["model"] == ENDPOINT  # the fast path
    renamed = json.loads(upstream_payload(req, cache_salt="salt", engine_priority=1, engine_model=ENGINE))
    assert renamed["model"] == ENGINE and renamed["tools"] == [tool]  # a nested "model" key is left alone
    assert (renamed["cache_salt"], renamed["priority"], renamed["stream_options"]) == (
        "salt",
        1,
        {"include_usage": True},
    )
    assert renamed["messages"] == req.body["messages"]
    # A body the proxy re-serialises anyway (it names a controlled field) gets the engine's name too.
    controlled = chat(priority=-5, cache_salt="theirs")
    body = json.loads(upstream_payload(controlled, cache_salt="salt", engine_priority=None, engine_model=ENGINE))
    assert body["model"] == ENGINE and body["cache_salt"] == "salt" and "priority" not in body


async def relay_stream(chunks, *, rename, forward_usage=False):
    sent, outcome = await stream(Response(chunks=chunks), rename=rename, forward_usage=forward_usage)
    return b"".join(body for body, _ in bodies(sent)), outcome


async def test_every_streamed_chunk_names_the_endpoint():
    rename = model_rename(served_model_name=ENGINE, endpoint_name=ENDPOINT)
    usage = event({"id": "c1", "model": ENGINE, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}})
    first, second = chunk(ENGINE, "hel"), chunk(ENGINE, "lo")
    split = len(second) // 2  # an event cut across two reads is rewritten once whole
    streamed, outcome = await relay_stream(
        [first + second[:split], second[split:], usage + DONE], rename=rename, forward_usage=True
    )
    assert ENGINE.encode() not in streamed
    assert (
        streamed
        == chunk(ENDPOINT, "hel") + chunk(ENDPOINT, "lo") + usage.replace(ENGINE.encode(), ENDPOINT.encode()) + DONE
    )
    assert outcome.usage == {"prompt_tokens": 3, "completion_tokens": 2} and outcome.done
    # A stream that ends without [DONE]: the incomplete event it left (what a stream that cannot be resumed sends
    # before its error event) is rewritten as well.
    with pytest.raises(StreamBroken) as broken:
        await relay_stream([first, b'data: {"id":"c1","model":"' + ENGINE.encode() + b'","cho'], rename=rename)
    assert ENGINE.encode() not in broken.value.buf and b'"model":"team-chat","cho' in broken.value.buf
    # No rename: the engine's bytes, untouched.
    untouched, _ = await relay_stream([first + DONE], rename=None)
    assert untouched == first + DONE


async def test_a_plain_answer_names_the_endpoint_and_its_length_follows():
    rename = model_rename(served_model_name=ENGINE, endpoint_name=ENDPOINT)
    body = json.dumps({"id": "c1", "model": ENGINE, "choices": [], "usage": {"prompt_tokens": 1}}).encode()
    sent, outcome = await plain(Response(body=body), rename=rename)
    answer = sent[1]["body"]
    assert (
        json.loads(answer)["model"] == ENDPOINT
        and (b"content-length", str(len(answer)).encode()) in sent[0]["headers"]
    )
    assert outcome.usage == {"prompt_tokens": 1}


async def test_each_replica_gets_the_name_it_serves():
    # One replica serves the endpoint's name, the other the engine's own: a retry moving between them sends each
    # its own body.
    ep = endpoint(name=ENDPOINT, replicas=2)
    ep = replace(ep, replicas=(ep.replicas[0], replace(ep.replicas[1], served_model_name=ENGINE)))
    runtime = runtime_for(ep)
    same, other = runtime.slots["100"], runtime.slots["101"]
    assert same.rename is None and other.rename.engine == ENGINE
    upstream = Upstream(chat(stream=True), request_id="r1", priority="standard", cache_salt="s", rid_header=[])
    posted = []
    for slot in (same, other):
        session = Session(Response(chunks=[chunk(slot.rename.engine if slot.rename else ENDPOINT, "x") + DONE]))
        await upstream.exchange(session, slot, _discard, outcome=Outcome(), connect_timeout_s=1.0)
        posted.append(json.loads(session.posted[0][1])["model"])
    assert posted == [ENDPOINT, ENGINE]
    # The snapshot moves the engine to the endpoint's name (or the endpoint is renamed to it): no rename any more.
    runtime.update(replace(ep, replicas=(ep.replicas[0], replace(ep.replicas[1], served_model_name=ENDPOINT))))
    assert runtime.slots["101"].rename is None
    runtime.update(
        replace(ep, name=ENGINE, replicas=(replace(ep.replicas[0], served_model_name=ENDPOINT), ep.replicas[1]))
    )
    assert runtime.slots["100"].rename.engine == ENDPOINT and runtime.slots["101"].rename is None


async def _discard(message) -> None:
    pass


@pytest.mark.django_db
def test_the_snapshot_holds_each_replicas_served_name():
    ep = EndpointFactory(name=ENDPOINT)
    ReplicaFactory(endpoint=ep, name="launched", state=ReplicaState.READY)  # empty: launched as the endpoint
    ReplicaFactory(endpoint=ep, name="attached", state=ReplicaState.READY, served_model_name=ENGINE)
    replicas = {r.name: r for r in read_snapshot().endpoints_by_name[ENDPOINT].replicas}
    assert replicas["launched"].served_model_name == ENDPOINT and replicas["attached"].served_model_name == ENGINE
