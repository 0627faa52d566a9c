"""Failed authentications at the proxy's front door, per client address: past the limit an address is answered 429
(OpenAI-shaped, with Retry-After) before its key is looked at, so keys cannot be guessed at line speed.

An ASGI wrapper around the proxy app: every 401 the proxy answers (a missing, malformed, unknown, revoked or expired
key; the proxy answers 401 for nothing else) counts against the client's address. Counts live in this process's
memory, no Redis round trip and no database on the hot path, so with P processes an address gets at most P times the
limit. The limit and window are the login throttle's per-address ones (``INFERCAP["LOGIN_THROTTLE"]``), the
address is ``config.client_address`` under REST_FRAMEWORK's NUM_PROXIES (docs/security.md).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from django.conf import settings

from config.client_address import client_address_from
from gateway.proxy.errors import error_body, send_json

GUARDED_PREFIX = "/v1/"  # the authenticated routes; probes and /metrics are left alone


@dataclass
class FailureCounter:
    """Fixed-window failure counts per address, bounded in memory: past ``max_addresses`` the oldest windows go
    first (an attacker who floods it with addresses loses their own counts, not the memory)."""

    limit: int
    window_s: float
    max_addresses: int = 100_000
    clock: Callable[[], float] = time.monotonic
    _windows: dict[str, list[float]] = field(default_factory=dict)  # address -> [window start, failures]

    def blocked_for_s(self, address: str) -> int:
        """Whole seconds until ``address`` may try again; 0 when it may try now."""
        window = self._windows.get(address)
        if window is None or window[1] < self.limit:
            return 0
        left = window[0] + self.window_s - self.clock()
        if left <= 0:
            del self._windows[address]
            return 0
        return max(1, math.ceil(left))

    def failed(self, address: str) -> None:
        now = self.clock()
        window = self._windows.get(address)
        if window is None or now - window[0] >= self.window_s:
            if window is None and len(self._windows) >= self.max_addresses:
                self._evict(now)
            self._windows[address] = [now, 1]
        else:
            window[1] += 1

    def _evict(self, now: float) -> None:
        expired = [a for a, (start, _) in self._windows.items() if now - start >= self.window_s]
        for address in expired or [next(iter(self._windows))]:
            del self._windows[address]


def throttle_failed_authentications(app, *, counter: FailureCounter | None = None, num_proxies: int | None = None):
    """Wrap the proxy's ASGI ``app``; ``counter`` and ``num_proxies`` default to the settings (read on first use)."""
    state: dict = {"counter": counter, "num_proxies": num_proxies}

    def configured() -> tuple[FailureCounter, int]:
        if state["counter"] is None or state["num_proxies"] is None:
            limits = settings.INFERCAP["LOGIN_THROTTLE"]
            if state["counter"] is None:
                state["counter"] = FailureCounter(limit=limits["failures_per_address"], window_s=limits["window_s"])
            if state["num_proxies"] is None:
                state["num_proxies"] = settings.REST_FRAMEWORK.get("NUM_PROXIES") or 0
        return state["counter"], state["num_proxies"]

    async def guarded(scope, receive, send):
        if scope["type"] != "http" or not scope.get("path", "").startswith(GUARDED_PREFIX):
            return await app(scope, receive, send)
        failures, proxies = configured()
        address = _address(scope, proxies)
        wait_s = failures.blocked_for_s(address)
        if wait_s:
            await _refuse(send, wait_s)
            return
        answered = False

        async def watching_send(message):
            nonlocal answered
            if not answered and message["type"] == "http.response.start":
                answered = True
                if message["status"] == 401:
                    failures.failed(address)
            await send(message)

        await app(scope, receive, watching_send)

    return guarded


def _address(scope, num_proxies: int) -> str:
    client = scope.get("client")
    forwarded = [v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"x-forwarded-for"]
    return client_address_from(
        remote_addr=client[0] if client else "",
        forwarded_for=", ".join(forwarded) or None,
        num_proxies=num_proxies,
    )


async def _refuse(send, wait_s: int) -> None:
    body = error_body(
        f"Too many failed authentications from this address; retry after {wait_s} s.",
        type="rate_limit_error",
        code="too_many_failed_authentications",
    )
    await send_json(send, 429, body, [(b"retry-after", str(wait_s).encode())])
