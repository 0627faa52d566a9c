"""Shared state of the control loops in Redis: demand reports, the demand window, histogram snapshots, tick locks.

Without ``REDIS_URL`` (the embedded default: one process) an in-memory stand-in keeps the same interface.
"""

import json
import threading
import time
import uuid

import redis
from django.conf import settings

DEMAND_KEY = "infercap:demand:{endpoint_id}"  # written by every proxy process, one field per process
SAMPLES_KEY = "infercap:autoscale:samples:{endpoint_id}"
ARRIVALS_SEEN_KEY = "infercap:autoscale:arrivals-seen:{endpoint_id}"  # each proxy's arrival counters, last sample
PREFILL_SAMPLES_KEY = "infercap:autoscale:prefill-samples:{endpoint_id}"  # the prefill pool's prompt-token rate
PREFILL_COUNTER_KEY = "infercap:autoscale:prefill-counter:{replica_id}"  # a prefill replica's last counter read
HIST_KEY = "infercap:autoscale:hist:{replica_id}"
LOCK_KEY = "infercap:autoscale:lock:{axis}:{endpoint_id}"
WAKE_KEY = "infercap:activator:{endpoint_id}"
SPOT_UNAVAILABLE_KEY = "infercap:autoscale:spot-unavailable:{endpoint_id}"  # a spot launch was refused: back off
FLEET_LAUNCHES_KEY = "infercap:autoscale:launches:{slot}"  # replicas launched fleet-wide in one tick window
PROXY_MEMBERS_KEY = "infercap:proxy:members"  # gateway.proxy.state.MEMBERS_KEY: each proxy's heartbeat
PROXY_ALIVE_S = 5.0  # a proxy heartbeats every 0.25 s (stamped with Redis' clock)
# The 5-minute scale-down window: one sample per second from the sampler plus one per 5 s tick is 360 in 300 s (330
# kept only the last 275 s, so a peak 4½ minutes old was forgotten early), plus margin for activator wake-ups.
SAMPLES_KEPT = 420

try:
    from redis.exceptions import RedisError
except ImportError:  # pragma: no cover - redis is a dependency; the in-memory store never raises it

    class RedisError(Exception):
        pass


_client = None
_client_lock = threading.Lock()


class _MemoryStore:
    """Just enough of redis-py for one process."""

    def __init__(self) -> None:
        self.data: dict = {}
        self.expiry: dict = {}
        self.lock = threading.Lock()

    def _live(self, key):
        if key in self.expiry and self.expiry[key] < time.monotonic():
            self.data.pop(key, None)
            self.expiry.pop(key, None)
        return self.data.get(key)

    def set(self, key, value, nx=False, ex=None):
        with self.lock:
            if nx and self._live(key) is not None:
                return None
            self.data[key] = value if isinstance(value, bytes) else str(value).encode()
            if ex:
                self.expiry[key] = time.monotonic() + ex
            return True

    def get(self, key):
        with self.lock:
            return self._live(key)

    def mget(self, keys):
        with self.lock:
            return [self._live(key) for key in keys]

    def time(self):
        now = time.time()
        return int(now), int((now % 1) * 1e6)

    def delete(self, key):
        with self.lock:
            self.data.pop(key, None)

    def hgetall(self, key):
        with self.lock:
            return dict(self._live(key) or {})

    def hset(self, key, field, value):
        with self.lock:
            self.data.setdefault(key, {})[field.encode() if isinstance(field, str) else field] = (
                value.encode() if isinstance(value, str) else value
            )

    def rpush(self, key, value):
        with self.lock:
            self.data.setdefault(key, []).append(value.encode() if isinstance(value, str) else value)

    def ltrim(self, key, start, end):
        with self.lock:
            items = self.data.get(key, [])
            self.data[key] = items[start:] if end == -1 else items[start : end + 1]

    def lrange(self, key, start, end):
        with self.lock:
            items = self.data.get(key, [])
            return items[start:] if end == -1 else items[start : end + 1]

    def incrby(self, key, amount):
        with self.lock:
            value = int(self._live(key) or 0) + amount
            self.data[key] = str(value).encode()
            return value

    def expire(self, key, seconds):
        with self.lock:
            self.expiry[key] = time.monotonic() + seconds
            return True

    def eval(self, script, numkeys, key, token):  # only the compare-and-delete below
        with self.lock:
            if self._live(key) == token.encode():
                self.data.pop(key, None)
                return 1
            return 0

    def pipeline(self, transaction=True):
        return _MemoryPipeline(self)


