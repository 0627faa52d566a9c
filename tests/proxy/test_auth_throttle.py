"""The proxy's front door counts failed authentications per client address: past the limit an address gets an
OpenAI-shaped 429 with Retry-After before its key is looked at; other addresses, and the window's end, are free."""

import asyncio
import json

from gateway.proxy.auth_throttle import FailureCounter, throttle_failed_authentications

GOOD = b"Bearer ick_right"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _front_door(scope, receive, send):
    """A stand-in for the proxy's key check: 401 unless the right key, else 200; counts the keys it looked at."""
    _front_door.lookups += 1
    status = 200 if dict(scope["headers"]).get(b"authorization") == GOOD else 401
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


def _call(app, *, key: bytes, client: str = "203.0.113.9", forwarded: str | None = None, path="/v1/completions"):
    headers = [(b"authorization", key)] + ([(b"x-forwarded-for", forwarded.encode())] if forwarded else [])
    scope = {"type": "http", "path": path, "headers": headers, "client": (client, 5555)}
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    start = sent[0]
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], dict(start["headers"]), body


def _guarded(clock: Clock, *, num_proxies: int = 0):
    _front_door.lookups = 0
    counter = FailureCounter(limit=3, window_s=60, clock=clock)
    return throttle_failed_authentications(_front_door, counter=counter, num_proxies=num_proxies)


def test_an_address_past_the_limit_gets_429_before_the_key_is_looked_at():
    clock = Clock()
    app = _guarded(clock)
    assert [_call(app, key=b"Bearer ick_guess")[0] for _ in range(3)] == [401] * 3
    looked_up = _front_door.lookups
    status, headers, body = _call(app, key=GOOD)
    assert status == 429 and _front_door.lookups == looked_up
    assert headers[b"retry-after"] == b"60"
    error = json.loads(body)["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == "too_many_failed_authentications"
    assert _call(app, key=GOOD, client="203.0.113.10")[0] == 200
    clock.now += 45
    assert _call(app, key=GOOD)[1][b"retry-after"] == b"15"
    clock.now += 15
    assert _call(app, key=GOOD)[0] == 200


def test_successes_do_not_count_and_probes_are_not_guarded():
    app = _guarded(Clock())
    for _ in range(10):
        assert _call(app, key=GOOD)[0] == 200
    for _ in range(3):
        _call(app, key=b"Bearer ick_guess")
    assert _call(app, key=GOOD, path="/health")[0] == 200


def test_forwarded_for_counts_only_with_trusted_proxies():
    rotating = [f"198.51.100.{n}" for n in range(5)]
    direct = _guarded(Clock())
    assert [_call(direct, key=b"Bearer x", forwarded=f)[0] for f in rotating] == [401, 401, 401, 429, 429]
    behind = _guarded(Clock(), num_proxies=1)
    assert [_call(behind, key=b"Bearer x", forwarded=f"{f}, 192.0.2.7")[0] for f in rotating][-1] == 429
    assert _call(behind, key=GOOD, forwarded="192.0.2.8")[0] == 200


def test_the_counter_stays_bounded_under_many_addresses():
    clock = Clock()
    counter = FailureCounter(limit=2, window_s=60, max_addresses=100, clock=clock)
    counter.failed("guesser")
    counter.failed("guesser")
    for n in range(500):
        counter.failed(f"spray-{n}")
    assert len(counter._windows) <= 100
    clock.now += 61
    assert counter.blocked_for_s("guesser") == 0
