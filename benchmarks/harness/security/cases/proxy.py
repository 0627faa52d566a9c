"""Isolation down to the engine, attacked through the real proxy in front of simulated vLLM replicas: the prefix
cache is salted per tenant, a client cannot set the engine's priority, /metrics needs its token, n and best_of are
bounded and priced, best-effort traffic has a per-tenant budget, and engine-internal fields never reach the engine.

What the engine was asked for is read back from the replica (the simulator's ``/admin/received``), matched to a
request by the ``X-Request-Id`` the proxy answered with (it is the id the proxy sends upstream).
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import httpx
import redis
from django.conf import settings
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.harness.security.registry import expect, security_case
from benchmarks.harness.security.world import BEST_EFFORT_MU_PER_MIN, SecurityWorld
from capacity.unit_resolver import coefficients_by_endpoint
from gateway.admission import ENGINE_PRIORITY, SHED_REASONS
from gateway.proxy.limits import Bucket, RateLimiter
from simulator.tokens import filler_text

CHAT = "/v1/chat/completions"


def _error(response: httpx.Response) -> dict:
    try:
        return response.json().get("error") or {}
    except ValueError:
        return {}


def _chat(model: str, content: str = "security bench says hello", *, system: str | None = None, **extra) -> dict:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]
    return {"model": model, "messages": messages, "max_tokens": 2, "stream": False, **extra}


def _seen(world: SecurityWorld, endpoint, response: httpx.Response) -> dict:
    """The replica's record of the request the proxy answered with ``response``."""
    rid = response.headers.get("x-request-id")
    found = [r for r in world.received(endpoint) if r["request_id"] == rid]
    expect(found, f"request {rid} is not in the replica's log: the case proves nothing")
    return found[-1]


def _dispatched(world: SecurityWorld, endpoint) -> float:
    """Requests the proxy metered for ``endpoint`` (its ``infercap_proxy_requests_total``, every outcome): one it
    refuses while parsing is never dispatched nor metered, one the replica refuses is (``upstream_error``)."""
    response = httpx.get(
        world.proxy() + "/metrics", headers={"Authorization": f"Bearer {world.metrics_token}"}, timeout=10
    )
    response.raise_for_status()
    return sum(
        sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
        if sample.name == "infercap_proxy_requests_total" and sample.labels.get("endpoint") == endpoint.name
    )


def _cached_tokens(response: httpx.Response, label: str) -> int:
    expect(response.status_code == 200, f"{label} answered {response.status_code}: {response.text[:120]}")
    details = response.json()["usage"].get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


# -- the prefix cache ----------------------------------------------------------------------------------------------
@security_case(
    "proxy.cache_salt_isolation",
    "tenants B and C replay tenant A's long system prompt on a shared replica (B even sending A's cache_salt) to learn "
    "from cached_tokens that A sent it",
    needs_proxy=True,
)
def cache_salt_isolation(world: SecurityWorld) -> str:
    shared = world.shared
    system = filler_text(512, seed=f"{world.tag}-tenant-a-system-prompt")  # 32 full KV blocks

    def ask(key: str, question: str, **extra) -> httpx.Response:
        return world.proxy_post(key, _chat(shared.name, question, system=system, **extra), path=CHAT)

    first = ask(world.a.keys["inference"], "first question")
    expect(_cached_tokens(first, "A's first request") == 0, "A's first request already hit: the prompt is not fresh")
    repeat = ask(world.a.keys["inference"], "second question")
    hit = _cached_tokens(repeat, "A's repeat")
    expect(hit >= 500, f"A's own repeat hit only {hit} tokens: the cache is not working, the case proves nothing")
    salt_a = _seen(world, shared, first)["cache_salt"]
    expect(salt_a, "A's request reached the engine without a cache_salt")

    # The strongest attacker knows A's salt (the bench reads it off the replica) and sends it.
    stolen = ask(world.b.keys["inference"], "probe", cache_salt=salt_a)
    stolen_hit = _cached_tokens(stolen, "B's probe with A's salt")
    salt_b = _seen(world, shared, stolen)["cache_salt"]
    replay = ask(world.c.key, "probe")
    replay_hit = _cached_tokens(replay, "C's replay")
    salt_c = _seen(world, shared, replay)["cache_salt"]
    expect(stolen_hit == 0, f"B sending A's cache_salt got {stolen_hit} cached tokens of A's prompt")
    expect(replay_hit == 0, f"C replaying A's system prompt got {replay_hit} cached tokens")
    expect(salt_b and salt_b != salt_a, "B's request reached the engine with A's cache_salt")
    expect(salt_c and salt_c not in (salt_a, salt_b), "C's request reached the engine without a salt of its own")

    # A client-sent salt is overwritten even for its own tenant: A still hits its blocks, under its own salt.
    own = ask(world.a.keys["inference"], "third question", cache_salt="chosen-by-the-client")
    own_hit = _cached_tokens(own, "A's request with a salt of its own choosing")
    expect(_seen(world, shared, own)["cache_salt"] == salt_a, "A's client-chosen cache_salt reached the engine")
    expect(own_hit >= 500, f"A's request with a client salt hit only {own_hit} tokens: its salt was not replaced")
    return (
        f"A's repeat hit {hit} tokens; B with A's salt and C replaying got 0; the engine saw three different "
        f"per-tenant salts and A's client-chosen salt replaced by A's own ({own_hit} hit)"
    )


