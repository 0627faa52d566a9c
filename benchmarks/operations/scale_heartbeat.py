"""``bench scale``'s heartbeat loop: the proxies' membership heartbeat (``gateway/proxy/state.py``, ``_beat``), which
shares every replica's concurrency limit between the proxy processes (docs/request-path.md, "Several proxy
processes"), as the fleet grows.

One ``ProxyState`` (not started: no scraper, no snapshot poller) holds ``size`` replicas in endpoints of 10, running
streams as the other processes do (``--opt heartbeat_mine=0``: none, the process idle among busy ones);
``MEMBERS - 1`` other processes beat on the same hash in turn, through the same script, each
running and queueing a critical request on ``busy_share`` of the replicas (``--opt heartbeat_busy=``, 1: every
one) and holding its even share of all (asked for once). Between two beats each of them moves its demand on ``churn``
of those replicas (``--opt heartbeat_churn=``: a request there ends or another starts; a count between 1 and 2), drawn
afresh each beat: 0 is a fleet whose demand stands still, which a beat that works out only what moved pays next to
nothing for, 1 every replica's demand moving at every beat in every process, the worst case. The default, a tenth,
is a busy fleet's: with one request running on a replica per process and requests of about 2.5 s (LLM requests
mostly last longer), a replica's count moves within a 0.25 s beat about a tenth of the time.
Measured over ``BEATS`` rounds: this process's
CPU a beat (the allocation, the JSON both ways, the caps applied, the collections they cause) and Redis's (``INFO
commandstats``: the script's time in the server, which runs one command at a time for every process). A process beats every ``member_interval_s`` (0.25 s), so
the judged figure is this process's CPU-seconds a second; ``redis_cpu_s_per_s`` is Redis's for all ``MEMBERS``
processes together. The hash is the bench's own key, not the proxies'.
"""

from __future__ import annotations

import asyncio
import gc
import json
import random
import time
import uuid

import redis
import redis.asyncio as aioredis
from django.conf import settings

from capacity.units import MUCoefficients
from gateway.admission.classes import CLASSES, CRITICAL
from gateway.admission.shares import Member, allocate
from gateway.proxy.config import ProxyConfig
from gateway.proxy.membership import HEARTBEAT
from gateway.proxy.runtime import EndpointRuntime
from gateway.proxy.snapshot import EndpointInfo, ReplicaInfo
from gateway.proxy.state import ProxyState

MEMBERS = 4  # proxy processes sharing the replicas
REPLICAS_PER_ENDPOINT = 10
LIMIT = 8  # each replica's concurrency limit
BEATS = 40  # one FULL_BEAT_EVERY period: its full beat counted in the mean
BUSY_SHARE = 1.0  # the share of the replicas the other processes run and queue requests on (1: every one)
CHURN = 0.1  # the share of those replicas whose demand each of them moves between two beats
# ``heartbeat_processes``: many processes over one fleet, each streaming what one proxy process streams
# (``bench proxy``: a few hundred streams, tens of requests a second), not every process on every replica.
FLEET = 10_000  # replicas
STREAMS = 256  # streams a process runs, each on a replica drawn at random
RATE = 40.0  # requests a second a process: as many of its streams end and start on other replicas


def heartbeat(
    replicas: int, *, progress, busy_share: float = BUSY_SHARE, churn: float = CHURN, mine: bool = True
) -> dict:
    load = {"busy_share": busy_share, "churn": churn}
    return asyncio.run(_measure(replicas, progress, MEMBERS, load, mine))


def heartbeat_processes(
    members: int, *, progress, replicas: int = FLEET, streams: int = STREAMS, rate: float = RATE
) -> dict:
    """The same beat with ``members`` processes over ``replicas``, each (this one too) running ``streams`` streams
    on replicas drawn at random, ``rate`` of them a second ending and as many starting elsewhere: what grows with
    the number of processes (each beat reads every member, and Redis serves every member's beat)."""
    load = {"streams": streams, "rate": rate}
    return asyncio.run(_measure(replicas, progress, members, load, True))


