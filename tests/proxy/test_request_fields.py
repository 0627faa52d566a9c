"""What a tenant's body may make the engine do (no processes): the proxy's cache salt and engine priority replace
the client's, engine-internal fields are refused, costly ones bounded, ``n``/``best_of`` bounded and priced."""

import json

import pytest

from capacity.units import MUCoefficients
from gateway.admission import ENGINE_PRIORITY, SHEDDABLE, STANDARD
from gateway.proxy import app
from gateway.proxy.errors import ProxyError
from gateway.proxy.isolation import CacheSalts
from gateway.proxy.limits import buckets_for
from gateway.proxy.request import parse_request, request_cost, upstream_payload
from gateway.proxy.snapshot import ReservationInfo, takes_priority

COEFFS = MUCoefficients(alpha=0.001, alpha_cached=0.0001, beta=0.01, gamma=0.1, mu_per_min=1000.0)


def chat(**fields) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}).encode()


def sent(raw: bytes, *, salt: str = "salt-a", priority: int | None = 1) -> dict:
    return json.loads(upstream_payload(parse_request("chat", raw), cache_salt=salt, engine_priority=priority))


def refused_param(raw: bytes, kind: str = "chat") -> str:
    with pytest.raises(ProxyError) as caught:
        parse_request(kind, raw)
    assert caught.value.status == 400
    return caught.value.param


def test_salts_are_per_tenant_keyed_and_stable():
    salts = CacheSalts("secret-one")
    assert salts.for_tenant(1) == CacheSalts("secret-one").for_tenant(1)  # every proxy process agrees
    assert salts.for_tenant(1) != salts.for_tenant(2)
    assert CacheSalts("secret-two").for_tenant(1) != salts.for_tenant(1)  # not computable without the secret
    with pytest.raises(ValueError):
        CacheSalts("")


@pytest.mark.parametrize("stream", [False, True])
def test_client_cache_salt_priority_and_request_id_never_reach_the_engine(stream):
    body = sent(chat(stream=stream, cache_salt="tenant-a-salt", priority=-(2**63), request_id="victim"))
    assert body["cache_salt"] == "salt-a" and body["priority"] == 1 and "request_id" not in body
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    # An fcfs replica gets no priority at all (it would refuse the request).
    assert "priority" not in sent(chat(stream=stream, priority=5), priority=None)
    assert "priority" not in sent(chat(stream=stream), priority=None)


def test_fast_path_splices_the_proxy_fields_into_the_raw_body():
    raw = chat(stream=True, temperature=0.5)
    req = parse_request("chat", raw)
    payload = upstream_payload(req, cache_salt="s", engine_priority=2)
    assert payload.startswith(raw[:-1])  # the client's bytes, not a re-serialisation
    assert json.loads(payload) == {
        **req.body,
        "cache_salt": "s",
        "priority": 2,
        "stream_options": {"include_usage": True},
    }


def test_engine_priority_order_and_policy_from_launch_options():
    assert ENGINE_PRIORITY["critical"] < ENGINE_PRIORITY[STANDARD] < ENGINE_PRIORITY[SHEDDABLE]
    assert takes_priority({}) and takes_priority(None) and takes_priority({"scheduling_policy": "priority"})
    assert not takes_priority({"scheduling_policy": "fcfs"})
    assert not takes_priority({"extra_args": ["--max-num-seqs", "8", "--scheduling-policy", "fcfs"]})
    assert not takes_priority({"extra_args": ["--scheduling-policy=fcfs"]})
    assert takes_priority({"scheduling_policy": "fcfs", "extra_args": ["--scheduling-policy", "priority"]})


@pytest.mark.parametrize(
    "field,value",
    [
        ("kv_transfer_params", {"do_remote_prefill": True, "remote_block_ids": [1]}),
        ("vllm_xargs", {"k": "v"}),
        ("extra_args", {"k": "v"}),
        ("logits_processors", ["pkg.Processor"]),
        ("prompt_embeds", "AAAA"),
        ("chat_template", "{% for m in messages %}{{ m.content * 1000000 }}{% endfor %}"),
        ("use_beam_search", True),
        ("stop", ["s"] * 17),
        ("stop", ["s" * 513]),
        ("stop", 42),
        ("stop_token_ids", list(range(257))),
        ("logit_bias", {str(i): 1 for i in range(1025)}),
        ("logit_bias", [1, 2]),
        ("guided_regex", "a" * (32 * 1024 + 1)),
        ("structured_outputs", {"grammar": "x" * (32 * 1024)}),
        ("response_format", {"type": "json_schema", "json_schema": {"schema": {"enum": ["x" * 40_000]}}}),
    ],
)
def test_engine_internal_or_oversized_fields_are_refused(field, value):
    assert refused_param(chat(**{field: value})) == field


def test_bounded_fields_within_their_limits_pass():
    req = parse_request(
        "chat",
        chat(stop=["a", "b"], stop_token_ids=[1, 2], logit_bias={"1": 5}, guided_regex="[a-z]+", n=2, best_of=3),
    )
    assert req.completions == 3


@pytest.mark.parametrize(
    "fields,param",
    [({"n": 9}, "n"), ({"n": 0}, "n"), ({"n": 4, "best_of": 2}, "best_of"), ({"best_of": 9}, "best_of")],
)
def test_n_and_best_of_are_bounded(fields, param):
    assert refused_param(chat(**fields)) == param
    assert refused_param(json.dumps({"model": "m", "prompt": "x", **fields}).encode(), "completions") == param


