"""The books against a tenant who tries to cheat them, through the real proxy in front of a simulated replica: a
stream left just before its usage chunk, a prompt batch fanned out by ``n``, requests without ``max_tokens`` held
long by ``min_tokens``, and request ids that would count the platform's traffic (docs/security.md, metering).

Tenant C has no reservation on the shared endpoint, so its traffic there is best effort, capped per tenant at
``BEST_EFFORT_MU_PER_MIN``: each case reads what C was metered and whether the cap stopped it.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from benchmarks.harness.security.cases.proxy import _best_effort_bucket_reset, _error
from benchmarks.harness.security.registry import expect, security_case
from benchmarks.harness.security.world import BEST_EFFORT_MU_PER_MIN, SecurityWorld
from billing.models import UsageRecord

CHAT = "/v1/chat/completions"
CONCURRENT = 48  # requests without max_tokens fired at once, as a client would to beat the cap
LONG = 4000  # output tokens per sequence: within the model profile's 4,096-token context
# The client leaves a fifth of the way: the simulator generates faster than a loaded client reads, so a client
# leaving nearer the end could find the whole answer, usage chunk included, already in its socket (metered in full,
# as "ok").
READ_FRACTION = 0.2


def _record(request_id: str, timeout_s: float = 15.0) -> UsageRecord:
    """The usage record the proxy wrote for ``request_id`` (its writer batches: wait for it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        row = UsageRecord.objects.filter(request_id=request_id).first()
        if row is not None:
            return row
        time.sleep(0.1)
    raise AssertionError(f"no usage record for {request_id} after {timeout_s:g} s")


def _stream_and_leave(world: SecurityWorld, key: str, body: dict, chunks: int) -> tuple[int, str, int]:
    """Stream ``body``, read ``chunks`` token chunks, close the connection: (status, request id, chunks read)."""
    read = 0
    with httpx.Client(timeout=120) as client:
        with client.stream(
            "POST", world.proxy() + CHAT, json=body, headers={"Authorization": f"Bearer {key}"}
        ) as response:
            rid = response.headers.get("x-request-id", "")
            if response.status_code != 200:
                response.read()
                return response.status_code, rid, 0
            for line in response.iter_lines():
                if line.startswith('data: {"id"') and '"role"' not in line and '"choices":[]' not in line:
                    read += 1
                    if read >= chunks:
                        break
    return 200, rid, read


def _long_stream(world: SecurityWorld, label: str) -> dict:
    return {
        "model": world.shared.name,
        "messages": [{"role": "user", "content": f"{world.tag} {label} {time.monotonic_ns()} talk at length"}],
        "max_tokens": LONG,
        "n": 8,
        "ignore_eos": True,
        "stream": True,
    }


@security_case(
    "metering.stream_left_before_usage",
    "a best-effort tenant streams 8 x 4,000 tokens, leaves long before the usage chunk, and repeats, to be metered "
    "nothing and never run into its cap",
    needs_proxy=True,
)
def stream_left_before_usage(world: SecurityWorld) -> str:
    world.proxy()
    _best_effort_bucket_reset(world)
    try:
        want = int(8 * LONG * READ_FRACTION)
        started = time.monotonic()
        status, rid, read = _stream_and_leave(world, world.c.key, _long_stream(world, "first"), want)
        expect(status == 200 and read == want, f"the first stream answered {status} after {read} chunks")
        row = _record(rid)
        expect(row.status == "client_cancelled", f"the stream left early was recorded as {row.status}")
        expect(row.input_tokens > 0, f"its prompt was metered as {row.input_tokens} tokens")
        expect(row.output_tokens >= read, f"{row.output_tokens} output tokens metered, {read} were delivered")
        expect(row.mu > 0, f"metered {row.mu} MU for {read} delivered tokens")

        # Each such stream costs what it delivered, so the cap admits about this many before it refuses one: its
        # capacity, plus what it refills (the cap per minute) while the streams run; a slow host runs them slower.
        def admissible() -> int:
            refilled = BEST_EFFORT_MU_PER_MIN * (time.monotonic() - started) / 60.0
            return math.floor((BEST_EFFORT_MU_PER_MIN + refilled) / row.mu) + 1

        statuses = [status]
        while len(statuses) <= admissible() + 1 and statuses[-1] == 200:
            statuses.append(_stream_and_leave(world, world.c.key, _long_stream(world, "again"), want)[0])
        expect(
            statuses[-1] == 429,
            f"{len(statuses)} streams left before their usage chunk were all admitted (at {row.mu:.1f} MU each, the "
            f"{BEST_EFFORT_MU_PER_MIN:g} MU/min cap holds {admissible()} by now): they are not charged what they delivered",
        )
    finally:
        _best_effort_bucket_reset(world)
    return (
        f"a stream left before its usage chunk was metered {row.input_tokens} prompt + {row.output_tokens} "
        f"output tokens ({row.mu:.1f} MU, {read} delivered); the cap refused stream {len(statuses)} of at most "
        f"{admissible() + 2}"
    )


@security_case(
    "metering.prompt_batch_fanout",
    "a tenant sends 64 prompts with n=8 on /v1/completions (512 sequences behind one slot, priced as one prompt)",
    needs_proxy=True,
)
def prompt_batch_fanout(world: SecurityWorld) -> str:
    model, key = world.shared.name, world.c.key
    attempts = {
        "64 prompts x n=8": {"prompt": ["hello there"] * 64, "n": 8},
        "9 prompts": {"prompt": ["hello there"] * 9},
        "3 prompts x best_of=3": {"prompt": ["hello there"] * 3, "best_of": 3},
    }
    admitted = []
    for label, fields in attempts.items():
        response = world.proxy_post(key, {"model": model, "max_tokens": 32, "ignore_eos": True, **fields})
        error = _error(response)
        if response.status_code != 400 or error.get("param") != "prompt":
            admitted.append(f"{label}: {response.status_code} {error.get('param')}")
    expect(not admitted, "not refused with a 400 naming 'prompt': " + "; ".join(admitted))
    # Within the bound a batch is served, and metered per prompt and per sequence.
    _best_effort_bucket_reset(world)
    ok = world.proxy_post(key, {"model": model, "max_tokens": 8, "ignore_eos": True, "prompt": ["one", "two"], "n": 4})
    expect(ok.status_code == 200, f"2 prompts x n=4 answered {ok.status_code}: {ok.text[:120]}")
    choices = len(ok.json()["choices"])
    row = _record(ok.headers["x-request-id"])
    expect(choices == 8 and row.output_tokens == 64, f"{choices} choices, {row.output_tokens} output tokens metered")
    return f"{len(attempts)} batches over 8 sequences refused 400 (param prompt); 2 x 4 served 8 choices, 64 tokens metered"


@security_case(
    "metering.min_tokens_without_max_tokens",
    "a best-effort tenant fires requests without max_tokens, with min_tokens 3,000 and n=4, charged the typical "
    "256-token estimate and never settled, to run far past its cap",
    needs_proxy=True,
)
def min_tokens_without_max_tokens(world: SecurityWorld) -> str:
    world.proxy()
    body = {
        "model": world.shared.name,
        "messages": [{"role": "user", "content": f"{world.tag} keep going"}],
        "min_tokens": 3000,
        "n": 4,
        "stream": False,
    }
    _best_effort_bucket_reset(world)
    try:
        started = time.monotonic()
        with ThreadPoolExecutor(CONCURRENT) as pool:
            responses = list(pool.map(lambda _: world.proxy_post(world.c.key, body, path=CHAT), range(CONCURRENT)))
        elapsed = time.monotonic() - started
        admitted = [r for r in responses if r.status_code == 200]
        expect(admitted, f"none admitted: {[r.text[:80] for r in responses[:2]]}")
        rows = [_record(r.headers["x-request-id"]) for r in admitted]
        expect(min(r.output_tokens for r in rows) >= 4 * 3000, "min_tokens 3000 x n=4 produced fewer tokens")
    finally:
        _best_effort_bucket_reset(world)
    # Charged up front for all the context it may fill and settled to what it ran, no more than the cap's burst,
    # what it refilled over the whole attack and one request's slack can run.
    metered = sum(r.mu for r in rows)
    bound = BEST_EFFORT_MU_PER_MIN * (1 + elapsed / 60) + max(r.mu for r in rows)
    expect(
        metered <= bound,
        f"{len(admitted)} of {CONCURRENT} admitted, {metered:.0f} MU metered in {elapsed:.1f} s: more than the "
        f"{BEST_EFFORT_MU_PER_MIN:g} MU/min cap allows ({bound:.0f})",
    )
    return (
        f"{len(admitted)} of {CONCURRENT} concurrent requests admitted, {metered:.0f} MU metered in {elapsed:.1f} s "
        f"(the cap allows {bound:.0f})"
    )


@security_case(
    "metering.request_ids_count_nothing",
    "a tenant reads x-request-id of two of its requests to count the platform's traffic between them",
    needs_proxy=True,
)
def request_ids_count_nothing(world: SecurityWorld) -> str:
    ids = [
        world.proxy_post(world.a.keys["inference"], world.completion(world.a.endpoint.name)).headers["x-request-id"]
        for _ in range(3)
    ]
    hexes = [rid.removeprefix("req-") for rid in ids]
    expect(all(len(h) >= 24 for h in hexes), f"ids too short to be random: {ids}")
    expect(all(int(h, 16) >= 0 for h in hexes), f"ids not hex: {ids}")
    # A counter under a per-process prefix shares the prefix and moves by the traffic in between.
    shared = [i for i in range(2) if hexes[i][:12] == hexes[i + 1][:12]]
    expect(not shared, f"consecutive ids share their first 12 hex digits (a counter under a prefix): {ids}")
    return f"three consecutive ids share no prefix: {', '.join(ids)}"


@security_case(
    "metering.beam_search_refused",
    "a tenant asks for beam search (n=8): vLLM runs it as one engine request per beam and per token, and answers "
    "usage for one answer",
    needs_proxy=True,
)
def beam_search_refused(world: SecurityWorld) -> str:
    model, key = world.a.endpoint.name, world.a.keys["inference"]
    answered = {
        "chat": world.proxy_post(
            key,
            {"model": model, "messages": [{"role": "user", "content": "hi"}], "n": 8, "use_beam_search": True},
            path=CHAT,
        ),
        "completions": world.proxy_post(key, world.completion(model, n=8, use_beam_search=True)),
    }
    wrong = [
        f"{api}: {r.status_code} {_error(r).get('param')}"
        for api, r in answered.items()
        if r.status_code != 400 or _error(r).get("param") != "use_beam_search"
    ]
    expect(not wrong, "beam search not refused with a 400 naming it: " + "; ".join(wrong))
    plain = world.proxy_post(key, world.completion(model, use_beam_search=False))
    expect(plain.status_code == 200, f"use_beam_search false answered {plain.status_code}: the case proves nothing")
    return "use_beam_search true refused 400 on both APIs before dispatch; false served"
