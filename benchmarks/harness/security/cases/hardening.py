"""Hardening of the platform's edges: webhooks to special address ranges (site-local, 6to4, documentation…),
client addresses taken from a forged X-Forwarded-For, failed authentications at line speed (API keys, passwords,
the proxy's front door) and connections that trickle their headers to hold the server's sockets.

The throttle cases count under addresses of their own (random IPv6 documentation addresses) and delete their
counters after; the server case runs the shipped uvicorn command line in this process on a socket of its own.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import select
import shlex
import socket
import threading
import time
from datetime import timedelta
from pathlib import Path

import httpx
import uvicorn
from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from uvicorn.main import main as uvicorn_command

from benchmarks.harness.security.cases.webhooks import PUBLIC_IP, _notification, _register
from benchmarks.harness.security.fake_dns import FakeDNS
from benchmarks.harness.security.registry import expect, security_case
from benchmarks.harness.security.world import SecurityWorld
from billing.notifiers import notifications_deliver_due
from tenants.throttling import auth_failures_forget

# -- webhooks: every special range, not only what ``ipaddress.is_global`` knows -------------------------------------
SPECIAL_ADDRESSES = {
    "fec0::1": "IPv6 site-local (is_global on this Python)",
    "fc00::7": "IPv6 unique local",
    "ff0e::1": "IPv6 global-scope multicast",
    "3fff::1": "IPv6 documentation (RFC 9637)",
    "2001:db8::1": "IPv6 documentation",
    "2002:a00:1::1": "6to4 of 10.0.0.1",
    "2002:c000:9::1": "6to4 of 192.0.0.9",
    "2001:0:4136:e378:8000:63bf:f7f7:f7f7": "Teredo",
    "64:ff9b::a9fe:a9fe": "NAT64 of 169.254.169.254",
    "64:ff9b:1::a00:1": "local-use NAT64",
    "::ffff:a00:1": "IPv4-mapped 10.0.0.1",
    "::a00:1": "IPv4-compatible 10.0.0.1",
    "100::1": "IPv6 discard",
    "5f00::1": "SRv6 SIDs",
    "192.0.0.9": "IETF protocol assignments (is_global on this Python)",
    "192.88.99.1": "6to4 relay anycast (is_global on this Python)",
    "100.64.0.1": "carrier-grade NAT",
    "0.1.2.3": "this network",
    "198.18.0.1": "benchmarking",
    "239.255.255.250": "IPv4 multicast",
    "240.0.0.1": "reserved",
}
PUBLIC_V6 = "2606:4700:4700::1111"


def _literal(address: str) -> str:
    return f"http://[{address}]/hook" if ":" in address else f"http://{address}/hook"


@security_case(
    "hardening.webhook_special_ranges",
    "a tenant registers webhooks at special IPv6 and IPv4 ranges (site-local, 6to4, Teredo, NAT64, documentation…)",
)
def webhook_special_ranges(world: SecurityWorld) -> str:
    names = {f"r{n}.attacker.example": [address] for n, address in enumerate(SPECIAL_ADDRESSES)}
    with FakeDNS(names | {"v6.attacker.example": [PUBLIC_V6]}):
        accepted = [
            f"{address} ({SPECIAL_ADDRESSES[address]})"
            for address in SPECIAL_ADDRESSES
            if _register(world, _literal(address)).status_code != 400
        ]
        accepted += [
            f"name → {answers[0]}"
            for name, answers in names.items()
            if _register(world, f"https://{name}/hook").status_code != 400
        ]
        controls = [
            _register(world, _literal(PUBLIC_V6)).status_code,
            _register(world, _literal(PUBLIC_IP)).status_code,
        ]
        controls.append(_register(world, "https://v6.attacker.example/hook").status_code)
    expect(not accepted, "accepted: " + ", ".join(accepted))
    expect(controls == [201] * 3, f"public IPv6, IPv4 and an IPv6 name answered {controls}: the case proves nothing")
    return f"{len(SPECIAL_ADDRESSES)} special addresses refused as literals and as names; public ones accepted"


@security_case(
    "hardening.webhook_special_ranges_at_delivery",
    "a name public at registration resolves to a site-local or documentation IPv6 address at delivery",
)
def webhook_special_ranges_at_delivery(world: SecurityWorld) -> str:
    recorded = []
    for rebound in ("fec0::1", "3fff::1", "2002:a9fe:a9fe::1"):
        with FakeDNS({"rebind6.attacker.example": [PUBLIC_V6]}) as dns:
            created = _register(world, "http://rebind6.attacker.example/internal")
            expect(created.status_code == 201, f"registration of a public name failed ({created.status_code})")
            notification = _notification(world, created.json()["id"])
            dns.names["rebind6.attacker.example"] = [rebound]
            notifications_deliver_due(now=timezone.now() + timedelta(seconds=1))
        notification.refresh_from_db()
        # "refused: …" is the egress check; anything else means a connection to the address was attempted.
        expect(
            notification.last_error.startswith("refused"),
            f"{rebound}: a connection was attempted ({notification.status}: {notification.last_error[:100]})",
        )
        recorded.append(rebound)
    return f"rebound to {', '.join(recorded)}: refused before connecting"


# -- client addresses and failed authentications ---------------------------------------------------------------------
def _own_address() -> str:
    return f"2001:db8:{secrets.token_hex(2)}::{secrets.token_hex(2)}"


def _throttled(response, *, window_s: int) -> str | None:
    """None when ``response`` is a 429 with a usable Retry-After that says it was throttled; else what is wrong."""
    if response.status_code != 429:
        return f"answered {response.status_code}"
    retry_after = response.get("Retry-After") if hasattr(response, "get") else response.headers.get("Retry-After")
    if not (retry_after and retry_after.isdigit() and 1 <= int(retry_after) <= window_s):
        return f"429 without a usable Retry-After ({retry_after!r})"
    return None


@security_case(
    "hardening.forwarded_for_rotation",
    "an anonymous client rotates X-Forwarded-For to escape the per-address API throttle",
)
def forwarded_for_rotation(world: SecurityWorld) -> str:
    address, client, neighbour = _own_address(), _own_address(), _own_address()
    rates = {**settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], "anon": "2/min"}
    anonymous, root = world.api(None), reverse("api-root")
    try:
        with override_settings(REST_FRAMEWORK={**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": rates}):
            # Direct clients (no trusted proxy configured): the header is the client's own text.
            statuses = [
                anonymous.get(root, REMOTE_ADDR=address, HTTP_X_FORWARDED_FOR=f"198.51.100.{n}").status_code
                for n in range(5)
            ]
            expect(statuses[:2] == [200, 200], f"first calls answered {statuses[:2]}: proves nothing")
            expect(set(statuses[2:]) == {429}, f"rotating X-Forwarded-For escaped the limit: {statuses}")
            # Behind one ingress (NUM_PROXIES=1): only the address the ingress appended counts.
            behind = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": rates, "NUM_PROXIES": 1}
            with override_settings(REST_FRAMEWORK=behind):
                ingress = _own_address()
                statuses = [
                    anonymous.get(root, REMOTE_ADDR=ingress, HTTP_X_FORWARDED_FOR=f"10.9.9.{n}, {client}").status_code
                    for n in range(4)
                ]
                expect(statuses == [200, 200, 429, 429], f"behind an ingress, rotating the left entries: {statuses}")
                other = anonymous.get(root, REMOTE_ADDR=ingress, HTTP_X_FORWARDED_FOR=neighbour).status_code
                expect(other == 200, f"another client behind the same ingress was throttled too ({other})")
    finally:
        cache.delete_many([f"throttle_anon_{a}" for a in (address, client, neighbour)])
    return "5 rotated X-Forwarded-For from one address: 2 served, 3 throttled; behind an ingress the appended address"


def _failed_auth_forget(*addresses: str) -> None:
    for address in addresses:
        auth_failures_forget(address=address)


@security_case(
    "hardening.failed_auth_per_address",
    "one address sends bad API keys and bad passwords at line speed (/api/v1/, console and admin logins)",
)
def failed_auth_per_address(world: SecurityWorld) -> str:
    address, elsewhere = _own_address(), _own_address()
    limits = {"failures_per_user_address": 100, "failures_per_address": 4, "window_s": 60}
    endpoints, good = reverse("endpoint-list"), world.a.keys["read"]
    try:
        with override_settings(INFERCAP={**settings.INFERCAP, "LOGIN_THROTTLE": limits}):
            bad = [world.api(f"ick_{secrets.token_hex(16)}") for _ in range(3)]
            statuses = [client.get(endpoints, REMOTE_ADDR=address).status_code for client in bad]
            wrong_password = Client().post(
                "/accounts/login/", {"username": world.a.member.username, "password": "nope"}, REMOTE_ADDR=address
            )
            expect(statuses == [401] * 3, f"the first bad keys answered {statuses}: proves nothing")
            expect(wrong_password.status_code == 200, f"a wrong password answered {wrong_password.status_code}")
            with CaptureQueriesContext(connection) as queries:
                blocked_key = world.api(f"ick_{secrets.token_hex(16)}").get(endpoints, REMOTE_ADDR=address)
            problem = _throttled(blocked_key, window_s=60)
            expect(problem is None, f"the 5th failed authentication from one address {problem}")
            expect(len(queries) == 0, f"a throttled key still cost {len(queries)} database queries")
            right_key = world.api(good).get(endpoints, REMOTE_ADDR=address)
            expect(
                right_key.status_code == 429, f"a right key from the blocked address answered {right_key.status_code}"
            )
            admin_login = Client().post(
                "/admin/login/", {"username": world.operator.username, "password": "x"}, REMOTE_ADDR=address
            )
            problem = _throttled(admin_login, window_s=60)
            expect(problem is None, f"the admin login from the blocked address {problem}")
            other = [
                world.api(f"ick_{secrets.token_hex(16)}").get(endpoints, REMOTE_ADDR=elsewhere).status_code,
                world.api(good).get(endpoints, REMOTE_ADDR=elsewhere).status_code,
            ]
            expect(other == [401, 200], f"another address answered {other} (bad key, right key)")
    finally:
        _failed_auth_forget(address, elsewhere)
    return "3 bad keys and a bad password: then 429 with Retry-After and no query, right key and admin login too"


@security_case(
    "hardening.proxy_invalid_keys",
    "a client guesses API keys at the proxy's front door (/v1/) from one address",
    needs_proxy=True,
)
def proxy_invalid_keys(world: SecurityWorld) -> str:
    world.proxy()  # the world's replicas and snapshot; this proxy has a lowered failure limit and one ingress
    base, proc = world.other_proxy(
        INFERCAP_LOGIN_FAILURES_PER_ADDRESS="3", INFERCAP_LOGIN_WINDOW_S="60", INFERCAP_NUM_PROXIES="1"
    )
    guesser, other = "198.51.100.77", "198.51.100.78"

    def post(key: str, address: str) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}", "X-Forwarded-For": address}
        body = world.completion(world.a.endpoint.name)
        return httpx.post(base + "/v1/completions", json=body, headers=headers, timeout=30)

    try:
        statuses = [post(f"ick_{secrets.token_hex(16)}", guesser).status_code for _ in range(3)]
        blocked = post(f"ick_{secrets.token_hex(16)}", guesser)
        right_key = post(world.a.keys["inference"], guesser)
        served = post(world.a.keys["inference"], other)
        other_bad = post(f"ick_{secrets.token_hex(16)}", other)
    finally:
        world.procs.kill(proc)
    expect(statuses == [401] * 3, f"the first bad keys answered {statuses}: proves nothing")
    problem = _throttled(blocked, window_s=60)
    expect(problem is None, f"the 4th bad key from one address {problem}")
    error = blocked.json().get("error", {})
    expect(error.get("type") == "rate_limit_error", f"not an OpenAI-shaped rate-limit error: {blocked.text[:160]}")
    expect(right_key.status_code == 429, f"a right key from the guessing address answered {right_key.status_code}")
    expect([served.status_code, other_bad.status_code] == [200, 401], "another address was affected")
    return "3 invalid keys, then 429 rate_limit_error with Retry-After (a right key too); another address served"


# -- the HTTP server: headers and bodies that never finish ---------------------------------------------------------
SHIPPED_COMMANDS = {
    "Dockerfile": lambda text: re.search(r"^CMD (\[.*\])$", re.sub(r"\\\n\s*", " ", text), re.M).group(1),
    "platform/Procfile": lambda text: re.search(r"^web: (.*)$", text, re.M).group(1),
    "platform/kubernetes/base/web.yaml": lambda text: re.search(r"(?:command|args): (\[[^\]]*\])", text, re.S).group(
        1
    ),
}
MOST_HEADER_S = 30.0  # a bound above this is no bound against a few hundred trickling clients


def shipped_uvicorn_params(relative: str) -> dict:
    """The uvicorn options (uvicorn's own click parser) of the web server command shipped in ``relative``."""
    text = SHIPPED_COMMANDS[relative]((Path(settings.BASE_DIR) / relative).read_text())
    argv = json.loads(text) if text.startswith("[") else shlex.split(re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", text))
    argv = argv[argv.index("uvicorn") + 1 :]
    return uvicorn_command.make_context("uvicorn", argv).params


async def _ok_app(scope, receive, send):
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


class ThreadedServer:
    """uvicorn with the given protocol class on a socket of its own, in a thread of this process."""

    def __init__(self, params: dict, protocol: type) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(
            _ok_app,
            http=protocol,
            lifespan="off",
            log_level="critical",
            access_log=False,
            timeout_keep_alive=params["timeout_keep_alive"],
            h11_max_incomplete_event_size=params["h11_max_incomplete_event_size"],
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve(sockets=[self.sock])), daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


def slow_clients(port: int, *, trickling: int, watch_s: float) -> dict[str, float | None]:
    """Open ``trickling`` connections that send a header line every 0.2 s, one that sends nothing, and one that
    sends complete headers then trickles its body; the seconds after which the server closed each (None: open)."""
    sockets: dict[str, socket.socket] = {}
    for n in range(trickling):
        sockets[f"headers-{n}"] = socket.create_connection(("127.0.0.1", port))
        sockets[f"headers-{n}"].sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
    sockets["silent"] = socket.create_connection(("127.0.0.1", port))
    sockets["body"] = socket.create_connection(("127.0.0.1", port))
    sockets["body"].sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
    started = time.monotonic()
    closed: dict[str, float | None] = dict.fromkeys(sockets)
    try:
        while time.monotonic() - started < watch_s and any(v is None for v in closed.values()):
            open_ = {s: name for name, s in sockets.items() if closed[name] is None}
            readable, _, _ = select.select(list(open_), [], [], 0.2)
            for s in readable:
                try:
                    data = s.recv(4096)
                except OSError:
                    data = b""
                # A 408 or 400 answer, then the close; either way the connection is over.
                if not data or data.startswith(b"HTTP/1.1 4"):
                    closed[open_[s]] = time.monotonic() - started
            for s, name in open_.items():
                if closed[name] is None and name != "silent":
                    try:
                        s.sendall(b"a" if name == "body" else b"X-Slow: 1\r\n")
                    except OSError:
                        closed[name] = time.monotonic() - started
    finally:
        for s in sockets.values():
            s.close()
    return closed


@security_case(
    "hardening.slow_headers",
    "ten connections trickle their headers (and one its body, one sends nothing) to hold the server's sockets",
)
def slow_headers(world: SecurityWorld) -> str:
    bounds = {}
    for relative in SHIPPED_COMMANDS:
        params = shipped_uvicorn_params(relative)
        config = uvicorn.Config(_ok_app, http=params["http"])
        config.load()
        bounds[relative] = (config.http_protocol_class, getattr(config.http_protocol_class, "header_timeout_s", None))
    unbounded = [r for r, (_, bound) in bounds.items() if not (bound and bound <= MOST_HEADER_S)]
    protocol, bound = bounds["Dockerfile"]
    # The shipped protocol at a lowered bound, so the case takes seconds (the same code; the bound is a number).
    run_bound = 1.0
    if bound:
        protocol = type("LoweredBound", (protocol,), {"header_timeout_s": run_bound, "body_timeout_s": run_bound})
    server = ThreadedServer(shipped_uvicorn_params("Dockerfile"), protocol)
    try:
        control = httpx.get(f"http://127.0.0.1:{server.port}/", timeout=5).status_code
        closed = slow_clients(server.port, trickling=10, watch_s=run_bound + 3.0)
    finally:
        server.close()
    late = sorted(name for name, after in closed.items() if after is None or after > run_bound + 1.5)
    expect(control == 200, f"a plain request answered {control}: proves nothing")
    expect(not late, f"still open {run_bound + 3.0:g} s into a {run_bound:g} s bound: {', '.join(late)}")
    expect(not unbounded, f"shipped without a header bound (≤ {MOST_HEADER_S:g} s): {', '.join(unbounded)}")
    slowest = max(v for v in closed.values() if v is not None)
    return (
        f"shipped header bound {bound:g} s ({', '.join(bounds)}); at {run_bound:g} s the 12 slow connections were "
        f"closed within {slowest:.1f} s, a plain request served"
    )
