"""``bench scale``'s fleet loops, one size at a time, each in a transaction rolled back after it: the autoscaler's
horizontal tick over every endpoint, the proxy's configuration snapshot (build, memory, per-request look-up) and
the console's fleet page.

The autoscaler's endpoints run on the static actuator (hand-registered replicas, ready, at their min = max count):
its ``sync`` probes nothing, so the tick measured is the decision and its records, not the local actuator's health
probes (which cost about 21 ms per replica on the dev machine, each building its own HTTP client).
"""

from __future__ import annotations

import json
import math
import random
import time
import tracemalloc
import uuid

from django.db import transaction
from django.test import Client
from django.urls import reverse

from benchmarks.operations.scale_billing import _profiles
from benchmarks.operations.scale_rows import analyze, insert_series, timed_cpu
from capacity.autoscaling import store, tick_reads
from capacity.autoscaling.demand import DemandSample
from capacity.autoscaling.tick_reads import append_samples
from capacity.autoscaling.ticks import horizontal_ticks
from capacity.models import AutoscalerDecision
from endpoints.models import Endpoint, Replica, ReplicaState
from gateway.proxy.request import ParsedRequest
from gateway.proxy.snapshot_loader import read_snapshot
from gateway.proxy.stages import authenticate, resolve_endpoint
from tenants.models import ApiKey, Tenant, User
from workers.tasks.autoscaling import TICK_BATCH

REPLICAS_PER_ENDPOINT = 10
KEYS_PER_ENDPOINT = 100  # the snapshot goal's 100,000 keys over 1,000 endpoints
KEYS_PER_TENANT = 10
LOOKUPS = 10_000
LOOKUP_REPEATS = 5


def _fleet(endpoints: int, *, replicas: int, actuator: str = "static") -> tuple[str, list[int]]:
    """``endpoints`` endpoints of ``replicas`` ready replicas each; returns the run's stamp and the endpoint ids."""
    hardware, model = _profiles()
    stamp = uuid.uuid4().hex[:8]
    rows = Endpoint.objects.bulk_create(
        Endpoint(
            name=f"scale-{stamp}-{i}",
            model_profile=model,
            hardware_profile=hardware,
            min_replicas=replicas,
            max_replicas=replicas,
            desired_replicas=replicas,
            launch_options={"actuator": actuator},
        )
        for i in range(endpoints)
    )
    ids = [e.pk for e in rows]
    insert_series(
        Replica,
        endpoints * replicas,
        {
            "endpoint_id": "(%(ids)s::bigint[])[1 + (g - 1) / %(per)s]",
            "name": "'r-' || g",
            "url": "'http://10.1.' || (g / 250) || '.' || (g %% 250) || ':8000'",
            "state": "%(ready)s",
            "actuator": "%(actuator)s",
        },
        {"ids": ids, "per": replicas, "ready": ReplicaState.READY, "actuator": actuator},
    )
    analyze(Endpoint, Replica)
    return stamp, ids


# -- autoscaler ------------------------------------------------------------------------------------------------
HISTORY_PER_ENDPOINT = 2_000  # past decisions per endpoint (2.8 hours of 5-s ticks; retention keeps two weeks)
MOVE_EVERY = 50  # one applied move in that many, alternately up and down


