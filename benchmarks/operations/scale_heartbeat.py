"""``bench scale``'s heartbeat loop: the proxies' membership heartbeat (``gateway/proxy/state.py``, ``_beat``), which
shares every replica's concurrency limit between the proxy processes (docs/request-path.md, "Several proxy
processes"), as the fleet grows.

One ``ProxyState`` (not started: no scraper, no snapshot poller) holds ``size`` replicas in endpoints of 10 with
nothing in flight; ``MEMBERS - 1`` other processes beat on the same hash in turn, through the same script, each
running and queueing a critical request on ``busy_share`` of the replicas (``--opt heartbeat_busy=``, 1: every
one) and holding its even share of all (asked for once: a steady fleet). Measured over ``BEATS`` rounds: this process's
CPU a beat (the allocation, the JSON both ways, the caps applied, the collections they cause) and Redis's (``INFO
commandstats``: the script's time in the server, which runs one command at a time for every process). A process beats every ``member_interval_s`` (0.25 s), so
the judged figure is this process's CPU-seconds a second; ``redis_cpu_s_per_s`` is Redis's for all ``MEMBERS``
processes together. The hash is the bench's own key, not the proxies'.
"""

from __future__ import annotations

import asyncio
import gc
import json
import time
import uuid

import redis
import redis.asyncio as aioredis
from django.conf import settings

from capacity.units import MUCoefficients
from gateway.admission.shares import fair_share
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


def heartbeat(replicas: int, *, progress, busy_share: float = BUSY_SHARE) -> dict:
    return asyncio.run(_measure(replicas, progress, busy_share))


async def _measure(replicas: int, progress, busy_share: float) -> dict:
    config = ProxyConfig()
    state = ProxyState(config)
    state.members_key = f"infercap:bench:members:{uuid.uuid4().hex[:8]}"
    state.redis = aioredis.Redis.from_url(settings.REDIS_URL)
    state._heartbeat = state.redis.register_script(HEARTBEAT)
    sync = redis.Redis.from_url(settings.REDIS_URL)
    others = [f"bench-other-{i}" for i in range(MEMBERS - 1)]
    other_beat = sync.register_script(HEARTBEAT)
    # As a proxy process does once it has started (``gateway.proxy.state.get_state``): what was loaded before is
    # out of the collector's view; the endpoints' runtimes, made on their first requests, are not.
    gc.collect()
    gc.freeze()
    try:
        rids = _runtimes(state, config, replicas)
        ids = sorted([*others, state.process_id])
        busy = rids[: round(len(rids) * busy_share)]
        queued = json.dumps(dict.fromkeys(busy, 1), separators=(",", ":"))  # one critical request each: every class
        critical = queued  # and its critical part (nothing sheddable)
        asked = set()

        def beat_others() -> None:
            for other in others:  # each asks for its even share once, then holds it (no change to ask for)
                share = {} if other in asked else {rid: fair_share(LIMIT, ids, other) for rid in rids}
                limits = json.dumps(dict.fromkeys(share, LIMIT), separators=(",", ":"))
                args = [other, json.dumps(share), queued, critical, "{}", repr(config.member_ttl_s), limits]
                other_beat(keys=[state.members_key], args=args)
                asked.add(other)

        beat_others()
        await state._beat()  # joins: the first read of the others, and every replica asked for
        beat_others()
        await state._beat()
        redis_before, calls_before = _script_usec(sync)
        python_s = 0.0
        for _ in range(BEATS):
            beat_others()
            started = time.process_time()
            await state._beat()
            python_s += time.process_time() - started
        redis_usec, calls = (a - b for a, b in zip(_script_usec(sync), (redis_before, calls_before), strict=True))
        held = sum((state.members[state.process_id].holdings or {}).values())
    finally:
        gc.unfreeze()
        sync.delete(state.members_key, *sync.keys(f"{state.members_key}:h:*"))
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
        "members": MEMBERS,
        "process_ms_per_beat": round(python_per_beat * 1e3, 3),
        "redis_ms_per_beat": round(redis_per_beat * 1e3, 3),
        "redis_cpu_s_per_s": round(redis_per_beat * beats_per_s * MEMBERS, 4),
        "slots_held": held,
        "busy_share": busy_share,
    }
    progress(
        f"  heartbeat: {replicas:,} replicas, {MEMBERS} processes: {out['process_ms_per_beat']} CPU-ms a beat in the "
        f"process ({cpu_per_s:.3f} CPU-s a second at {beats_per_s:g} beats), {out['redis_ms_per_beat']} ms in Redis "
        f"({out['redis_cpu_s_per_s']} CPU-s a second for the {MEMBERS} processes); {held:,} slots held"
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


def _script_usec(client: redis.Redis) -> tuple[int, int]:
    """Redis's own time in script calls so far, and their count (``INFO commandstats``)."""
    stats = client.info("commandstats")
    usec = calls = 0
    for name in ("cmdstat_evalsha", "cmdstat_eval"):
        usec += stats.get(name, {}).get("usec", 0)
        calls += stats.get(name, {}).get("calls", 0)
    return usec, calls