async def _measure(replicas: int, progress, members: int, load: dict, mine: bool) -> dict:
    # The other processes beat one after another in this one process, slower than a fleet's do side by side (127 of
    # them take longer than the TTL); a long TTL keeps them all live, as a fleet's would be: no member is counted out.
    config = ProxyConfig(member_ttl_s=60.0)
    state = ProxyState(config)
    state.members_key = f"infercap:bench:members:{uuid.uuid4().hex[:8]}"
    # First in the id order: with more processes than a replica's limit, the first ``LIMIT`` by id hold the idle
    # replicas' slots (their even shares) and give them back as others' demand comes; the measured process is one of
    # them, the busier kind (the others here hold their shares and never read its demand).
    state.process_id = f"bench-measured:{state.process_id}"
    state.redis = aioredis.Redis.from_url(settings.REDIS_URL)
    state._heartbeat = state.redis.register_script(HEARTBEAT)
    sync = redis.Redis.from_url(settings.REDIS_URL)
    # As a proxy process does once it has started (``gateway.proxy.state.get_state``): what was loaded before is
    # out of the collector's view; the endpoints' runtimes, made on their first requests, are not.
    gc.collect()
    gc.freeze()
    try:
        rids = _runtimes(state, config, replicas)
        fleet = _Fleet(state, sync, rids, members, load, mine)
        beat_others, run_mine = fleet.beat_others, fleet.run_mine
        beat_others()
        run_mine()
        await state._beat()  # joins: the first read of the others, and every replica asked for
        beat_others()
        run_mine()
        await state._beat()
        redis_before, calls_before = _script_usec(sync)
        python_s = 0.0
        for _ in range(BEATS):
            beat_others()
            run_mine()
            started = time.process_time()
            await state._beat()
            python_s += time.process_time() - started
        redis_usec, calls = (a - b for a, b in zip(_script_usec(sync), (redis_before, calls_before), strict=True))
        held = sum((state.members[state.process_id].holdings or {}).values())
    finally:
        gc.unfreeze()
        sync.delete(state.members_key, *sync.keys(f"{state.members_key}:*"))
        sync.close()
        await state.redis.aclose()
    beats_per_s = 1.0 / config.member_interval_s
    python_per_beat = python_s / BEATS
    redis_per_beat = redis_usec / 1e6 / calls if calls else 0.0
    cpu_per_s = python_per_beat * beats_per_s
    out = {
        "seconds": cpu_per_s,
        "cpu_s": round(cpu_per_s, 4),
        "replicas": replicas,
        "members": members,
        "process_ms_per_beat": round(python_per_beat * 1e3, 3),
        "redis_ms_per_beat": round(redis_per_beat * 1e3, 3),
        "redis_cpu_s_per_s": round(redis_per_beat * beats_per_s * members, 4),
        "slots_held": held,
        **load,
        "mine_busy": mine,
    }
    if "streams" in load:
        said = f"{load['streams']:g} streams a process, {load['rate']:g} requests a second"
    else:
        said = f"demand on {load['busy_share']:g} of the replicas, {load['churn']:g} of it moving a beat"
    progress(
        f"  heartbeat: {replicas:,} replicas, {members} processes: {out['process_ms_per_beat']} CPU-ms a beat in the "
        f"process ({cpu_per_s:.3f} CPU-s a second at {beats_per_s:g} beats), {out['redis_ms_per_beat']} ms in Redis "
        f"({out['redis_cpu_s_per_s']} CPU-s a second for the {members} processes); {held:,} slots held; {said}"
    )
    return out