class _MemoryPipeline:
    """redis-py's pipeline over the in-memory store: the calls queue up and run in order at ``execute``."""

    def __init__(self, store: _MemoryStore) -> None:
        self.store = store
        self.calls: list = []

    def __getattr__(self, name):
        method = getattr(self.store, name)

        def queue(*args, **kwargs):
            self.calls.append((method, args, kwargs))
            return self

        return queue

    def execute(self):
        calls, self.calls = self.calls, []
        return [method(*args, **kwargs) for method, args, kwargs in calls]


def client():
    global _client
    with _client_lock:
        if _client is None:
            if settings.REDIS_URL:
                _client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1, socket_timeout=2)
            else:
                _client = _MemoryStore()
        return _client


def reset_client() -> None:
    global _client
    with _client_lock:
        _client = None


_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"


def release_lock(redis_client, key: str, token: str, *, attempts: int = 3) -> bool:
    """Delete ``key`` only while it still holds ``token`` (a lock that expired and was taken by another holder
    stays theirs), trying again after an error: one slow reply on a busy host (a socket timeout) must not leave
    the lock to block every later holder until its TTL. False when every attempt failed (the TTL frees it)."""
    for attempt in range(attempts):
        try:
            redis_client.eval(_RELEASE, 1, key, token)
            return True
        except RedisError:
            if attempt < attempts - 1:
                time.sleep(0.1 * (attempt + 1))
    return False


# Many keys in one command: redis-py packs each command of a pipeline and parses its reply in Python (10-15 µs
# a command), a script's arguments in C. The keys of a batch (a vertical tick's snapshots, its locks) take one.
_SET_EACH = "for i, key in ipairs(KEYS) do redis.call('set', key, ARGV[i + 1], 'ex', ARGV[1]) end return #KEYS"
_TAKE_EACH = (
    "local taken = {} for i, key in ipairs(KEYS) do "
    "taken[i] = redis.call('set', key, ARGV[i + 1], 'nx', 'ex', ARGV[1]) and 1 or 0 end return taken"
)
_RELEASE_EACH = (
    "local n = 0 for i, key in ipairs(KEYS) do "
    "if redis.call('get', key) == ARGV[i] then n = n + redis.call('del', key) end end return n"
)


def set_many(values: dict[str, bytes | str], *, ttl_s: int) -> None:
    """``SET key value EX ttl_s`` for every item, in one command."""
    if not values:
        return
    c = client()
    if isinstance(c, _MemoryStore):
        for key, value in values.items():
            c.set(key, value, ex=ttl_s)
        return
    c.eval(_SET_EACH, len(values), *values, int(ttl_s), *values.values())


class TickLock:
    """One holder per (axis, endpoint) at a time across every worker; released only by its holder."""

    def __init__(self, *, axis: str, endpoint_id: int, ttl_s: int = 60) -> None:
        self.key = LOCK_KEY.format(axis=axis, endpoint_id=endpoint_id)
        self.token = uuid.uuid4().hex
        self.ttl_s = ttl_s
        self.held = False

    def __enter__(self) -> "TickLock":
        self.held = bool(client().set(self.key, self.token, nx=True, ex=self.ttl_s))
        return self

    def __exit__(self, *exc) -> None:
        if self.held:
            release_lock(client(), self.key, self.token)  # else the TTL frees it; the tick's outcome is what matters


