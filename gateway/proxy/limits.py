"""Tenant limits per endpoint, shared by every proxy process through Redis: a token bucket of reserved
MU/min (holding ``burst_minutes`` of the reservation), requests per minute and tokens per minute.

One atomic Lua call checks all of a request's buckets and takes from all or none. A request is charged
its estimated cost up front and corrected by ``settle`` when its real usage is known; a bucket may go
into debt so that a request larger than the whole bucket still runs once the bucket is full.

Leases keep Redis off the request path: when a bucket is large compared with one request, an admitted request
also takes a small share of the bucket (5% of it) into a process-local lease that later requests spend without
a round trip. The tokens leave the shared bucket before they are spent locally, so N processes can never admit
more than the limit together. A lease lives ``LEASE_TTL_S`` (1 s); while requests keep spending it, it is topped
up in the background when it runs low or nears its end, so a busy tenant's requests do not wait for Redis at
all. Whatever a lease still holds when it lapses (and every correction ``settle`` made to it) goes back to the
shared bucket: with the next call for that bucket, or from ``sweep`` (the proxy calls it every 0.25 s). So
leases never drain a bucket that nobody uses; at any moment a process holds at most 5% of each bucket it
serves, which other processes cannot use until it comes back. Small limits (an RPM of 4) never lease, so they
stay exact.
When Redis cannot be reached, see the fail modes in ``gateway.proxy`` (package docstring).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)

# KEYS: bucket keys. ARGV: ttl_s, then (capacity, refill_per_s, cost, extra, back) per key: ``back`` is what a
# lapsed lease returns (negative: a debt it ran up). Returns "wait:index" when refused, else "0:0:e1,e2,…" with
# the extra tokens granted per key for the caller's lease. Returned tokens land in either case.
# Time comes from Redis so every proxy host agrees.
_TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local ttl = tonumber(ARGV[1])
local wait = 0
local which = 0
local levels = {}
for i, key in ipairs(KEYS) do
  local cap = tonumber(ARGV[2 + (i - 1) * 5])
  local rate = tonumber(ARGV[3 + (i - 1) * 5])
  local cost = tonumber(ARGV[4 + (i - 1) * 5])
  local back = tonumber(ARGV[6 + (i - 1) * 5])
  local v = redis.call('HMGET', key, 'tokens', 'ts')
  local tokens = tonumber(v[1])
  local ts = tonumber(v[2])
  if tokens == nil then tokens = cap; ts = now end
  tokens = math.min(cap, tokens + math.max(0, now - ts) * rate + back)
  levels[i] = tokens
  local need = math.min(cost, cap)
  if tokens < need then
    local w = (need - tokens) / rate
    if w > wait then wait = w; which = i end
  end
end
if wait > 0 then
  for i, key in ipairs(KEYS) do
    redis.call('HSET', key, 'tokens', levels[i], 'ts', now)
    redis.call('EXPIRE', key, ttl)
  end
  return tostring(wait) .. ':' .. which
end
local granted = {}
for i, key in ipairs(KEYS) do
  local cost = tonumber(ARGV[4 + (i - 1) * 5])
  local extra = tonumber(ARGV[5 + (i - 1) * 5])
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
    # Whose bucket among the tenant's on the endpoint: "" for its base-model reservation (or best effort),
    # "adapter<id>" for a LoRA adapter's reservation, so the two never share tokens; "key:<id>" for an API key's own.
    scope: str = ""

    @property
    def label(self) -> str:
        """The limit's name as a refusal states it: ``rpm``, or ``key rpm`` for the API key's own."""
        return f"key {self.name}" if self.scope.startswith("key:") else self.name


BEST_EFFORT_BURST_MINUTES = 1.0


def buckets_for(*, reservation, mu: float, tokens: int, best_effort_mu_per_min: float = 0.0) -> list[Bucket]:
    """The buckets a request must pass. No reservation = best effort: nothing reserved to enforce, but a cap per
    tenant (``best_effort_mu_per_min``, 0 = none) so one tenant cannot take all the capacity nobody reserved."""
    if reservation is None:
        if best_effort_mu_per_min <= 0:
            return []
        cap = best_effort_mu_per_min * BEST_EFFORT_BURST_MINUTES
        return [Bucket("best_effort_mu", cap, best_effort_mu_per_min / 60.0, mu)]
    out = []
    adapter_id = getattr(reservation, "adapter_id", None)
    scope = f"adapter{adapter_id}" if adapter_id is not None else ""
    if reservation.mu_per_min > 0:
        cap = max(reservation.mu_per_min * max(reservation.burst_minutes, 1 / 60), 1e-6)
        out.append(Bucket("mu", cap, reservation.mu_per_min / 60.0, mu, scope))
    if reservation.rpm_limit:
        out.append(Bucket("rpm", float(reservation.rpm_limit), reservation.rpm_limit / 60.0, 1.0, scope))
    if reservation.tpm_limit:
        out.append(Bucket("tpm", float(reservation.tpm_limit), reservation.tpm_limit / 60.0, float(tokens), scope))
    return out


def key_buckets(key, *, mu: float, tokens: int) -> list[Bucket]:
    """The API key's own limits (docs/security.md, "Per-key controls"), taken with the tenant's buckets, all or
    none: a minute's worth of burst each, like a reservation's, and scoped to the key across every endpoint."""
    scope = f"key:{key.id}"
    out = []
    if key.mu_per_min_limit:
        out.append(Bucket("mu", float(key.mu_per_min_limit), key.mu_per_min_limit / 60.0, mu, scope))
    if key.rpm_limit:
        out.append(Bucket("rpm", float(key.rpm_limit), key.rpm_limit / 60.0, 1.0, scope))
    if key.tpm_limit:
        out.append(Bucket("tpm", float(key.tpm_limit), key.tpm_limit / 60.0, float(tokens), scope))
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
                    wait, which = w, b.label
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
LEASE_REFILL_BELOW = 0.25  # top a lease up in the background below this part of its share or of its lifetime


class _Lease:
    __slots__ = ("tokens", "expires_at", "share", "capacity", "refilling")

    def __init__(self, tokens: float, expires_at: float, share: float, capacity: float) -> None:
        self.tokens = tokens  # may go negative: corrections (settle) of requests served from it
        self.expires_at = expires_at
        self.share = share
        self.capacity = capacity  # the bucket's
        self.refilling = False


class RateLimiter:
    """Async limiter over a ``redis.asyncio`` client (or None = local only)."""

    def __init__(
        self,
        redis_client,
        *,
        fail_mode: str = "open",
        breaker_s: float = 1.0,
        lease_fraction: float = LEASE_FRACTION,
        lease_ttl_s: float = LEASE_TTL_S,
        clock=time.monotonic,
    ) -> None:
        self._redis = redis_client
        self.lease_fraction = lease_fraction
        self.lease_ttl_s = lease_ttl_s
        self._clock = clock
        self._leases: dict[str, _Lease] = {}
        self._refills: set[asyncio.Task] = set()
        self.redis_calls = 0  # every script call
        self.blocking_calls = 0  # those a request waited for
        self.fail_mode = fail_mode
        self._breaker_s = breaker_s
        self._down_until = 0.0
        self._local = LocalBuckets()
        self._take = redis_client.register_script(_TAKE) if redis_client is not None else None
        self._settle = redis_client.register_script(_SETTLE) if redis_client is not None else None
        self.redis_failures = 0

    @staticmethod
    def keys(tenant_id: int, endpoint_id: int, buckets: list[Bucket]) -> list[str]:
        prefix = f"infercap:rl:{tenant_id}:{endpoint_id}:"
        # A key's own buckets ("key:<id>") are one across every endpoint the key calls.
        return [
            f"infercap:rl:{b.scope}:{b.name}"
            if b.scope.startswith("key:")
            else (f"{prefix}{b.scope}:{b.name}" if b.scope else f"{prefix}{b.name}")
            for b in buckets
        ]

    def _redis_usable(self) -> bool:
        return self._redis is not None and time.monotonic() >= self._down_until

    def _trip(self, exc: Exception) -> None:
        self.redis_failures += 1
        self._down_until = time.monotonic() + self._breaker_s
        log.warning("rate limiter: Redis unreachable (%s); fail mode %s", exc, self.fail_mode)

    def _share(self, b: Bucket) -> float:
        share = self.lease_fraction * b.capacity
        return share if share >= LEASE_MIN_REQUESTS * b.cost else 0.0

    async def acquire(self, *, tenant_id: int, endpoint_id: int, buckets: list[Bucket]) -> tuple[float, str]:
        """Return (0, "") when admitted, else (seconds to wait, the name of the limiting bucket)."""
        if not buckets:
            return 0.0, ""
        keys = self.keys(tenant_id, endpoint_id, buckets)
        if self._redis_usable():
            now = self._clock()
            leases = [self._leases.get(k) for k in keys]
            if all(
                lease is not None and lease.expires_at > now and lease.tokens >= b.cost
                for lease, b in zip(leases, buckets, strict=True)
            ):
                low = False
                for lease, b in zip(leases, buckets, strict=True):
                    lease.tokens -= b.cost
                    low = low or (
                        not lease.refilling
                        and (
                            lease.tokens < LEASE_REFILL_BELOW * lease.share
                            or lease.expires_at - now < LEASE_REFILL_BELOW * self.lease_ttl_s
                        )
                    )
                if low:
                    self._refill_soon(keys, buckets)
                return 0.0, ""
            return await self._acquire_remote(keys, buckets, now)
        elif self._redis is None:
            return self._local.take(keys, buckets)
        if self.fail_mode == "closed":
            raise LimiterUnavailable("rate limiter unavailable")
        return self._local.take(keys, buckets)

    def _detach(self, keys: list[str], buckets: list[Bucket], now: float, cost_of) -> tuple[list, list, list]:
        """Per key: what the caller still needs from Redis, and what a lapsed lease gives back (or owes).
        The leases are emptied now (before the await), so concurrent requests never spend the same tokens."""
        need, back, taken = [], [], []
        for key, b in zip(keys, buckets, strict=True):
            lease = self._leases.get(key)
            cost = cost_of(b)
            if lease is None:
                need.append(cost)
                back.append(0.0)
                taken.append(None)
            elif lease.expires_at > now:
                have = lease.tokens
                use = min(max(have, 0.0), cost) if have >= 0 else have  # a live debt is paid with this call
                lease.tokens -= use
                need.append(cost - use)
                back.append(0.0)
                taken.append((lease, use))
            else:
                del self._leases[key]
                need.append(cost)
                back.append(lease.tokens)
                taken.append(None)
        return need, back, taken

    async def _acquire_remote(self, keys: list[str], buckets: list[Bucket], now: float) -> tuple[float, str]:
        need, back, taken = self._detach(keys, buckets, now, lambda b: b.cost)
        raw = await self._call_take(keys, buckets, need, [self._share(b) for b in buckets], back)
        if raw is None:  # Redis failed: give the live leases' tokens back, apply the fail mode
            self._restore(taken)
            self._restore_lapsed(keys, buckets, back)
            if self.fail_mode == "closed":
                raise LimiterUnavailable("rate limiter unavailable")
            return self._local.take(keys, buckets)
        self.blocking_calls += 1
        wait_s, _, rest = raw.partition(":")
        wait = float(wait_s)
        idx, _, extras = rest.partition(":")
        if wait > 0:
            self._restore(taken)  # nothing was charged; the lapsed leases did land in the bucket
            return wait, buckets[int(idx) - 1].label
        self._grant(keys, buckets, [float(x) for x in extras.split(",")])
        return 0.0, ""

    async def _call_take(self, keys, buckets, costs, extras, backs) -> str | None:
        ttl = int(max(b.capacity / b.refill_per_s for b in buckets)) + 60
        args: list = [ttl]
        for b, cost, extra, back in zip(buckets, costs, extras, backs, strict=True):
            args += [repr(b.capacity), repr(b.refill_per_s), repr(max(0.0, cost)), repr(extra), repr(back)]
        try:
            self.redis_calls += 1
            raw = await self._take(keys=keys, args=args)
        except Exception as exc:  # noqa: BLE001 - any Redis failure is handled by the fail mode
            self._trip(exc)
            return None
        return raw.decode() if isinstance(raw, bytes) else raw

    def _grant(self, keys: list[str], buckets: list[Bucket], extras: list[float]) -> None:
        expires = self._clock() + self.lease_ttl_s
        for key, b, extra in zip(keys, buckets, extras, strict=True):
            lease = self._leases.get(key)
            if lease is None:
                if extra > 0:
                    self._leases[key] = _Lease(extra, expires, self._share(b), b.capacity)
                continue
            lease.tokens += extra
            lease.expires_at = expires

    @staticmethod
    def _restore(taken: list) -> None:
        for item in taken:
            if item is not None:
                lease, use = item
                lease.tokens += use

    def _restore_lapsed(self, keys: list[str], buckets: list[Bucket], back: list[float]) -> None:
        for key, b, tokens in zip(keys, buckets, back, strict=True):
            if tokens and key not in self._leases:
                self._leases[key] = _Lease(tokens, 0.0, self._share(b), b.capacity)  # lapsed: returned later

    def _refill_soon(self, keys: list[str], buckets: list[Bucket]) -> None:
        leases = [self._leases[k] for k in keys]
        for lease in leases:
            lease.refilling = True

        async def refill() -> None:
            try:
                # Cost 0: never refused; takes what brings each lease back to its share (less if the bucket is low).
                extras = [max(0.0, lease.share - lease.tokens) for lease in leases]
                raw = await self._call_take(keys, buckets, [0.0] * len(keys), extras, [0.0] * len(keys))
                if raw is not None and raw.startswith("0:0:"):
                    self._grant(keys, buckets, [float(x) for x in raw[4:].split(",")])
            finally:
                for lease in leases:
                    lease.refilling = False

        task = asyncio.get_running_loop().create_task(refill())
        self._refills.add(task)
        task.add_done_callback(self._refills.discard)

    async def sweep(self) -> None:
        """Give the tokens of lapsed leases back to the shared buckets (the proxy calls this periodically)."""
        if not self._redis_usable():
            return
        now = self._clock()
        lapsed = [(k, lease) for k, lease in self._leases.items() if lease.expires_at <= now and not lease.refilling]
        if not lapsed:
            return
        for key, _ in lapsed:
            del self._leases[key]
        returned = [(k, lease) for k, lease in lapsed if lease.tokens]
        if not returned:
            return
        args: list = []
        for _, lease in returned:
            args += [repr(lease.capacity), repr(lease.tokens)]
        try:
            self.redis_calls += 1
            await self._settle(keys=[k for k, _ in returned], args=args)
        except Exception as exc:  # noqa: BLE001 - keep them for the next try
            self._trip(exc)
            for key, lease in returned:
                self._leases.setdefault(key, lease)

    def leased(self, key: str) -> float:
        """Tokens this process holds for ``key`` (tests and diagnostics)."""
        lease = self._leases.get(key)
        return lease.tokens if lease is not None else 0.0

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
        # Where this process holds a lease (live or lapsed) the correction stays local and reaches the shared
        # bucket with the lease's next call or sweep: no Redis call per request.
        remote = []
        for key, cap, delta in zip(keys, caps, deltas, strict=True):
            lease = self._leases.get(key)
            if lease is not None:
                lease.tokens = min(cap, lease.tokens + delta)
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
                self.redis_calls += 1
                await self._settle(keys=keys, args=args)
            except Exception as exc:  # noqa: BLE001
                self._trip(exc)


def retry_after_from_wait(wait_s: float) -> int:
    return max(1, min(3600, math.ceil(wait_s)))
