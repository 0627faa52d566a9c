"""The heartbeat works out only what moved since the last beat, and must end up where a whole recomputation would.

Several ``ProxyState`` processes beat on real Redis with the real script (``ProxyState._beat``, ``HEARTBEAT``) while
streams start and end, requests queue, snapshots remove and re-add replicas and switch a P/D endpoint's mode,
processes join, leave and are counted out, and script calls fail before it runs or after it ran. Each beat's
``ShareBook.allocate``, ``parse_members`` (with its memory), ``OwnReports.refresh`` and ``ShareBook.changes`` are
checked against a whole recomputation; after each beat, every process that knows its holdings has them as Redis has
them, and each of its slots (draining ones too) has the cap a whole ``_apply_caps`` gives, within that holding; the
holdings in Redis never sum above a replica's limit. Each run asserts the cases it checks occurred (incremental
beats, a replica over its limit, joins, leaves, each kind of failure where injected): it cannot pass vacuously."""

import asyncio
import dataclasses
import random
from collections import Counter

import pytest
import redis
import redis.asyncio as aioredis
from django.conf import settings

from gateway.admission.classes import CLASSES
from gateway.admission.shares import allocate, demand_parts, fair_share
from gateway.proxy import state as proxy_state
from gateway.proxy.config import ProxyConfig
from gateway.proxy.disaggregation import prefill_route
from gateway.proxy.membership import HEARTBEAT, LEAVE, ShareBook, parse_members
from gateway.proxy.reports import OwnReports
from gateway.proxy.state import ProxyState
from gateway.routing.base import RouteRequest
from tests.proxy.snapshots import endpoint, snapshot
from tests.proxy.test_disaggregation import LONG, PREFILL_COEFFS, pd_endpoint

STEPS = 600
FAIL_RATE = 0.08  # each kind, per script call, in every other 100 steps of a run that injects failures
PD_ID = 20
ALWAYS = ("incremental beat", "over its limit on an incremental beat", "demand read from moves", "replica back")
ALWAYS += ("join", "leave", "counted out", "serving slot checked", "draining slot checked", "totals checked")
FAILURES = ("failure before the script", "failure after the script", "recovery with a draining slot")


@dataclasses.dataclass
class Record:
    """What the checks found wrong, and how often each checked case happened."""

    wrong: list = dataclasses.field(default_factory=list)
    seen: Counter = dataclasses.field(default_factory=Counter)

    def expect(self, ok: bool, *what) -> None:
        if not ok:
            self.wrong.append(what)


def _whole_reports(pools) -> tuple[dict, dict, dict]:
    in_flight, limits, rows = Counter(), {}, {}
    for pool in pools:
        in_flight.update(pool.in_flight_by_replica())  # added up
        limits.update(pool.replica_limits())
        for rid, row in pool.demand_by_replica().items():
            have = rows.get(rid)
            rows[rid] = row if have is None else tuple(a + b for a, b in zip(have, row, strict=True))
    return dict(in_flight), limits, rows