# -- the engine's priority -----------------------------------------------------------------------------------------
@security_case(
    "proxy.priority_spoofing",
    "clients send priority -1000 (and ask for critical by header) to jump a shared replica's engine queue",
    needs_proxy=True,
)
def priority_spoofing(world: SecurityWorld) -> str:
    a_key, a_model = world.a.keys["inference"], world.a.endpoint.name
    # A's key and reservation say standard, and a header may only lower it; B and C have no reservation on the
    # shared endpoint, so they are best effort: sheddable. (endpoint, key, body, headers, admitted class, label)
    attempts = [
        (world.a.endpoint, a_key, _chat(a_model, priority=-1000), {}, "standard", "A: priority -1000"),
        (world.a.endpoint, a_key, _chat(a_model, priority=-(2**62)), {}, "standard", "A: priority -2^62"),
        (
            world.a.endpoint,
            a_key,
            _chat(a_model, priority=-1000),
            {"x-infercap-priority": "critical"},
            "standard",
            "A: header critical + priority -1000",
        ),
        (
            world.a.endpoint,
            a_key,
            _chat(a_model, priority=0),
            {"x-infercap-priority": "sheddable"},
            "sheddable",
            "A: header sheddable + priority 0",
        ),
        (
            world.shared,
            world.b.keys["inference"],
            _chat(world.shared.name, priority=-1000),
            {},
            "sheddable",
            "B best effort: priority -1000",
        ),
        (world.shared, world.c.key, _chat(world.shared.name, stream=True), {}, "sheddable", "C best effort: none"),
    ]
    wrong, seen = [], []
    for endpoint, key, body, headers, cls, label in attempts:
        response = world.proxy_post(key, body, headers=headers, path=CHAT)
        expect(response.status_code == 200, f"{label}: answered {response.status_code}: {response.text[:120]}")
        got = _seen(world, endpoint, response)["priority"]
        seen.append(f"{label} -> {got}")
        if got != ENGINE_PRIORITY[cls]:
            wrong.append(f"{label}: the engine saw {got}, the admitted class {cls} is {ENGINE_PRIORITY[cls]}")
    expect(not wrong, "; ".join(wrong))
    return "the engine saw the admitted class's priority: " + ", ".join(seen)


