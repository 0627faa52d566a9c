"""Dollar budgets that cap: an API key's per day or month, a tenant's per month with a hard stop
(docs/security.md, "Budgets").

Spend is the MU a request used priced at the usage rate (``billing.statements.prices``: the overage price per
1,000 MU), added after each metered request to one Redis counter per key and period, and per tenant and month, so
every proxy process counts the same spend. The hot path makes no Redis round trip: each process checks the
counters it read within the last ``REFRESH_S`` and refreshes a stale one in the background, so a budget overshoots
by at most what the fleet's proxies serve in about a second. A counter Redis lost (a restart) is seeded again from
the usage records by ``billing.budgets.budget_counters_sync`` (every minute); until then it reads from zero.
"""

from __future__ import annotations

import calendar
import logging
import time
from datetime import UTC, datetime

from gateway.proxy.errors import ProxyError
from gateway.proxy.snapshot import KeyInfo

log = logging.getLogger(__name__)

REFRESH_S = 1.0
COUNTER_TTL_S = 40 * 86400  # a month and a margin: an ended period's counter expires on its own


def period_label(period: str, now: float) -> str:
    """The UTC day (``2026-12-06``) or month (``2026-12``) a spend counter covers."""
    at = datetime.fromtimestamp(now, tz=UTC)
    return f"{at:%Y-%m-%d}" if period == "day" else f"{at:%Y-%m}"


def seconds_left(period: str, now: float) -> int:
    """Seconds until the period ends (the counter starts again from zero): the refusal's Retry-After."""
    at = datetime.fromtimestamp(now, tz=UTC)
    if period == "day":
        end = datetime(at.year, at.month, at.day, tzinfo=UTC).timestamp() + 86400
    else:
        days = calendar.monthrange(at.year, at.month)[1]
        end = datetime(at.year, at.month, 1, tzinfo=UTC).timestamp() + days * 86400
    return max(1, int(end - now + 0.999))


def spend_key(kind: str, ident: int, label: str) -> str:
    return f"infercap:spend:{kind}:{ident}:{label}"


class Budgets:
    def __init__(self, redis, *, usd_per_mu: float, spawn, clock=time.time, refresh_s: float = REFRESH_S):
        """``spawn``: runs a background read (``ProxyState.spawn``: fire and forget, referenced until done)."""
        self._redis = redis
        self.usd_per_mu = usd_per_mu
        self._clock = clock
        self._refresh_s = refresh_s
        self._spawn = spawn
        self._seen: dict[str, tuple[float, float]] = {}  # counter → (USD spent, when read)
        self._reading: set[str] = set()

    def check(self, key: KeyInfo) -> None:
        """Refuse with 429 ``budget_exceeded`` when the key's or its tenant's budget is spent."""
        now = self._clock()
        if key.budget_usd is not None:
            counter = spend_key("key", key.id, period_label(key.budget_period, now))
            if self._spent(counter, now) >= key.budget_usd:
                whose = f"This API key's {'daily' if key.budget_period == 'day' else 'monthly'} budget"
                raise _refusal(whose, key.budget_usd, key.budget_period, now)
        if key.tenant_budget_usd is not None:
            counter = spend_key("tenant", key.tenant_id, period_label("month", now))
            if self._spent(counter, now) >= key.tenant_budget_usd:
                raise _refusal("Your organisation's monthly budget", key.tenant_budget_usd, "month", now)

    def counters(self, key: KeyInfo, now: float) -> list[str]:
        """The counters a request of this key adds its spend to (none without a budget)."""
        out = []
        if key.budget_usd is not None:
            out.append(spend_key("key", key.id, period_label(key.budget_period, now)))
        if key.tenant_budget_usd is not None:
            out.append(spend_key("tenant", key.tenant_id, period_label("month", now)))
        return out

    async def add(self, key: KeyInfo, mu: float) -> None:
        """Add a metered request's spend to its counters (fire and forget, off the request path)."""
        usd = mu * self.usd_per_mu
        now = self._clock()
        counters = self.counters(key, now)
        if usd <= 0 or not counters or self._redis is None:
            return
        try:
            pipe = self._redis.pipeline(transaction=False)
            for counter in counters:
                pipe.incrbyfloat(counter, usd)
                pipe.expire(counter, COUNTER_TTL_S)
            results = await pipe.execute()
        except Exception as exc:  # noqa: BLE001 - Redis down: the minute's sync from the usage records catches up
            log.warning("budgets: spend not counted in Redis (%s)", exc)
            return
        for counter, total in zip(counters, results[::2], strict=True):
            self._seen[counter] = (float(total), now)  # this process's view is fresh after its own write

    def _spent(self, counter: str, now: float) -> float:
        spent, read_at = self._seen.get(counter, (0.0, float("-inf")))
        if now - read_at > self._refresh_s and counter not in self._reading and self._redis is not None:
            self._reading.add(counter)
            self._spawn(self._read(counter))
        return spent

    async def _read(self, counter: str) -> None:
        try:
            value = await self._redis.get(counter)
            self._seen[counter] = (float(value or 0.0), self._clock())
        except Exception as exc:  # noqa: BLE001 - keep the last value; the next check tries again
            log.warning("budgets: cannot read %s (%s)", counter, exc)
        finally:
            self._reading.discard(counter)


def _refusal(whose: str, budget: float, period: str, now: float) -> ProxyError:
    return ProxyError(
        429,
        f"{whose} of ${budget:,.2f} is spent; requests resume when the {period} ends (UTC) or the budget is raised.",
        type="insufficient_quota",
        code="budget_exceeded",
        retry_after=seconds_left(period, now),
        usage_status="rate_limited",  # metered as a limit's refusal, as a bucket's is
    )