def autoscaler_tick(endpoints: int, *, progress) -> dict:
    """Seconds of one horizontal tick over ``endpoints`` endpoints of 10 replicas, in the beat's batches
    (``workers.tasks.autoscaling.TICK_BATCH``) one after another in this process: the CPU a tick costs the workers
    together. Steady state as a live fleet has it: each endpoint's demand window full (``store.SAMPLES_KEPT``
    samples, as the 1-s sampler keeps it) and a history of decisions with moves up and down; the demand sampler's
    own second (every endpoint's sample appended) timed beside it."""
    with transaction.atomic():
        stamp, ids = _fleet(endpoints, replicas=REPLICAS_PER_ENDPOINT)
        _decision_history(ids)
        _full_windows(ids)
        try:
            ticks = []
            for tick in range(3):  # the first writes each endpoint's first decision; the later ones are steady
                label = f"h-scale-{stamp}-{tick}"
                seconds, cpu, _ = timed_cpu(_tick_in_batches, ids, label)
                stored = AutoscalerDecision.objects.filter(tick=label, endpoint_id__in=ids).count()
                ticks.append((seconds, cpu, stored))
            # A worker process that has not read these windows before (a restart, or a batch new to it) reads each
            # whole once: the same tick with the windows' cache emptied.
            tick_reads.forget_windows()
            cold_s, cold_cpu, _ = timed_cpu(_tick_in_batches, ids, f"h-scale-{stamp}-cold")
            sampler_s, sampler_cpu, _ = timed_cpu(append_samples, ids, now=time.time())
        finally:
            _drop_windows(ids)
        transaction.set_rollback(True)
    seconds, cpu, stored = min(ticks[1:])
    progress(
        f"  autoscaler: {endpoints:,} endpoints × {REPLICAS_PER_ENDPOINT} replicas: {seconds:.2f} s a tick "
        f"({seconds / endpoints * 1000:.2f} ms an endpoint; {stored:,} decisions stored; {cold_s:.2f} s with the "
        f"windows read whole); the 1-s demand sampler {sampler_s * 1000:.0f} ms"
    )
    return {
        "seconds": seconds,
        "cpu_s": round(cpu, 3),
        "replicas": endpoints * REPLICAS_PER_ENDPOINT,
        "ms_per_endpoint": round(seconds / endpoints * 1000, 3),
        "decisions_stored": stored,
        "first_tick_s": round(ticks[0][0], 3),
        "cold_windows_s": round(cold_s, 3),
        "cold_windows_cpu_s": round(cold_cpu, 3),
        "history_decisions": endpoints * HISTORY_PER_ENDPOINT,
        "sampler_s": round(sampler_s, 4),
        "sampler_cpu_s": round(sampler_cpu, 4),
    }


def _tick_in_batches(ids: list[int], label: str) -> None:
    for first in range(0, len(ids), TICK_BATCH):
        horizontal_ticks(endpoint_ids=ids[first : first + TICK_BATCH], tick=label)


def _decision_history(ids: list[int]) -> None:
    """``HISTORY_PER_ENDPOINT`` applied decisions per endpoint, one every 5 s back from now, holds at 10 replicas
    with a move up or down every ``MOVE_EVERY``."""
    insert_series(
        AutoscalerDecision,
        len(ids) * HISTORY_PER_ENDPOINT,
        {
            "endpoint_id": "(%(ids)s::bigint[])[1 + (g - 1) %% %(n)s]",
            "at": "now() - ((1 + (g - 1) / %(n)s) * interval '5 seconds')",
            "axis": "'horizontal'",
            "current": "10",
            "desired": "CASE WHEN ((g - 1) / %(n)s) %% %(every)s = 0 THEN 10 + (((g - 1) / %(n)s / %(every)s) %% 2) * 2 - 1 "
            "ELSE 10 END",
            "reason": "'hold'",
            "inputs": "'{}'::jsonb",
            "applied": "true",
            "tick": "'h-past-' || g",
        },
        {"ids": ids, "n": len(ids), "every": MOVE_EVERY},
    )
    analyze(AutoscalerDecision)


def _full_windows(ids: list[int]) -> None:
    """Each endpoint's demand window as the sampler leaves it: ``store.SAMPLES_KEPT`` samples a second apart."""
    c, now = store.client(), time.time()
    for first in range(0, len(ids), TICK_BATCH):
        pipe = c.pipeline(transaction=False)
        for endpoint_id in ids[first : first + TICK_BATCH]:
            key = store.SAMPLES_KEY.format(endpoint_id=endpoint_id)
            samples = [
                json.dumps(DemandSample(t=now - store.SAMPLES_KEPT + i, in_flight=40.0 + i % 7).as_dict())
                for i in range(store.SAMPLES_KEPT)
            ]
            pipe.delete(key)
            pipe.rpush(key, *samples)
        pipe.execute()


def _drop_windows(ids: list[int]) -> None:
    pipe = store.client().pipeline(transaction=False)
    for endpoint_id in ids:
        pipe.delete(store.SAMPLES_KEY.format(endpoint_id=endpoint_id))
    pipe.execute()