# -- /metrics ------------------------------------------------------------------------------------------------------
@security_case(
    "proxy.metrics_token",
    "anonymous callers, a wrong token, a tenant's key and malformed headers scrape the proxy's /metrics",
    needs_proxy=True,
)
def metrics_token(world: SecurityWorld) -> str:
    base, token = world.proxy(), world.metrics_token
    attempts = {
        "anonymous": {},
        "wrong token": {"Authorization": "Bearer not-the-metrics-token"},
        "token prefix": {"Authorization": f"Bearer {token[:-1]}"},
        "token without Bearer": {"Authorization": token},
        "Basic scheme": {"Authorization": f"Basic {token}"},
        "A's full API key": {"Authorization": f"Bearer {world.a.keys['full']}"},
    }
    unknown = httpx.get(base + "/v1/no-such-path", timeout=10)  # the proxy's own answer to a path it lacks
    answered = {label: httpx.get(base + "/metrics", headers=h, timeout=10) for label, h in attempts.items()}
    served = [label for label, r in answered.items() if r.status_code != 404 or "infercap_proxy" in r.text]
    expect(not served, "not refused with 404: " + ", ".join(f"{k} {answered[k].status_code}" for k in served))
    # 404 like any unknown path, not 401: an anonymous caller does not learn that metrics are served here.
    shape = {k: _error(unknown).get(k) for k in ("type", "code", "param")}
    expect(unknown.status_code == 404 and shape["code"], f"an unknown proxy path answered {unknown.status_code}")
    told_apart = [label for label, r in answered.items() if {k: _error(r).get(k) for k in shape} != shape]
    expect(not told_apart, f"told apart from an unknown path: {', '.join(told_apart)}")
    ok = httpx.get(base + "/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    expect(
        ok.status_code == 200 and "infercap_proxy_requests_total" in ok.text,
        f"the right token is refused too ({ok.status_code}): the case proves nothing",
    )
    return f"{len(attempts)} attempts answered 404 like an unknown path; the configured token gets the exposition"


@security_case(
    "proxy.metrics_closed_without_token",
    "a proxy deployed without INFERCAP_METRICS_TOKEN is scraped anonymously, or with a token from elsewhere",
    needs_proxy=True,
)
def metrics_closed_without_token(world: SecurityWorld) -> str:
    world.proxy()  # the world's replicas and snapshot; this proxy differs only in having no metrics token
    base, proc = world.other_proxy(INFERCAP_METRICS_TOKEN="", INFERCAP_PROXY_METRICS_TOKEN="")
    try:
        serving = httpx.get(
            base + "/v1/models", headers={"Authorization": f"Bearer {world.a.keys['inference']}"}, timeout=10
        )
        expect(
            serving.status_code == 200, f"the token-less proxy does not serve ({serving.status_code}): proves nothing"
        )
        attempts = {
            "anonymous": {},
            "the other proxy's token": {"Authorization": f"Bearer {world.metrics_token}"},
            "Bearer with no token": {"Authorization": "Bearer"},
        }
        answered = {label: httpx.get(base + "/metrics", headers=h, timeout=10) for label, h in attempts.items()}
    finally:
        world.procs.kill(proc)
    served = [f"{label} {r.status_code}" for label, r in answered.items() if r.status_code != 404]
    expect(not served, "served without a configured token: " + ", ".join(served))
    return f"no token configured: {', '.join(attempts)} all answered 404 (fail closed)"


# -- n and best_of -------------------------------------------------------------------------------------------------
@security_case(
    "proxy.n_best_of_bounds",
    "a client asks for n or best_of beyond the bound (or best_of < n) to buy many sequences with one admission",
    needs_proxy=True,
)
def n_best_of_bounds(world: SecurityWorld) -> str:
    key, endpoint = world.a.keys["inference"], world.a.endpoint
    attempts = [
        ({"n": 9}, "n"),
        ({"n": 10_000}, "n"),
        ({"best_of": 9}, "best_of"),
        ({"best_of": 10_000}, "best_of"),
        ({"n": 4, "best_of": 2}, "best_of"),
    ]
    wrong, ids = [], set()
    before = _dispatched(world, endpoint)
    for fields, param in attempts:
        for path, body in (
            ("/v1/completions", world.completion(endpoint.name, **fields)),
            (CHAT, _chat(endpoint.name, **fields)),
        ):
            response = world.proxy_post(key, body, path=path)
            ids.add(response.headers.get("x-request-id"))
            got = (response.status_code, _error(response).get("param"))
            if got != (400, param):
                wrong.append(f"{fields} on {path}: {got[0]} param={got[1]}")
    expect(not wrong, "not refused: " + "; ".join(wrong))
    # The simulator serves n=1 only, so it would refuse n=9 itself: what counts is that the proxy refused first.
    reached = [r for r in world.received(endpoint) if r["request_id"] in ids]
    dispatched = _dispatched(world, endpoint) - before
    expect(not reached and not dispatched, f"{dispatched:g} refused request(s) were dispatched to the replica")
    control = world.proxy_post(key, world.completion(endpoint.name, best_of=8))
    expect(control.status_code == 200, f"best_of=8 (the bound) is refused too ({control.status_code}): proves nothing")
    return (
        f"{2 * len(attempts)} requests (n or best_of > 8, best_of < n; both APIs) refused with 400 naming the "
        "parameter before the engine; best_of=8 served (pricing per sequence: proxy.best_effort_tenant_limit)"
    )


