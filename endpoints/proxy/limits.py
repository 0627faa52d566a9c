"""Tenant limits per endpoint, shared by every proxy process through Redis: a token bucket of reserved
MU/min (holding ``burst_minutes`` of the reservation), requests per minute and tokens per minute.

One atomic Lua call checks all of a request's buckets and takes from all or none. A request is charged
its estimated cost up front and corrected by ``settle`` when its real usage is known; a bucket may go
into debt so that a request larger than the whole bucket still runs once the bucket is full.

Leases keep Redis off most requests: when a bucket is large compared with one request, an admitted request
also takes a small extra share of the bucket (5% of it) into a process-local lease that later requests
spend without a round trip, for up to one second. The tokens leave the shared bucket before they are spent
locally, so N processes can never admit more than the limit together; an unspent lease simply lapses
(a slight under-admission). Small limits (an RPM of 4) never lease, so they stay exact.
When Redis cannot be reached, see the fail modes in ``endpoints.proxy`` (package docstring).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)

# KEYS: bucket keys. ARGV: ttl_s, then (capacity, refill_per_s, cost, extra) per key. Returns
# "wait:index" when refused, else "0:0:e1,e2,…" with the extra tokens granted per key for the caller's lease.
# Time comes from Redis so every proxy host agrees.
_TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local ttl = tonumber(ARGV[1])
local wait = 0
local which = 0
local levels = {}
for i, key in ipairs(KEYS) do
  local cap = tonumber(ARGV[2 + (i - 1) * 4])
  local rate = tonumber(ARGV[3 + (i - 1) * 4])
  local cost = tonumber(ARGV[4 + (i - 1) * 4])
  local v = redis.call('HMGET', key, 'tokens', 'ts')
  local tokens = tonumber(v[1])
  local ts = tonumber(v[2])
  if tokens == nil then tokens = cap; ts = now end
  tokens = math.min(cap, tokens + math.max(0, now - ts) * rate)
  levels[i] = tokens
  local need = math.min(cost, cap)
  if tokens < need then
    local w = (need - tokens) / rate
    if w > wait then wait = w; which = i end
  end
end
if wait > 0 then return tostring(wait) .. ':' .. which end
local granted = {}
for i, key in ipairs(KEYS) do
  local cost = tonumber(ARGV[4 + (i - 1) * 4])
  local extra = tonumber(ARGV[5 + (i - 1) * 4])
  extra = math.max(0, math.min(extra, levels[i] - cost))
  granted[i] = tostring(extra)
  redis.call('HSET', key, 'tokens', levels[i] - cost - extra, 'ts', now)
  redis.call('EXPIRE', key, ttl)
end
return '0:0:' .. table.concat(granted, ',')
"""

# KEYS: bucket keys. ARGV: capacity, delta per key (positive = refund). Keeps the bucket at or below capacity.
_SETTLE = """
for i, key in ipairs(KEYS) do
  local cap = tonumber(ARGV[(i - 1) * 2 + 1])
  local delta = tonumber(ARGV[(i - 1) * 2 + 2])
  if redis.call('EXISTS', key) == 1 then
    local tokens = tonumber(redis.call('HGET', key, 'tokens')) + delta
    if tokens > cap then tokens = cap end
    redis.call('HSET', key, 'tokens', tokens)
  end
end
return 1
"""


@dataclass(frozen=True)
class Bucket:
    """One limit: ``capacity`` units, refilled at ``refill_per_s``; ``cost`` is what this request takes."""

    name: str  # mu, rpm, tpm
    capacity: float
    refill_per_s: float
    cost: float


def buckets_for(*, reservation, mu: float, tokens: int) -> list[Bucket]:
    """The buckets a request must pass. No reservation = best effort: no reserved MU to enforce."""
    if reservation is None:
        return []
    out = []
    if reservation.mu_per_min > 0:
        cap = max(reservation.mu_per_min * max(reservation.burst_minutes, 1 / 60), 1e-6)
        out.append(Bucket("mu", cap, reservation.mu_per_min / 60.0, mu))
    if reservation.rpm_limit:
        out.append(Bucket("rpm", float(reservation.rpm_limit), reservation.rpm_limit / 60.0, 1.0))
    if reservation.tpm_limit:
        out.append(Bucket("tpm", float(reservation.tpm_limit), reservation.tpm_limit / 60.0, float(tokens)))
    return out


class LimiterUnavailable(Exception):
    """Redis is down and the fail mode is "closed"."""


class LocalBuckets:
    """The same arithmetic as the Lua script, in process memory (fallback when Redis is down, and tests)."""

    def __init__(self, clock=time.monotonic) -> None:
        self._clock = clock
        self._state: dict[str, tuple[float, float]] = {}

    def take(self, keys: list[str], buckets: list[Bucket]) -> tuple[float, str]:
        now = self._clock()
        levels, wait, which = [], 0.0, ""
        for key, b in zip(keys, buckets, strict=True):
            tokens, ts = self._state.get(key, (b.capacity, now))
            tokens = min(b.capacity, tokens + max(0.0, now - ts) * b.refill_per_s)
            levels.append(tokens)
            need = min(b.cost, b.capacity)
            if tokens < need:
                w = (need - tokens) / b.refill_per_s
                if w > wait:
                    wait, which = w, b.name
        if wait > 0:
            return wait, which
        for key, b, tokens in zip(keys, buckets, levels, strict=True):
            self._state[key] = (tokens - b.cost, now)
        return 0.0, ""

    def settle(self, keys: list[str], caps: list[float], deltas: list[float]) -> None:
        for key, cap, delta in zip(keys, caps, deltas, strict=True):
            if key in self._state:
                tokens, ts = self._state[key]
                self._state[key] = (min(cap, tokens + delta), ts)