# -- the proxy's snapshot --------------------------------------------------------------------------------------
def snapshot(keys: int, *, progress) -> dict:
    """``read_snapshot()`` with ``keys`` API keys over ``keys / 100`` endpoints (10 replicas each): build seconds,
    the memory it holds (traced in a second build), and one request's key and model look-up."""
    with transaction.atomic():
        endpoints = max(1, keys // KEYS_PER_ENDPOINT)
        _fleet(endpoints, replicas=REPLICAS_PER_ENDPOINT, actuator="local")
        raw_keys = _keys(keys)
        build_s, build_cpu, snap = timed_cpu(read_snapshot, "scale")
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        held = read_snapshot("scale-traced")
        memory_mb = (tracemalloc.get_traced_memory()[0] - before) / 1e6
        tracemalloc.stop()
        del held
        lookup_us = _lookup_us(snap, raw_keys)
        transaction.set_rollback(True)
    progress(
        f"  snapshot: {keys:,} keys, {endpoints:,} endpoints: build {build_s:.2f} s, {memory_mb:.0f} MB held, "
        f"look-up {lookup_us:.2f} µs a request"
    )
    return {
        "seconds": build_s,
        "cpu_s": round(build_cpu, 3),
        "memory_mb": round(memory_mb, 1),
        "lookup_us": lookup_us,
        "endpoints": endpoints,
    }


def _keys(count: int, *, changed_at=None) -> list[str]:
    """``count`` usable keys over ``count / 10`` tenants; returns the raw keys (their hashes are stored).
    ``changed_at``: the keys' and tenants' change stamp (the insert's time by default)."""
    stamp = uuid.uuid4().hex[:8]
    aged = {} if changed_at is None else {"changed_at": changed_at}
    tenants = Tenant.objects.bulk_create(
        Tenant(name=f"scale keys {stamp} {i}", slug=f"scale-keys-{stamp}-{i}", **aged)
        for i in range(max(1, count // KEYS_PER_TENANT))
    )
    raw = [f"ic-scale-{stamp}-{i}" for i in range(1, count + 1)]
    insert_series(
        ApiKey,
        count,
        {
            "tenant_id": "(%(tenants)s::bigint[])[1 + (g - 1) %% %(n)s]",
            "name": "'scale ' || g",
            "prefix": "%(stamp)s || '-' || g",
            "key_hash": "encode(sha256(convert_to(%(raw)s || g, 'UTF8')), 'hex')",
            **({"changed_at": "%(aged)s"} if aged else {}),
        },
        {
            "tenants": [t.pk for t in tenants],
            "n": len(tenants),
            "stamp": stamp,
            "raw": f"ic-scale-{stamp}-",
            "aged": changed_at,
        },
    )
    analyze(ApiKey, Tenant)
    return raw


def _lookup_us(snap, raw_keys: list[str]) -> float:
    """Microseconds per request of the proxy's key and model look-ups (``stages.authenticate`` and
    ``resolve_endpoint``) on random keys and endpoints of the snapshot."""
    rng = random.Random(7)
    names = list(snap.endpoints_by_name)
    requests = [
        (
            {b"authorization": f"Bearer {rng.choice(raw_keys)}".encode()},
            ParsedRequest(
                kind="chat",
                body={},
                raw=b"",
                model=rng.choice(names),
                stream=True,
                client_wants_usage=False,
                max_tokens=64,
                prompt_chars=100,
            ),
        )  # fmt: skip
        for _ in range(LOOKUPS)
    ]
    now = time.time()
    best = math.inf
    for _ in range(LOOKUP_REPEATS):  # the best pass: the machine's other work only ever adds time
        started = time.perf_counter()
        for headers, req in requests:
            key = authenticate(snap, headers, now=now)
            resolve_endpoint(snap, key, req)
        best = min(best, time.perf_counter() - started)
    return round(best / LOOKUPS * 1e6, 3)


# -- the console's fleet page ----------------------------------------------------------------------------------
def console_fleet(endpoints: int, *, progress) -> dict:
    """Seconds to render ``/console/fleet/`` for an operator, with ``endpoints`` endpoints of 3 replicas."""
    with transaction.atomic():
        _fleet(endpoints, replicas=3, actuator="local")
        operator = User.objects.create(username=f"scale-{uuid.uuid4().hex[:8]}", is_staff=True, is_superuser=True)
        client = Client()
        client.force_login(operator)
        url = reverse("console:fleet")
        client.get(url)  # templates compiled, sessions warm
        seconds, cpu, response = min((timed_cpu(client.get, url) for _ in range(2)), key=lambda timing: timing[0])
        size_kb = len(response.content) / 1000
        transaction.set_rollback(True)
    if response.status_code != 200:
        raise RuntimeError(f"the fleet page answered {response.status_code}")
    progress(f"  console: fleet page with {endpoints:,} endpoints: {seconds:.2f} s, {size_kb:,.0f} kB")
    return {"seconds": seconds, "cpu_s": round(cpu, 3), "page_kb": round(size_kb)}