# -- best effort ---------------------------------------------------------------------------------------------------
def _best_effort_bucket_reset(world: SecurityWorld) -> None:
    """Tenant C's best-effort bucket on the shared endpoint starts (and is left) full: a bench run a minute ago on
    the same Redis, whose throwaway database gave its tenant C the same id, must not have drained it."""
    keys = RateLimiter.keys(world.c.tenant.pk, world.shared.pk, [Bucket("best_effort_mu", 0.0, 0.0, 0.0)])
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        client.delete(*keys)
    finally:
        client.close()


BURST = 6  # concurrent requests: admission charges them all before any finishes (and is settled)
MAX_TOKENS = 4000  # within the model profile's 4,096-token context


@security_case(
    "proxy.best_effort_tenant_limit",
    "a tenant without a reservation floods a shared endpoint with best_of=8 requests to take the capacity nobody "
    "reserved",
    needs_proxy=True,
)
def best_effort_tenant_limit(world: SecurityWorld) -> str:
    shared = world.shared
    beta = coefficients_by_endpoint([shared])[shared.pk].beta
    # Charged per candidate, each request costs more than 8 x beta x max_tokens MU, so the burst budget
    # (one minute of the cap) admits at most this many; charged once, it would admit the whole burst.
    admissible = math.floor(BEST_EFFORT_MU_PER_MIN / (8 * beta * MAX_TOKENS))
    expect(0 < admissible < BURST, f"the cap admits {admissible} such requests: the case cannot tell, fix BURST")
    # ignore_eos: every request runs its 4,000 tokens, so none finishes (and is settled to its real cost, freeing
    # budget) before the whole burst has met the cap.
    body = world.completion(shared.name, max_tokens=MAX_TOKENS, best_of=8, ignore_eos=True)
    world.proxy()  # started (if this is the first proxy case) before the burst, not by it
    _best_effort_bucket_reset(world)
    try:
        with ThreadPoolExecutor(BURST) as pool:
            responses = list(pool.map(lambda _: world.proxy_post(world.c.key, body), range(BURST)))
        admitted = [r for r in responses if r.status_code == 200]
        refused = [r for r in responses if r.status_code == 429]
        other = sorted({r.status_code for r in responses} - {200, 429})
        expect(not other, f"unexpected answers {other}: {[r.text[:100] for r in responses if r.status_code in other]}")
        expect(refused, f"all {BURST} best_of=8 requests of {MAX_TOKENS} tokens were admitted: no best-effort budget")
        expect(admitted, "not even the first request was admitted: the case proves nothing")
        expect(
            len(admitted) <= admissible,
            f"{len(admitted)} admitted, more than {admissible}: best_of is not charged per candidate",
        )
        # The cap's refusals are rate limits; a burst this size may also fill the replicas' queue, so admission can
        # shed some of it (a CI run under load saw `overloaded` answer first): judge the cap by its own refusals.
        errors = [_error(r) for r in refused]
        limited = [(r, e) for r, e in zip(refused, errors, strict=True) if e.get("code") == "rate_limit_exceeded"]
        expect(limited, f"no refusal is the best-effort cap's: {errors[:3]}")
        expect(
            all(e.get("code") in ("rate_limit_exceeded", *SHED_REASONS) for e in errors),
            f"unexpected refusals: {[e for e in errors if e.get('code') != 'rate_limit_exceeded'][:3]}",
        )
        refused_first, err = limited[0]
        expect("best_effort_mu" in (err.get("message") or ""), f"the refusal does not name best_effort_mu: {err}")
        expect(refused_first.headers.get("retry-after", "").isdigit(), "the 429 has no Retry-After")
        # Another best-effort tenant has a budget of its own, and reserved traffic is not capped by it.
        other_tenant = world.proxy_post(world.b.keys["inference"], world.completion(shared.name))
        expect(other_tenant.status_code == 200, f"B's best effort on the same endpoint got {other_tenant.status_code}")
        reserved = world.proxy_post(world.a.keys["inference"], world.completion(world.a.endpoint.name))
        expect(reserved.status_code == 200, f"A's reserved traffic got {reserved.status_code}")
    finally:
        _best_effort_bucket_reset(world)
    return (
        f"{len(admitted)} of {BURST} concurrent best_of=8 requests admitted (at most {admissible} at "
        f"{BEST_EFFORT_MU_PER_MIN:g} MU/min, each candidate priced), {len(refused)} refused 429 best_effort_mu with "
        "Retry-After; B's best effort and A's reservation unaffected"
    )