LEASE_FRACTION = 0.05  # of a bucket's capacity, taken into a local lease with an admitted request
LEASE_MIN_REQUESTS = 4  # lease only when the share covers at least this many requests like the current one
LEASE_TTL_S = 1.0


class RateLimiter:
    """Async limiter over a ``redis.asyncio`` client (or None = local only)."""

    def __init__(
        self, redis_client, *, fail_mode: str = "open", breaker_s: float = 1.0, lease_fraction: float = LEASE_FRACTION
    ) -> None:
        self._redis = redis_client
        self.lease_fraction = lease_fraction
        self._leases: dict[str, list[float]] = {}  # key → [tokens, expires_at (monotonic)]
        self.redis_calls = 0
        self.fail_mode = fail_mode
        self._breaker_s = breaker_s
        self._down_until = 0.0
        self._local = LocalBuckets()
        self._take = redis_client.register_script(_TAKE) if redis_client is not None else None
        self._settle = redis_client.register_script(_SETTLE) if redis_client is not None else None
        self.redis_failures = 0

    @staticmethod
    def keys(tenant_id: int, endpoint_id: int, buckets: list[Bucket]) -> list[str]:
        return [f"infercap:rl:{tenant_id}:{endpoint_id}:{b.name}" for b in buckets]

    def _redis_usable(self) -> bool:
        return self._redis is not None and time.monotonic() >= self._down_until

    def _trip(self, exc: Exception) -> None:
        self.redis_failures += 1
        self._down_until = time.monotonic() + self._breaker_s
        log.warning("rate limiter: Redis unreachable (%s); fail mode %s", exc, self.fail_mode)

    async def acquire(self, *, tenant_id: int, endpoint_id: int, buckets: list[Bucket]) -> tuple[float, str]:
        """Return (0, "") when admitted, else (seconds to wait, the name of the limiting bucket)."""
        if not buckets:
            return 0.0, ""
        keys = self.keys(tenant_id, endpoint_id, buckets)
        if self._redis_usable():
            now = time.monotonic()
            leases = [self._leases.get(k) for k in keys]
            live = [lease[0] if lease is not None and lease[1] > now else 0.0 for lease in leases]
            if all(have >= b.cost for have, b in zip(live, buckets, strict=True)):
                for lease, b in zip(leases, buckets, strict=True):
                    lease[0] -= b.cost
                return 0.0, ""
            # Spend what the leases hold and charge the rest to Redis, topping the leases up on the way.
            ttl = int(max(b.capacity / b.refill_per_s for b in buckets)) + 60
            args: list = [ttl]
            for have, b in zip(live, buckets, strict=True):
                share = self.lease_fraction * b.capacity
                extra = share if share >= LEASE_MIN_REQUESTS * b.cost else 0.0
                args += [repr(b.capacity), repr(b.refill_per_s), repr(max(0.0, b.cost - have)), repr(extra)]
            try:
                self.redis_calls += 1
                raw = await self._take(keys=keys, args=args)
            except Exception as exc:  # noqa: BLE001 - any Redis failure is handled by the fail mode
                self._trip(exc)
            else:
                wait_s, _, rest = (raw.decode() if isinstance(raw, bytes) else raw).partition(":")
                wait = float(wait_s)
                idx, _, extras = rest.partition(":")
                if wait > 0:
                    return wait, buckets[int(idx) - 1].name
                now = time.monotonic()
                for key, have, b, extra in zip(keys, live, buckets, extras.split(","), strict=True):
                    left = max(0.0, have - b.cost) + float(extra)
                    if left > 0:
                        self._leases[key] = [left, now + LEASE_TTL_S]
                    else:
                        self._leases.pop(key, None)  # no lease: corrections of this request go to Redis
                return 0.0, ""
        elif self._redis is None:
            return self._local.take(keys, buckets)
        if self.fail_mode == "closed":
            raise LimiterUnavailable("rate limiter unavailable")
        return self._local.take(keys, buckets)

    async def settle(
        self, *, tenant_id: int, endpoint_id: int, buckets: list[Bucket], actual: dict[str, float]
    ) -> None:
        """Refund or charge the difference between the estimated and the real cost."""
        chosen = [b for b in buckets if b.name in actual and not math.isclose(actual[b.name], b.cost)]
        if not chosen:
            return
        keys = self.keys(tenant_id, endpoint_id, chosen)
        deltas = [b.cost - actual[b.name] for b in chosen]
        caps = [b.capacity for b in chosen]
        self._local.settle(keys, caps, deltas)
        # Where this process holds a live lease the correction stays local (the tokens are already ours);
        # a lease left in debt makes the next Redis call charge the difference.
        now = time.monotonic()
        remote = []
        for key, cap, delta in zip(keys, caps, deltas, strict=True):
            lease = self._leases.get(key)
            if lease is not None and lease[1] > now:
                lease[0] = min(cap, lease[0] + delta)
            else:
                remote.append((key, cap, delta))
        if not remote:
            return
        keys, caps, deltas = [k for k, _, _ in remote], [c for _, c, _ in remote], [d for _, _, d in remote]
        if self._redis_usable():
            args: list = []
            for cap, d in zip(caps, deltas, strict=True):
                args += [repr(cap), repr(d)]
            try:
                await self._settle(keys=keys, args=args)
            except Exception as exc:  # noqa: BLE001
                self._trip(exc)


def retry_after_from_wait(wait_s: float) -> int:
    return max(1, min(3600, math.ceil(wait_s)))