def _install_checks(monkeypatch, record: Record) -> None:
    """Wrap the incremental steps of a beat: each call is checked against a whole recomputation."""
    allocate_of, changes_of, refresh = ShareBook.allocate, ShareBook.changes, OwnReports.refresh

    def checked_allocate(self, me, view, limits, *, full):
        out = allocate_of(self, me, view, limits, full=full)
        incremental = out[0] is not None
        over = any(sum(m.demand.get(rid, 0) for m in view.values()) > n for rid, n in limits.items())
        record.seen["incremental beat"] += incremental
        record.seen["over its limit on an incremental beat"] += incremental and over
        whole = allocate(me, view, limits)
        record.expect(self.allocation == whole, "allocation", me, self.allocation, whole)
        return out

    def checked_parse(raw, known=None):
        out, whole = parse_members(raw, known), parse_members(raw)
        record.expect(out.keys() == whole.keys(), "members", sorted(out), sorted(whole))
        for name, m in whole.items():
            got = out.get(name, m)
            record.seen["demand read from moves"] += got.moved_since is not None
            demands = [(dict(a.demand), dict(a.critical), dict(a.sheddable)) for a in (got, m)]
            record.expect(demands[0] == demands[1], "parse", name, *demands)
        return out

    def checked_refresh(self, pools, *, whole=False):
        out = refresh(self, pools, whole=whole)
        in_flight, limits, rows = _whole_reports(pools)
        got = (self.in_flight, self.limits, self.rows)
        record.expect(got == (in_flight, limits, rows), "reports", got, (in_flight, limits, rows))
        record.expect(self.parts == demand_parts(rows), "parts", self.parts, rows)
        return out

    def checked_changes(self, in_flight, limits, touched, full, moved=None):
        held, before = dict(self.holdings), self.limits
        wanted = {rid: max(n, in_flight.get(rid, 0)) for rid, n in self.allocation.items()}
        expected = {rid: w for rid, w in wanted.items() if w != held.get(rid) or before.get(rid) != limits.get(rid)}
        expected.update((rid, 0) for rid in held.keys() - limits.keys())
        out = changes_of(self, in_flight, limits, touched, full, moved)
        record.expect(out.items() >= expected.items(), "changes", out, expected)
        return out

    monkeypatch.setattr(ShareBook, "allocate", checked_allocate)
    monkeypatch.setattr(proxy_state, "parse_members", checked_parse)
    monkeypatch.setattr(OwnReports, "refresh", checked_refresh)
    monkeypatch.setattr(ShareBook, "changes", checked_changes)


def _whole_caps(state: ProxyState) -> dict:
    """What a whole ``_apply_caps`` gives each slot, without applying it."""
    mine = state.members.get(state.process_id)
    holdings = mine.holdings if mine is not None else {}
    ids = list(state.members) if mine is not None else [*state.members, state.process_id]
    caps = {}
    for pool in state._slot_pools():
        for rid, slot in pool.slots.items():
            have = holdings.get(rid)
            if have is not None:
                share = state._book.allocation.get(rid)
                cap = have if share is None or share >= have else share
            else:
                cap = fair_share(slot.limit, ids, state.process_id) if state._beat_failing else 0
            caps[pool, rid] = min(slot.limit, cap)
    return caps


def _endpoints(rng: random.Random) -> list:
    """Three aggregated endpoints of three replicas each (limits 2 to 4), and a disaggregated one."""
    eps = []
    for i in range(3):
        e = endpoint(id=7 + i, name=f"e{i}", replicas=3, limit=rng.randint(2, 4))
        renumbered = tuple(dataclasses.replace(r, id=r.id + 10 * i) for r in e.replicas)
        eps.append(dataclasses.replace(e, replicas=renumbered))
    return [*eps, dataclasses.replace(pd_endpoint(name="pd", prefills=2, decodes=2), id=PD_ID)]


class Proc:
    """One proxy process: its state, beating through the real script, and what it runs and waits for."""

    def __init__(self, name: str, fleet: "Fleet") -> None:
        self.name, self.fleet = name, fleet
        self.state = s = ProxyState(ProxyConfig(member_ttl_s=60.0))
        s.process_id, s.members_key, s.redis = name, fleet.key, object()
        s._heartbeat = self._call
        s.snapshot = snapshot(endpoints=fleet.eps)
        for e in fleet.rng.sample(fleet.eps, fleet.rng.randint(1, len(fleet.eps))):
            s.runtime_for(e)
        self._script = fleet.client.register_script(HEARTBEAT)
        # Since its last good beat, a reply was lost or the others counted it out: its holdings are unknown to it.
        self.lost = self.counted_out = False
        self.running, self.prefilling, self.waiting = [], [], []

    async def _call(self, keys, args):
        x, rate = self.fleet.rng.random(), self.fleet.failing_now
        mode = "before" if x < rate else "after" if x < 2 * rate else None
        if mode is not None:
            self.fleet.record.seen[f"failure {mode} the script"] += 1
        if mode == "before":
            raise redis.ConnectionError("Redis away")
        out = await self._script(keys=keys, args=args)
        if mode == "after":
            self.lost = True
            raise redis.ConnectionError("reply lost")
        return out

    def stop(self) -> None:
        for task in [*self.state.background, *(acquired for *_, acquired in self.waiting)]:
            task.cancel()