# -- engine-internal fields ----------------------------------------------------------------------------------------
# The attack list, kept here rather than imported from the proxy: dropping a name from the proxy's list must fail
# the bench.
ENGINE_FIELDS = {
    "kv_transfer_params": {"do_remote_prefill": True, "remote_engine_id": "other", "remote_block_ids": [1, 2, 3]},
    "vllm_xargs": {"plugin": "x"},
    "extra_args": {"logits_processor": "x"},
    "logits_processors": ["os.system"],
    "prompt_embeds": "AAAA",
    "chat_template": "{% for i in range(10**9) %}x{% endfor %}",
}
OVERSIZED = [
    ("stop", ["x"] * 17, "17 stop sequences"),
    ("stop", ["y" * 513], "a 513-character stop"),
    ("logit_bias", {str(i): 1 for i in range(1025)}, "1,025 logit_bias entries"),
    ("stop_token_ids", list(range(257)), "257 stop_token_ids"),
    ("guided_regex", "(a|a)*" * 6000, "a 36,000-character guided_regex"),
]


@security_case(
    "proxy.engine_fields_refused",
    "a client hands the engine internal fields (kv_transfer_params, vllm_xargs, extra_args, logits_processors, "
    "prompt_embeds, chat_template), oversized stop/logit_bias lists, or another request's request_id",
    needs_proxy=True,
)
def engine_fields_refused(world: SecurityWorld) -> str:
    key, endpoint = world.a.keys["inference"], world.a.endpoint
    attempts = [(name, value, name) for name, value in ENGINE_FIELDS.items()] + list(OVERSIZED)
    wrong, ids = [], set()
    before = _dispatched(world, endpoint)
    for name, value, label in attempts:
        response = world.proxy_post(key, _chat(endpoint.name, **{name: value}), path=CHAT)
        ids.add(response.headers.get("x-request-id"))
        got = (response.status_code, _error(response).get("param"))
        if got != (400, name):
            wrong.append(f"{label}: {got[0]} param={got[1]}")
    expect(not wrong, "not refused: " + "; ".join(wrong))
    log = world.received(endpoint)
    reached = [r for r in log if r["request_id"] in ids or set(r["fields"]) & set(ENGINE_FIELDS)]
    dispatched = _dispatched(world, endpoint) - before
    expect(
        not reached and not dispatched,
        f"refused requests reached the engine: {len(reached)} in its log, {dispatched:g} dispatched by the proxy",
    )
    # Within the bounds is served; a body request_id (another request's, say) never names the engine's request.
    victim = log[-1]["request_id"] if log else "victim-request-id"
    control = world.proxy_post(
        key, _chat(endpoint.name, stop=["x"] * 16, logit_bias={"1": 1}, request_id=victim), path=CHAT
    )
    expect(control.status_code == 200, f"in-bound stop/logit_bias refused too ({control.status_code}): proves nothing")
    seen = _seen(world, endpoint, control)
    expect(
        "request_id" not in seen["fields"] and seen["request_id"] != victim, "the body's request_id reached the engine"
    )
    return (
        f"{len(ENGINE_FIELDS)} engine-internal fields and {len(OVERSIZED)} oversized ones refused with 400 naming "
        "the field, none reached the engine; 16 stops served; a body request_id stripped"
    )