def test_n_and_best_of_are_priced_per_completion():
    one = request_cost(parse_request("chat", chat(max_tokens=100)), COEFFS)
    four = request_cost(parse_request("chat", chat(max_tokens=100, n=4)), COEFFS)
    best = request_cost(parse_request("chat", chat(max_tokens=100, n=2, best_of=4)), COEFFS)
    # The prompt is prefilled once; the output is generated once per sequence.
    assert four.mu == pytest.approx(one.mu + 3 * 100 * COEFFS.beta) and best.mu == four.mu == four.charge_mu
    assert four.charge_tokens - one.charge_tokens == 300
    res = ReservationInfo(mu_per_min=60.0, burst_minutes=1.0, priority="standard", rpm_limit=None, tpm_limit=10_000)
    assert {b.name: b.cost for b in buckets_for(reservation=res, mu=four.mu, tokens=four.charge_tokens)} == {
        "mu": four.mu,
        "tpm": four.charge_tokens,
    }


def completions(**fields) -> bytes:
    return json.dumps({"model": "m", "prompt": "hello there", **fields}).encode()


def test_a_prompt_batch_is_as_many_sequences_as_prompts_times_n_bounded_and_priced_per_sequence():
    # 64 prompts × n=8 would be 512 sequences behind one admission slot: refused, naming the prompt.
    assert refused_param(completions(prompt=["hello there"] * 64, n=8, max_tokens=32), "completions") == "prompt"
    assert refused_param(completions(prompt=["hello there"] * 9, max_tokens=32), "completions") == "prompt"
    assert refused_param(completions(prompt=["hello there"] * 3, n=2, best_of=3), "completions") == "prompt"
    batch = parse_request("completions", completions(prompt=["hello there"] * 4, n=2, max_tokens=32))
    assert (batch.prompts, batch.completions) == (4, 8)
    single = request_cost(parse_request("completions", completions(prompt="hello there", max_tokens=32)), COEFFS)
    cost = request_cost(batch, COEFFS)
    # Four prefills of the prompt (44 characters: 11 tokens estimated, against 3 for one) and 8 × 32 output tokens.
    assert cost.charge_tokens == 11 + 8 * 32
    assert cost.mu == pytest.approx(single.mu + (11 - 3) * COEFFS.alpha + 7 * 32 * COEFFS.beta)


def test_a_missing_max_tokens_is_charged_as_the_context_it_may_fill_and_min_tokens_as_a_floor():
    bare = request_cost(parse_request("chat", chat()), COEFFS, max_model_len=4096)
    prompt = 1  # "hi": 2 characters, one estimated token
    assert bare.charge_tokens == prompt + (4096 - prompt)
    assert bare.charge_mu == pytest.approx(COEFFS.alpha * prompt + COEFFS.beta * (4096 - prompt) + COEFFS.gamma)
    # Admission still weighs a typical answer on the replica; the tenant's limits take the most it may cost.
    assert bare.mu == pytest.approx(COEFFS.alpha * prompt + COEFFS.beta * 256 + COEFFS.gamma)
    assert bare.mu < bare.charge_mu
    floor = request_cost(parse_request("chat", chat(min_tokens=3000, max_tokens=3000)), COEFFS, max_model_len=4096)
    assert floor.mu == floor.charge_mu == pytest.approx(COEFFS.alpha + COEFFS.beta * 3000 + COEFFS.gamma)
    floored = request_cost(parse_request("chat", chat(min_tokens=3000)), COEFFS)
    assert floored.mu == pytest.approx(COEFFS.alpha + COEFFS.beta * 3000 + COEFFS.gamma)


def test_tools_documents_and_parts_that_are_not_text_count_in_the_prompt():
    plain = parse_request("chat", chat())
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "x": "y" * 4000}}}
    with_tools = parse_request("chat", chat(tools=[tool]))
    assert with_tools.prompt_chars - plain.prompt_chars >= 4000
    documents = parse_request("chat", chat(documents=[{"title": "t", "text": "z" * 3000}]))
    assert documents.prompt_chars - plain.prompt_chars >= 3000
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 5000}}
    parts = parse_request(
        "chat", json.dumps({"model": "m", "messages": [{"role": "user", "content": [image]}]}).encode()
    )
    assert parts.prompt_chars >= 5000
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "q" * 2000}}]
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": calls}]
    with_calls = parse_request("chat", json.dumps({"model": "m", "messages": history}).encode())
    assert with_calls.prompt_chars - plain.prompt_chars >= 2000


def test_best_effort_has_a_per_tenant_bucket():
    (bucket,) = buckets_for(reservation=None, mu=3.0, tokens=10, best_effort_mu_per_min=120.0)
    assert bucket.name == "best_effort_mu" and bucket.capacity == 120.0 and bucket.refill_per_s == 2.0
    assert bucket.cost == 3.0
    assert buckets_for(reservation=None, mu=3.0, tokens=10, best_effort_mu_per_min=0) == []


def test_metrics_token_compare(monkeypatch):
    monkeypatch.setattr(app, "_metrics_token", b"sekrit")
    assert app._metrics_allowed({b"authorization": b"Bearer sekrit"})
    assert app._metrics_allowed({b"authorization": b"bearer sekrit"})
    assert not app._metrics_allowed({b"authorization": b"Bearer sekri"})
    assert not app._metrics_allowed({b"authorization": b"Basic sekrit"})
    assert not app._metrics_allowed({})
    monkeypatch.setattr(app, "_metrics_token", b"")  # none configured: closed, even to an empty bearer
    assert not app._metrics_allowed({b"authorization": b"Bearer "})
    assert not app._metrics_allowed({})