class Fleet:
    """The processes, the endpoints they share and one seeded run of what happens to them."""

    def __init__(self, key: str, seed: int, fail_rate: float, record: Record) -> None:
        self.key, self.record = key, record
        self.client, self.sync = aioredis.Redis.from_url(settings.REDIS_URL), redis.Redis.from_url(settings.REDIS_URL)
        self.rng = random.Random(seed)
        self.fail_rate, self.failing_now = fail_rate, 0.0
        self.eps = _endpoints(self.rng)
        self.originals = {e.id: e for e in self.eps}
        self.limits = {str(r.id): min(r.concurrency_limit, e.concurrency_limit) for e in self.eps for r in e.replicas}
        self.procs = [Proc(f"p{i}", self) for i in range(3)]

    async def step(self, n: int) -> None:
        self.failing_now = self.fail_rate if (n // 100) % 2 else 0.0
        p, op = self.rng.choice(self.procs), self.rng.random()
        if op < 0.3:
            self.queue(p, n)
        elif op < 0.45:
            self.end_stream(p)
        elif op < 0.52:
            self.prefill(p, n)
        elif op < 0.56:
            self.new_snapshot()
        elif op < 0.58:
            p.state.runtime_for(self.rng.choice(self.eps))
        elif op < 0.605:
            self.leave(p)
        elif op < 0.61:
            self.procs.append(Proc(f"n{n}", self))
            self.record.seen["join"] += 1
        elif op < 0.63:
            self.forget(p)
            p.counted_out = True
            self.record.seen["counted out"] += 1
        else:
            await self.beat(p)
            self.check_all()
        await asyncio.sleep(0)
        for item in [w for w in p.waiting if w[2].done()]:
            p.waiting.remove(item)
            if not item[2].cancelled() and item[2].exception() is None:
                p.running.append((item[0], item[2].result()[0], item[1]))

    def queue(self, p: Proc, n: int) -> None:
        if p.state.runtimes:
            rt = self.rng.choice(list(p.state.runtimes.values()))
            route = RouteRequest(request_id=f"{p.name}-{n}", prompt_text="hi")
            acquired = rt.acquire(route, tenant="t", priority=self.rng.choice(CLASSES), mu=0.1)
            p.waiting.append((rt, route, asyncio.ensure_future(acquired)))

    def end_stream(self, p: Proc) -> None:
        if p.running:
            rt, slot, route = p.running.pop(self.rng.randrange(len(p.running)))
            rt.release(slot, route, 0.1, 0.1)

    def prefill(self, p: Proc, n: int) -> None:
        rt = p.state.runtimes.get(PD_ID)
        if rt is None or rt.prefill_pool is None:
            return
        if p.prefilling and self.rng.random() < 0.5:
            pool, slot, route = p.prefilling.pop(self.rng.randrange(len(p.prefilling)))
            pool.release(slot, route)
            return
        extra = {"prompt_tokens": 300, "priority_class": self.rng.randrange(len(CLASSES))}
        route = prefill_route(RouteRequest(request_id=f"pp{n}", prompt_text=LONG, extra=extra), PREFILL_COEFFS)
        slot = rt.prefill_pool.take(route)
        if slot is not None:
            p.prefilling.append((rt.prefill_pool, slot, route))

    def new_snapshot(self) -> None:
        """One endpoint changes for every process: the P/D one switches mode, or replicas go and come back."""
        i = self.rng.randrange(len(self.eps))
        e = self.eps[i]
        if e.id == PD_ID and self.rng.random() < 0.4:
            mode = "aggregated" if e.serving_mode == "disaggregated" else "disaggregated"
            e = dataclasses.replace(e, serving_mode=mode)
        else:
            every = self.originals[e.id].replicas
            kept = [r for r in every if self.rng.random() < 0.8] or list(every[:1])
            e = dataclasses.replace(e, replicas=tuple(every if self.rng.random() < 0.5 else kept))
            self.record.seen["replica back"] += bool({r.id for r in e.replicas} - {r.id for r in self.eps[i].replicas})
        self.eps[i] = e
        snap = snapshot(endpoints=self.eps)
        for q in self.procs:
            q.state.apply_snapshot(snap)

    def forget(self, p: Proc) -> None:
        """Drop a process's entry and holdings from Redis, as the script does once its entry expired."""
        self.sync.eval(LEAVE, 1, self.key, p.state.process_id)

    def leave(self, p: Proc) -> None:
        if len(self.procs) > 2:
            self.procs.remove(p)
            p.stop()
            self.forget(p)
            self.record.seen["leave"] += 1

    async def beat(self, p: Proc) -> None:
        recovering = p.state._beat_failing
        try:
            await p.state._beat()
        except redis.ConnectionError:
            return
        p.lost = p.counted_out = False
        draining = any(slot.removed for pool in p.state._slot_pools() for slot in pool.slots.values())
        self.record.seen["recovery with a draining slot"] += recovering and draining

    def check_all(self) -> None:
        """On no replica do the holdings in Redis sum above its limit; each process is checked against them."""
        held = {}
        for pid in self.sync.hkeys(self.key):
            found = self.sync.hgetall(f"{self.key}:h:{pid.decode()}")
            held[pid.decode()] = {rid.decode(): int(n) for rid, n in found.items()}
        for rid, limit in self.limits.items():
            total = sum(h.get(rid, 0) for h in held.values())
            self.record.expect(total <= limit, "over its limit in Redis", rid, total, limit)
        # The replicas' totals the script grants from are every holdings hash summed, exactly.
        summed = Counter()
        for key in self.sync.keys(f"{self.key}:h:*"):
            summed.update({rid.decode(): int(n) for rid, n in self.sync.hgetall(key).items()})
        totals = {rid.decode(): int(n) for rid, n in self.sync.hgetall(f"{self.key}:held").items()}
        self.record.expect(totals == {rid: n for rid, n in summed.items() if n}, "totals", totals, dict(summed))
        self.record.seen["totals checked"] += bool(totals)
        for p in self.procs:
            self.check_proc(p, held)

    def check_proc(self, p: Proc, held: dict[str, dict[str, int]]) -> None:
        s = p.state
        if s.members is None or p.lost or p.counted_out or s._beat_lock.locked():
            return  # what Redis holds for it is not known to it (or a beat is under way)
        mine = held.get(s.process_id, {})
        book = {rid: n for rid, n in s._book.holdings.items() if n}
        self.record.expect(book == mine, "holdings", p.name, book, mine)
        if s._beat_failing:
            return  # even shares while Redis is away (``_apply_caps``)
        whole = _whole_caps(s)
        for pool in s._slot_pools():  # a draining slot too: its cap is what it admits if it comes back
            for rid, slot in pool.slots.items():
                cap = slot.view.concurrency_limit
                self.record.expect(cap == whole[pool, rid], "cap", p.name, rid, cap, whole[pool, rid], slot.removed)
                self.record.expect(cap <= mine.get(rid, 0), "cap above holding", p.name, rid, cap, mine)
                self.record.seen["draining slot checked" if slot.removed else "serving slot checked"] += 1

    async def settle(self) -> None:
        """No more failures: every process beats until nothing moves, and all of them are checked."""
        self.failing_now = 0.0
        for _ in range(6):
            for p in self.procs:
                await self.beat(p)
        self.check_all()
        for p in self.procs:
            self.record.expect(not (p.lost or p.counted_out or p.state._beat_failing), "not settled", p.name)


async def _run(key: str, seed: int, fail_rate: float, record: Record) -> None:
    fleet = Fleet(key, seed, fail_rate, record)
    try:
        for n in range(STEPS):
            await fleet.step(n)
            if record.wrong:
                return
        await fleet.settle()
    finally:
        for p in fleet.procs:
            p.stop()
        await asyncio.sleep(0)
        await fleet.client.aclose()
        fleet.sync.close()


@pytest.mark.parametrize(("seed", "fail_rate"), [(0, 0.0), (1, 0.0), (2, FAIL_RATE), (3, FAIL_RATE)])
def test_incremental_heartbeat_matches_whole_recomputation(seed, fail_rate, members_key, monkeypatch):
    record = Record()
    _install_checks(monkeypatch, record)
    asyncio.run(_run(members_key, seed, fail_rate, record))
    assert not record.wrong, record.wrong[:3]
    missing = [case for case in ALWAYS + (FAILURES if fail_rate else ()) if not record.seen[case]]
    assert not missing, f"never happened: {missing} ({dict(record.seen)})"
    assert fail_rate or not any(record.seen[case] for case in FAILURES[:2])