class TickLocks:
    """``TickLock`` for a batch of endpoints, taken and released in one round trip each; ``held``: the endpoints
    whose lock this holder took (another worker ticks the rest)."""

    def __init__(self, *, axis: str, endpoint_ids, ttl_s: int = 60) -> None:
        self.locks = {pk: TickLock(axis=axis, endpoint_id=pk, ttl_s=ttl_s) for pk in endpoint_ids}
        self.held: list[int] = []

    def __enter__(self) -> "TickLocks":
        if not self.locks:
            return self
        c, locks = client(), list(self.locks.values())
        if isinstance(c, _MemoryStore):
            pipe = c.pipeline(transaction=False)
            for lock in locks:
                pipe.set(lock.key, lock.token, nx=True, ex=lock.ttl_s)
            taken = pipe.execute()
        else:
            keys, tokens = [lock.key for lock in locks], [lock.token for lock in locks]
            taken = c.eval(_TAKE_EACH, len(locks), *keys, locks[0].ttl_s, *tokens)  # one TTL for the batch
        for (pk, lock), took in zip(self.locks.items(), taken, strict=True):
            lock.held = bool(took)
            if lock.held:
                self.held.append(pk)
        return self

    def __exit__(self, *exc) -> None:
        held = [self.locks[pk] for pk in self.held]
        if not held:
            return
        c = client()
        try:
            if isinstance(c, _MemoryStore):
                pipe = c.pipeline(transaction=False)
                for lock in held:
                    pipe.eval(_RELEASE, 1, lock.key, lock.token)
                pipe.execute()
            else:
                c.eval(_RELEASE_EACH, len(held), *(lock.key for lock in held), *(lock.token for lock in held))
        except RedisError:
            for lock in held:  # one at a time, each retried; else their TTL frees them
                release_lock(client(), lock.key, lock.token)


def demand_reports(endpoint_id: int) -> list[dict]:
    reports = []
    for raw in client().hgetall(DEMAND_KEY.format(endpoint_id=endpoint_id)).values():
        try:
            value = json.loads(raw)
        except (TypeError, ValueError):
            continue
        if isinstance(value, dict):
            reports.append(value)
    return reports


def push_sample(endpoint_id: int, sample: dict, *, key_format: str = SAMPLES_KEY) -> list[dict]:
    """Append one sample to the endpoint's window (demand; or the prefill pool's rate with ``PREFILL_SAMPLES_KEY``)
    and return the window (oldest first)."""
    key = key_format.format(endpoint_id=endpoint_id)
    c = client()
    c.rpush(key, json.dumps(sample))
    c.ltrim(key, -SAMPLES_KEPT, -1)
    out = []
    for raw in c.lrange(key, 0, -1):
        try:
            out.append(json.loads(raw))
        except (TypeError, ValueError):
            continue
    return out


def proxies_alive(max_age_s: float = PROXY_ALIVE_S) -> bool:
    """Whether some proxy process heartbeated lately: then an endpoint without a demand report has none (a proxy
    publishes demand only for endpoints it has served since it started), rather than unknown demand."""
    c = client()
    entries = c.hgetall(PROXY_MEMBERS_KEY)
    if not entries:
        return False
    seconds, micros = c.time()
    now = seconds + micros / 1e6
    for raw in entries.values():
        try:
            t = float(json.loads(raw)["t"])
        except (TypeError, ValueError, KeyError, IndexError):
            continue
        if abs(now - t) <= max_age_s:
            return True
    return False


def woken(endpoint_id: int) -> bool:
    return client().get(WAKE_KEY.format(endpoint_id=endpoint_id)) is not None


def mark_spot_unavailable(endpoint_id: int, backoff_s: float) -> None:
    """A spot launch for this endpoint was refused: the split runs on on-demand for ``backoff_s``."""
    client().set(SPOT_UNAVAILABLE_KEY.format(endpoint_id=endpoint_id), "1", ex=max(1, int(backoff_s)))


def spot_unavailable(endpoint_id: int) -> bool:
    return client().get(SPOT_UNAVAILABLE_KEY.format(endpoint_id=endpoint_id)) is not None


def load_json(key: str):
    raw = client().get(key)
    try:
        return json.loads(raw) if raw else None
    except (TypeError, ValueError):
        return None


def save_json(key: str, value, ttl_s: int = 3600) -> None:
    client().set(key, json.dumps(value), ex=ttl_s)


def claim_fleet_launches(wanted: int, *, cap: int, window_s: float) -> int:
    """Take up to ``wanted`` of the ``cap`` launches the whole fleet may make in this ``window_s`` slot (every worker
    shares the counter); returns how many were granted and gives the rest back."""
    if wanted <= 0:
        return 0
    key = FLEET_LAUNCHES_KEY.format(slot=int(time.time() // window_s))
    c = client()
    total = int(c.incrby(key, wanted))
    c.expire(key, max(1, int(window_s * 4)))
    granted = max(0, min(wanted, cap - (total - wanted)))
    if granted < wanted:
        c.incrby(key, granted - wanted)
    return granted