def _runtimes(state: ProxyState, config: ProxyConfig, replicas: int) -> list[str]:
    """Endpoints of 10 replicas in ``state``; the replicas' ids."""
    coeffs = MUCoefficients(alpha=0.001, alpha_cached=0.0001, beta=0.01, gamma=0.1, mu_per_min=600.0)
    rids = []
    for endpoint in range(-(-replicas // REPLICAS_PER_ENDPOINT)):
        first = endpoint * REPLICAS_PER_ENDPOINT
        infos = tuple(
            ReplicaInfo(id=i + 1, name=f"r{i}", url=f"http://r{i}", concurrency_limit=LIMIT, version_id=1)
            for i in range(first, min(first + REPLICAS_PER_ENDPOINT, replicas))
        )
        info = EndpointInfo(
            id=endpoint + 1, name=f"e{endpoint}", owner_tenant_id=None, coeffs=coeffs, routing_policy="least_request",
            scale_to_zero=False, concurrency_limit=LIMIT * len(infos), ttft_slo_ms=2000, tpot_slo_ms=100,
            max_model_len=4096, created=0, replicas=infos, version_weights=(),
        )  # fmt: skip
        state.runtimes[info.id] = EndpointRuntime(info, config=config, clock=time.monotonic)
        rids += [str(r.id) for r in infos]
    return rids


class _Fleet:
    """The other processes' beats and this process's own streams, moving between two beats as the docstring says."""

    def __init__(self, state: ProxyState, sync, rids: list[str], members: int, load: dict, mine: bool) -> None:
        self.state, self.rids = state, rids
        self.others = [f"bench-other-{i:03d}" for i in range(members - 1)]
        self.ids = sorted([*self.others, state.process_id])
        self.script = sync.register_script(HEARTBEAT)
        self.rng = random.Random(len(rids))
        interval = state.config.member_interval_s
        self.loads = {name: _load(self.rng, rids, load, interval) for name in self.others}
        self.beats = dict.fromkeys(self.others, 0)
        self.held: dict[str, dict[str, int]] = {other: {} for other in self.others}
        self.short: dict[str, set[str]] = {other: set() for other in self.others}
        self.limits = dict.fromkeys(rids, LIMIT)
        self.mine = _load(self.rng, rids, load, interval) if mine else None  # this process's own critical streams
        self.mine_moved: set[str] = set()  # since the others last worked out their allocations
        self.by_replica = {str(r.id): rt for rt in state.runtimes.values() for r in rt.info.replicas}
        self.first = True

    def run_mine(self) -> None:
        if self.mine is None:
            return
        if self.first:  # every stream starts
            moved, self.first = list(self.mine.counts), False
        else:
            moved = self.mine.step()
        counts = self.mine.counts
        for rid in moved:
            _run(self.by_replica[rid], rid, counts.get(rid, 0))
        self.mine_moved.update(moved)

    def beat_others(self) -> None:
        """Each other process moves its demand, then beats as a proxy does: it asks to hold ``max(allocation, what
        runs)`` (``shares.allocate`` on every process's demand, this one's included) where that moved or its last
        grant fell short, with what moved since its last beat."""
        ttl = repr(self.state.config.member_ttl_s)
        moved = {other: self.loads[other].step() for other in self.others}
        demand = {other: self.loads[other].counts for other in self.others}
        demand[self.state.process_id] = self.mine.counts if self.mine is not None else {}
        members = {pid: Member(joined=0.0, seen_at=0.0, demand=counts) for pid, counts in demand.items()}
        touched = set().union(self.mine_moved, *moved.values())
        self.mine_moved = set()
        totals = {}  # every process's demand summed, where the others work it out
        for other in self.others:
            counts, held = demand[other], self.held[other]
            if self.beats[other] == 0:  # every replica asked for
                want = allocate(other, members, self.limits)
            else:
                only = touched | self.short[other]
                for rid in only - totals.keys():
                    totals[rid] = sum(c.get(rid, 0) for c in demand.values())
                want = allocate(other, members, self.limits, only=only, totals=totals)
            ask = {rid: w for rid, n in want.items() if held.get(rid) != (w := max(n, counts.get(rid, 0)))}
            limits = json.dumps(dict.fromkeys(ask, LIMIT), separators=(",", ":"))
            queued = json.dumps(counts, separators=(",", ":"))  # and their critical part (nothing sheddable)
            beat = self.beats[other] = self.beats[other] + 1  # with what moved since its last beat, as a proxy does
            mine = moved[other]
            base = beat - 1 if 2 * len(mine) <= len(counts) else -1  # most moved: no moves, as ``ShareBook.sending``
            moves = json.dumps({rid: counts.get(rid, 0) for rid in mine} if base >= 0 else {}, separators=(",", ":"))
            args = [other, json.dumps(ask), queued, queued, "{}", ttl, limits, "0", str(beat), str(base), moves]
            grants = json.loads(self.script(keys=[self.state.members_key], args=args)[1])
            held.update(grants)
            self.short[other] = {rid for rid, n in grants.items() if n < ask[rid]}


def _load(rng: random.Random, rids: list[str], load: dict, interval: float):
    if "streams" in load:
        return _Streams(rng, rids, int(load["streams"]), round(load["rate"] * interval))
    return _Toggles(rng, rids[: round(len(rids) * load["busy_share"])], load["churn"])


class _Toggles:
    """One process's demand: a request running on every busy replica, a second one starting or ending on ``churn``
    of them between two beats (a count between 1 and 2)."""

    def __init__(self, rng: random.Random, busy: list[str], churn: float) -> None:
        self.rng, self.busy, self.churn = rng, busy, churn
        self.counts = dict.fromkeys(busy, 1)

    def step(self) -> list[str]:
        moved = self.rng.sample(self.busy, round(len(self.busy) * self.churn))
        for rid in moved:
            self.counts[rid] = 3 - self.counts[rid]
        return moved


class _Streams:
    """One process's demand: ``streams`` streams on replicas drawn at random; between two beats ``per_beat`` of
    them end and as many start on replicas drawn afresh (the replicas whose count moved are what moved)."""

    def __init__(self, rng: random.Random, rids: list[str], streams: int, per_beat: int) -> None:
        self.rng, self.rids, self.per_beat = rng, rids, per_beat
        self.on = [rng.choice(rids) for _ in range(streams)]
        self.counts: dict[str, int] = {}
        for rid in self.on:
            self.counts[rid] = self.counts.get(rid, 0) + 1

    def step(self) -> list[str]:
        counts, before = self.counts, {}
        for _ in range(self.per_beat):
            i = self.rng.randrange(len(self.on))
            old, new = self.on[i], self.rng.choice(self.rids)
            for rid, change in ((old, -1), (new, 1)):
                before.setdefault(rid, counts.get(rid, 0))
                n = counts.get(rid, 0) + change
                if n:
                    counts[rid] = n
                else:
                    del counts[rid]
            self.on[i] = new
        return [rid for rid, n in before.items() if counts.get(rid, 0) != n]


def _run(rt: EndpointRuntime, rid: str, n: int) -> None:
    """``n`` critical streams of this process on ``rid``, as ``EndpointRuntime``'s take and release count them
    (and note them for the heartbeat)."""
    view = rt.slots[rid].view
    rt.in_flight += n - view.in_flight
    view.in_flight = n
    rt._class_flight.setdefault(rid, [0] * len(CLASSES))[CLASSES.index(CRITICAL)] = n
    rt.flight_moved.add(rid)


def _script_usec(client: redis.Redis) -> tuple[int, int]:
    """Redis's own time in script calls so far, and their count (``INFO commandstats``)."""
    stats = client.info("commandstats")
    usec = calls = 0
    for name in ("cmdstat_evalsha", "cmdstat_eval"):
        usec += stats.get(name, {}).get("usec", 0)
        calls += stats.get(name, {}).get("calls", 0)
    return usec, calls
