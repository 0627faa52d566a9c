"""What a proxy process reports on each heartbeat, kept from what moved (``gateway.proxy.reports.OwnReports``): after
any mix of streams starting and ending, requests queueing, snapshots changing replicas and limits, a prefill pool
retiring and pools coming and going, the sums are what summing every pool whole gives, and the replicas said to
have moved cover every one that did."""

import asyncio
import dataclasses
import json
import random

from gateway.admission.classes import CLASSES
from gateway.admission.shares import demand_parts
from gateway.proxy.config import ProxyConfig
from gateway.proxy.disaggregation import prefill_route
from gateway.proxy.reports import OwnReports
from gateway.proxy.runtime import EndpointRuntime
from gateway.routing.base import RouteRequest
from tests.proxy.snapshots import endpoint
from tests.proxy.test_disaggregation import LONG, PREFILL_COEFFS, pd_endpoint


def _whole(pools):
    """Every pool summed whole: the reference."""
    in_flight, limits, rows = {}, {}, {}
    for pool in pools:
        for rid, n in pool.in_flight_by_replica().items():
            in_flight[rid] = in_flight.get(rid, 0) + n
        limits.update(pool.replica_limits())
        for rid, row in pool.demand_by_replica().items():
            have = rows.get(rid)
            rows[rid] = row if have is None else tuple(a + b for a, b in zip(have, row, strict=True))
    return in_flight, limits, rows


def _pools(runtimes):
    return [p for rt in runtimes for p in (rt, rt.prefill_pool) if p is not None]


def test_sums_kept_from_what_moved_are_the_sums_worked_out_whole():
    async def scenario(seed):
        rng = random.Random(seed)
        config = ProxyConfig()
        runtimes = [
            EndpointRuntime(endpoint(id=7 + i, name=f"e{i}", replicas=3, limit=2), config=config, clock=lambda: 0.0)
            for i in range(3)
        ]
        pd = EndpointRuntime(pd_endpoint(name="pd", prefills=2, decodes=1), config=config, clock=lambda: 0.0)
        runtimes.append(pd)
        live = list(runtimes)
        originals = {rt: rt.info.replicas for rt in runtimes}
        running, prefilling, waiting = [], [], []
        reports, before = OwnReports(), ({}, {}, {})
        for step in range(400):
            op = rng.random()
            rt = rng.choice(live)
            route = RouteRequest(request_id=f"q{step}", prompt_text="hi")
            if op < 0.3:  # a request arrives: runs at once or queues
                priority = rng.choice(CLASSES)
                waiting.append(
                    (rt, route, asyncio.ensure_future(rt.acquire(route, tenant="t", priority=priority, mu=0.1)))
                )
            elif op < 0.55 and running:
                rt, slot, route = running.pop(rng.randrange(len(running)))
                rt.release(slot, route, 0.1, 0.1)
            elif op < 0.65 and pd.prefill_pool is not None:  # a prefill starts or ends
                if prefilling and rng.random() < 0.5:
                    pool, slot, route = prefilling.pop(rng.randrange(len(prefilling)))
                    pool.release(slot, route)
                else:
                    extra = {"prompt_tokens": 300, "priority_class": rng.randrange(len(CLASSES))}
                    pre = prefill_route(
                        RouteRequest(request_id=f"p{step}", prompt_text=LONG, extra=extra), PREFILL_COEFFS
                    )
                    slot = pd.prefill_pool.take(pre)
                    if slot is not None:
                        prefilling.append((pd.prefill_pool, slot, pre))
            elif op < 0.72:  # a snapshot: a replica goes or comes back, limits change
                base = rt.info
                kept = [r for r in base.replicas if rng.random() < 0.8] or list(base.replicas[:1])
                limit = rng.randint(1, 3)
                replicas = tuple(dataclasses.replace(r, concurrency_limit=limit) for r in kept)
                if rt is pd and rng.random() < 0.3:  # turns aggregated while its prefills run, or back
                    mode = "aggregated" if base.serving_mode == "disaggregated" else "disaggregated"
                    rt.update(dataclasses.replace(base, serving_mode=mode))
                else:
                    if rng.random() < 0.5:
                        replicas = originals[rt]
                    rt.update(dataclasses.replace(base, replicas=replicas))
            elif op < 0.75:  # an endpoint's runtime goes from this process, or comes back
                if rt in live and len(live) > 1 and rng.random() < 0.5:
                    live.remove(rt)
                else:
                    live = [r for r in runtimes if r in live or r is rt]
            await asyncio.sleep(0)
            for item in [w for w in waiting if w[2].done()]:
                waiting.remove(item)
                if not item[2].cancelled() and item[2].exception() is None:
                    running.append((item[0], item[2].result()[0], item[1]))
            if step % 3:
                continue
            pools = _pools(live)
            seen["queued"] += any(len(rt.queue) for rt in live)
            seen["in two pools"] += any(p is not q and p.slots.keys() & q.slots.keys() for p in pools for q in pools)
            seen["a pool gone"] += bool(reports._pools.keys() - set(pools))
            flight_moved, rows_moved = reports.refresh(pools)
            in_flight, limits, rows = _whole(pools)
            assert (reports.in_flight, reports.limits, reports.rows) == (in_flight, limits, rows), (seed, step)
            assert reports.parts == demand_parts(rows), (seed, step)
            assert {name: json.loads(reports.encoded(name)) for name in reports.parts} == reports.parts
            moved_flight = {r for r in in_flight.keys() | before[0].keys() if in_flight.get(r) != before[0].get(r)}
            moved_rows = {r for r in rows.keys() | before[2].keys() if rows.get(r) != before[2].get(r)}
            assert flight_moved >= moved_flight and rows_moved >= moved_rows, (seed, step)
            before = (in_flight, limits, rows)
        for _, _, fut in waiting:
            fut.cancel()

    seen = dict.fromkeys(("queued", "in two pools", "a pool gone"), 0)
    for seed in range(8):
        asyncio.run(scenario(seed))
    assert min(seen.values()) > 3, seen  # each case the sums must follow came up
