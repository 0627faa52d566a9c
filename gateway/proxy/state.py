"""One ``ProxyState`` per process: the config snapshot and its poller, the endpoint runtimes, the pooled
upstream client, the rate limiter, the usage writer, the replica metrics scraper and the demand publisher.
Created lazily on the first request (Channels' router has no lifespan hook)."""

from __future__ import annotations

import asyncio
import atexit
import gc
import json
import logging
import os
import socket
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import aiohttp
import redis
import redis.asyncio as aioredis
from django.conf import settings
from django.db import close_old_connections

from billing.ingest import UsageWriter
from billing.statements import prices
from endpoints.config_version import ALL, ALL_KEY, CONFIG_KEY, VERSION_CHANNEL, VERSION_KEY
from gateway.admission.shares import fair_share
from gateway.metrics_scraper import MetricsScraper
from gateway.proxy import profiling
from gateway.proxy.budgets import Budgets
from gateway.proxy.caps import lower_caps_of
from gateway.proxy.config import ProxyConfig, load_config
from gateway.proxy.isolation import CacheSalts
from gateway.proxy.limits import RateLimiter
from gateway.proxy.membership import FULL_BEAT_EVERY, HEARTBEAT, LEAVE, MEMBERS_KEY, ShareBook, parse_members
from gateway.proxy.prompt_tokens import TokenizerCache
from gateway.proxy.replica_adapters import LORA_REPORT_KEY, lora_report, read_engine_adapters, unload_stale
from gateway.proxy.reports import OwnReports
from gateway.proxy.runtime import EndpointRuntime
from gateway.proxy.scrape_client import KeepAliveScrapeClient
from gateway.proxy.snapshot import Snapshot
from gateway.proxy.snapshot_refresh import Stamps, refresh, refresh_plan, refresh_times

log = logging.getLogger(__name__)

DEMAND_KEY = "infercap:demand:{endpoint_id}"
DEMAND_TTL_S = 5
DEMAND_STALE_S = 30.0
DEMAND_PRUNE_EVERY = 30  # publish cycles
LORA_REPORT_TTL_S = 120  # a load churn window outlives a short pause of the proxies


def upstream_session() -> aiohttp.ClientSession:
    """The data-plane client to the replicas. No cookie jar: a cookie one answer set would ride on every later
    request to that replica, whichever tenant sent it (and filtering the jar cost CPU on every request)."""
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=30, ttl_dns_cache=300)
    return aiohttp.ClientSession(
        connector=connector,
        auto_decompress=False,
        skip_auto_headers=("User-Agent",),
        cookie_jar=aiohttp.DummyCookieJar(),
    )


def _refresh_in_thread(snap: Snapshot | None, kind: str, stamps: Stamps | None) -> Snapshot:
    close_old_connections()
    try:
        return refresh(snap, kind, stamps)
    finally:
        close_old_connections()


class ProxyState:
    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        # Every proxy process derives the same salts from the deployment's secret (no secret: no proxy).
        self.cache_salts = CacheSalts(
            getattr(settings, "INFERCAP", {}).get("CACHE_SALT_SECRET") or settings.SECRET_KEY
        )
        self.process_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.members_key = MEMBERS_KEY  # the membership hash (a bench gives its own)
        self.snapshot: Snapshot | None = None
        self.runtimes: dict[int, EndpointRuntime] = {}
        self.session: aiohttp.ClientSession | None = None
        self.redis = None
        self.limiter: RateLimiter | None = None
        self.budgets: Budgets | None = None
        self.usage = None
        self.scraper = None
        self._db = ThreadPoolExecutor(max_workers=1, thread_name_prefix="proxy-snapshot")
        # Prompts tokenized for the precise prefix index (``stages.prompt_tokens``): tokenizers loaded once per
        # model, long prompts encoded off the event loop.
        self.tokenizers = TokenizerCache()
        self.tokenize_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="proxy-tokenize")
        self._tasks: list[asyncio.Task] = []
        self.background: set[asyncio.Task] = set()
        self._config_changed = asyncio.Event()  # set by a published config change: reload without waiting the poll
        self._refresh_times = refresh_times(config.snapshot_fallback_reload_s)
        self.members: dict | None = None  # the last heartbeat read (None: no Redis, this process has whole limits)
        self._heartbeat = None
        self._beat_lock = asyncio.Lock()
        self._book = ShareBook()  # what this process may run, holds and asks for per replica
        self._own = OwnReports()  # what it runs and queues per replica, and their limits, for the heartbeat
        self._resend_all = False  # the next beat asks for every replica (after a failed one)
        self._beat_pending = False  # a beat asked for by ``_ask_beat`` has not started yet
        self._beats = 0
        self._beat_failing = False  # the last heartbeat could not reach Redis

    async def start(self) -> None:
        # The usage writer and snapshot loader are threads: with CPython's default 5 ms GIL switch interval the
        # event loop could wait that long behind an ORM batch before relaying a token.
        sys.setswitchinterval(min(sys.getswitchinterval(), 0.001))

        loop = asyncio.get_running_loop()
        if settings.REDIS_URL:
            # A bounded pool: a burst of requests shares a few connections instead of opening one each
            # (which, on a busy host, turns into connect timeouts and a tripped breaker).
            pool = aioredis.BlockingConnectionPool.from_url(
                settings.REDIS_URL,
                max_connections=32,
                timeout=1.0,
                socket_connect_timeout=1.0,
                socket_timeout=1.0,
                health_check_interval=30,
            )
            self.redis = aioredis.Redis(connection_pool=pool)
        self.limiter = RateLimiter(self.redis, fail_mode=self.config.rate_limit_fail_mode)
        # Spend is MU at the usage (overage) price, the rate a statement charges beyond a reservation.
        self.budgets = Budgets(self.redis, usd_per_mu=prices()[1] / 1000.0, spawn=self.spawn)
        profile = profiling.start_from_env()  # INFERCAP_PROXY_PROFILE: an operator's CPU profile of this worker
        if profile is not None:
            self._tasks.append(loop.create_task(profiling.keep_writing(profile), name="proxy-profile"))
        # The snapshot first: if the database is unreachable this raises before anything else is started.
        stamps = await self._read_stamps()
        self.snapshot = await loop.run_in_executor(self._db, _refresh_in_thread, None, ALL, stamps)
        # The data-plane client is aiohttp: httpx collapsed at 256 streams where aiohttp held (docs/request-path.md).
        self.session = upstream_session()
        self.usage = UsageWriter(flush_s=self.config.usage_flush_s, batch=self.config.usage_batch)
        self.usage.start()
        self._scraper_start()
        self._tasks.append(loop.create_task(self._poll_snapshot(), name="proxy-snapshot-poll"))
        if self.redis is not None:
            self._tasks.append(loop.create_task(self._listen_config(), name="proxy-config-listen"))
        self._tasks.append(loop.create_task(self._publish_demand(), name="proxy-demand"))
        self._tasks.append(loop.create_task(self._sync_adapters(), name="proxy-lora-sync"))
        if self.redis is not None:
            self._heartbeat = self.redis.register_script(HEARTBEAT)
            atexit.register(self._leave_sync)
            try:
                await self._beat()  # a lone process starts with the whole limits, not after one interval
            except Exception as exc:  # noqa: BLE001 - Redis away: start with the whole limits, join when it is back
                log.warning("proxy membership heartbeat failed at start-up: %s", exc)
        self._tasks.append(loop.create_task(self._housekeeping(), name="proxy-housekeeping"))

    def _scraper_start(self) -> None:
        raw = os.environ.get("INFERCAP_PROXY_SCRAPE_INTERVAL_S", "0.1")
        try:
            interval = min(10.0, max(0.01, float(raw)))
        except ValueError:
            interval = 0.1
        if str(interval) != raw and raw != "0.1":
            log.warning("INFERCAP_PROXY_SCRAPE_INTERVAL_S=%r: using %s s (allowed 0.01–10)", raw, interval)
        self._scrape_client = KeepAliveScrapeClient()
        self.scraper = MetricsScraper(
            interval_s=interval,
            client=self._scrape_client,
            idle_after_s=self.config.scrape_idle_s,
            budget_per_s=self.config.scrape_budget_per_s,
        )
        self.scraper.warn_cadence_s = self.config.metrics_stale_s / 2
        self.scraper.start()

    # -- snapshot ------------------------------------------------------------------------------------
    async def _read_stamps(self) -> Stamps | None:
        """The config counters (``endpoints.config_version``); None without Redis or while it is unreachable."""
        if self.redis is None:
            return None
        try:
            raw = await self.redis.mget(VERSION_KEY, CONFIG_KEY, ALL_KEY)
        except Exception:  # noqa: BLE001
            return None
        return Stamps(*(value.decode() if value else "0" for value in raw))

    async def _poll_snapshot(self) -> None:
        """Refresh the snapshot as ``snapshot_refresh.refresh_plan`` says: on a published change (or one the poll
        finds), and periodically as a safety net; with Redis unreachable, from PostgreSQL every
        ``snapshot_fallback_reload_s``."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                await asyncio.wait_for(self._config_changed.wait(), self.config.snapshot_poll_s)
            except TimeoutError:
                pass
            self._config_changed.clear()
            try:
                stamps = await self._read_stamps()
                kind = refresh_plan(self.snapshot, stamps, now=time.time(), times=self._refresh_times)
                if kind is not None:
                    snap = await loop.run_in_executor(self._db, _refresh_in_thread, self.snapshot, kind, stamps)
                    self.apply_snapshot(snap)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - keep serving the last good snapshot
                log.exception("proxy snapshot reload failed; keeping version %s", self.snapshot.version)

    async def _listen_config(self) -> None:
        """Wake the poller as soon as a config change is published, so an edit reaches this process in
        milliseconds rather than up to a poll interval later; the poll stays as the fallback (missed messages,
        Redis restarts)."""
        while True:
            pubsub = self.redis.pubsub()
            try:
                await pubsub.subscribe(VERSION_CHANNEL)
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if message is not None:
                        self._config_changed.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - Redis away: the poll still reloads; subscribe again later
                log.debug("config change listener: %s", exc)
                await asyncio.sleep(1.0)
            finally:
                try:
                    await pubsub.aclose()
                except Exception:  # noqa: BLE001
                    pass

    def apply_snapshot(self, snap: Snapshot) -> None:
        before, self.snapshot = self.snapshot, snap
        if (
            before is not None
            and snap.endpoints_by_name is before.endpoints_by_name
            and snap.adapters_by_name is before.adapters_by_name
        ):
            return  # only keys changed (``snapshot_refresh``): the runtimes and scrape targets stand
        by_id = {e.id: e for e in snap.endpoints_by_name.values()}
        for eid, runtime in list(self.runtimes.items()):
            info = by_id.get(eid)
            if info is None:
                if runtime.in_flight == 0 and not len(runtime.queue):
                    del self.runtimes[eid]
                    runtime.kv_feeds.sync(())  # its subscribers are told to stop (joined at shutdown)
                continue
            runtime.update(info)
            runtime.set_adapters(snap.endpoint_adapters(info.name))
            runtime.set_adapter_history(snap.adapter_rates(info.name))
        self._sync_scrape_targets()
        self._apply_caps()

    def runtime_for(self, info) -> EndpointRuntime:
        runtime = self.runtimes.get(info.id)
        if runtime is None:
            runtime = self.runtimes[info.id] = EndpointRuntime(info, config=self.config, scraper=self.scraper)
            if self.snapshot is not None:
                runtime.set_adapters(self.snapshot.endpoint_adapters(info.name))
                runtime.set_adapter_history(self.snapshot.adapter_rates(info.name))
            self._sync_scrape_targets()
            self._apply_caps(runtime)
        return runtime

    async def _sync_adapters(self) -> None:
        """Every ``lora_sync_s``: the adapters each LoRA replica's engine lists (``lora.py``), so the ones other
        proxy processes loaded, or the engine was started with, count in its slots here too; what it holds under a
        name no adapter has now (deleted, an older artifact version) is unloaded once idle."""
        while True:
            await asyncio.sleep(self.config.lora_sync_s)
            try:
                await asyncio.gather(
                    *(
                        self._sync_replica_adapters(runtime, slot)
                        for runtime in list(self.runtimes.values())
                        if runtime.info.max_loras
                        for slot in list(runtime.slots.values())
                        if not slot.removed
                    )
                )
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the next round tries again; the proxy's own loads still count
                log.exception("LoRA adapter sync failed")

    async def _sync_replica_adapters(self, runtime: EndpointRuntime, slot) -> None:
        base = slot.rename.engine if slot.rename is not None else runtime.info.name
        read_since = runtime.clock()
        found = await read_engine_adapters(self.session, slot.url, base)
        if found is None:
            return
        replica = runtime.adapters_of(slot)
        replica.sync_from_models(found, read_since)
        stale = await unload_stale(
            self.session,
            url=slot.url,
            replica=replica,
            current=runtime.engine_adapter_names(),
            endpoint_name=runtime.info.name,
        )
        if stale:
            log.info("replica %s: unloaded adapters no longer served: %s", slot.name, ", ".join(stale))

    # -- sharing replica slots with the other proxy processes --------------------------------------------
    async def _housekeeping(self) -> None:
        """Every ``member_interval_s``: write the in-flight gauges that changed, return lapsed rate-limit leases
        and heartbeat the membership."""
        while True:
            await asyncio.sleep(self.config.member_interval_s)
            for runtime in self.runtimes.values():
                runtime.flush_gauges()
                if self.scraper is not None and len(runtime.queue):  # requests waiting for a slot: keep it seen
                    self.scraper.note(runtime.slots)
            if self.redis is None:
                continue
            try:
                await self.limiter.sweep()  # lapsed rate-limit leases go back to the shared buckets
                await self._beat()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - Redis away: keep the last caps (nobody can see a change)
                log.debug("proxy membership heartbeat failed: %s", exc)

    async def _beat(self) -> None:
        """One membership heartbeat (``gateway.admission.shares``): from the last read, with this process's own
        current streams and queue, compute its allocation; stop admitting beyond it at once; ask to hold
        ``max(allocation, what runs)`` and admit up to what the script grants. Beats never overlap."""
        async with self._beat_lock:
            try:
                await self._beat_locked()
            except Exception:
                # The script may have run and its answer been lost: what Redis holds for this process is unknown, so
                # the next beat asks again for every replica.
                self._resend_all = True
                if not self._beat_failing:
                    self._beat_failing = True
                    self._apply_caps()  # replicas nobody holds yet fall back to an even share
                raise

    async def _beat_locked(self) -> None:
        self._beat_pending = False  # a beat starting now covers what was asked before it
        full = self._resend_all or self._beats % FULL_BEAT_EVERY == FULL_BEAT_EVERY - 1
        flight_moved, demand_moved = self._own.refresh(self._slot_pools(), whole=full)
        in_flight, limits = self._own.in_flight, self._own.limits
        parts = {name: dict(part) for name, part in self._own.parts.items()}  # the book keeps them: copies
        view = dict(self.members or {})
        me = view.get(self.process_id)
        book, beat = self._book, self._beats
        base, moves = book.sending(beat, parts["demand"], demand_moved)
        if me is not None:
            view[self.process_id] = replace(
                me, **parts, beat=beat, moved_since=None if moves is None else (base, moves)
            )
        self._beats += 1
        # Caps applied if this beat fails follow the new allocation; the pools none of whose replicas saw it or the
        # holdings move keep theirs.
        touched, shifted = book.allocate(self.process_id, view, limits, full=full)
        allocation, shifted = book.allocation, set(shifted)
        pools = self._slot_pools()
        lower_caps_of(self._own.pools_of, allocation, shifted)
        changes = book.changes(in_flight, limits, touched, full, flight_moved)
        raw = await self._heartbeat(
            keys=[self.members_key],
            args=[
                self.process_id,
                json.dumps(changes, separators=(",", ":")),
                *(self._own.encoded(k) for k in ("demand", "critical", "sheddable")),
                repr(self.config.member_ttl_s),
                json.dumps({rid: limits.get(rid, 0) for rid in changes}, separators=(",", ":")),
                "1" if full else "0",
                str(beat),
                str(base),
                json.dumps(moves or {}, separators=(",", ":")),
            ],
        )
        entries, grants, reset = raw
        # Redis answered: caps from holdings again, not even shares (on every replica: an outage gave even shares
        # to replicas nothing moved on since).
        everything = bool(int(reset)) or self.members is None or self._beat_failing
        self._beat_failing = self._resend_all = False
        grants = json.loads(grants)
        book.granted(grants, changes, limits, reset=bool(int(reset)))
        if int(reset) and not allocation.keys() <= changes.keys():  # asked for only some replicas: ask for all
            self._resend_all = True
            self._ask_beat()
        shifted.update(grants)
        members = parse_members(entries, book.known)
        members[self.process_id] = replace(members[self.process_id], holdings=book.holdings)
        self.members = members
        known = set(pools)
        fresh = [pool for pool in self._slot_pools() if pool not in known]  # made while the script ran
        if fresh:
            self._apply_caps(pools=fresh)
            self._ask_beat()  # their replicas were not asked for
        self._apply_caps(only=None if everything else shifted)

    def _apply_caps(self, runtime: EndpointRuntime | None = None, pools=None, only=None) -> None:
        """Each runtime admits up to the smaller of what this process holds and its allocation per replica. A
        replica it was never granted anything of gets 0 until the next beat, which is asked for at once; while
        Redis is unreachable (no beat can grant anything), such a replica gets this process's even share by the
        last membership read, as every other process computes it (a replica another process was granted before
        Redis went away may then run over its limit by that share until Redis is back: the others' holdings are
        read in Redis, per changed replica, not copied to every process). Without Redis at all the caps stay off:
        whole limits. ``runtime``: that one's pools only; ``pools``: those only; ``only``: those replicas alone, in
        the pools with a slot on them at the last beat (``OwnReports.pools_of``: a beat's, whose allocation or
        holding moved there)."""
        if self.members is None:
            return
        mine = self.members.get(self.process_id)
        holdings = mine.holdings if mine is not None else {}
        ids = list(self.members) if mine is not None else [*self.members, self.process_id]
        missing = False
        allocation, failing = self._book.allocation, self._beat_failing
        for rt, rids in self._caps_work(runtime, pools, only):
            caps = {}
            merge = rids is not None and rt.caps is not None
            slots = rt.slots
            for rid in rids if merge else slots:
                slot = slots[rid]
                have = holdings.get(rid)
                if have is not None:
                    share = allocation.get(rid)
                    caps[rid] = have if share is None or share >= have else share
                    continue
                caps[rid] = fair_share(slot.limit, ids, self.process_id) if failing else 0
                missing = missing or not slot.removed
            rt.apply_caps(caps, merge=merge)
        if missing and self.redis is not None and not self._beat_failing and not self._beat_lock.locked():
            self._ask_beat()

    def _caps_work(self, runtime, pools, only) -> list:
        """``_apply_caps``'s (pool, its replicas to cap: None for all) pairs."""
        if only is None:
            return [(rt, None) for rt in (self._slot_pools(runtime) if pools is None else pools)]
        by_pool: dict = {}
        pools_of = self._own.pools_of
        for rid in only:
            for pool in pools_of.get(rid, ()):
                if rid in pool.slots:
                    by_pool.setdefault(pool, []).append(rid)
        return list(by_pool.items())

    def _ask_beat(self) -> None:
        """A beat now, beside the housekeeping's (one at a time: asking again while one is pending adds none)."""
        if not self._beat_pending:
            self._beat_pending = True
            self.spawn(self._beat_soon())

    def _slot_pools(self, runtime: EndpointRuntime | None = None) -> list:
        """What holds replica slots shared by the heartbeat: each runtime (its admission replicas) and a
        disaggregated endpoint's prefill pool (docs/request-path.md); ``runtime``: that one's only."""
        pools = []
        for rt in [runtime] if runtime is not None else list(self.runtimes.values()):
            pools.append(rt)
            if rt.prefill_pool is not None:
                pools.append(rt.prefill_pool)
        return pools

    async def _beat_soon(self) -> None:
        try:
            await self._beat()
        except Exception as exc:  # noqa: BLE001 - the housekeeping beat retries
            log.debug("proxy membership heartbeat failed: %s", exc)

    def _leave_sync(self) -> None:
        """At exit (uvicorn runs without a lifespan here, so no async shutdown hook): leave the group at once,
        so the others take over this share now rather than after the TTL."""
        try:
            client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=0.5, socket_timeout=0.5)
            client.eval(LEAVE, 1, self.members_key, self.process_id)
            client.close()
        except Exception:  # noqa: BLE001 - the TTL removes it anyway
            pass

    def _sync_scrape_targets(self) -> None:
        if self.scraper is None:
            return
        targets = {}
        for runtime in self.runtimes.values():
            targets.update(runtime.scrape_targets())
        self.scraper.set_targets(targets)

    # -- demand for the autoscaler and the console ------------------------------------------------------
    async def _publish_demand(self) -> None:
        cycle = 0
        while True:
            await asyncio.sleep(self.config.demand_interval_s)
            if self.redis is None or not self.runtimes:
                continue
            now = time.time()
            cycle += 1
            try:
                if cycle % DEMAND_PRUNE_EVERY == 0:
                    await self._prune_demand(now)
                pipe = self.redis.pipeline(transaction=False)
                for eid, runtime in self.runtimes.items():
                    key = DEMAND_KEY.format(endpoint_id=eid)
                    pipe.hset(key, self.process_id, json.dumps({"t": round(now, 3), **runtime.demand()}))
                    pipe.expire(key, DEMAND_TTL_S)
                    if runtime.adapters:  # LoRA endpoints only; the console reads it (console.adapter_churn)
                        lora_key = LORA_REPORT_KEY.format(endpoint_id=eid)
                        pipe.hset(
                            lora_key,
                            self.process_id,
                            json.dumps(lora_report(runtime.adapters, now, runtime.engine_adapter_names())),
                        )
                        pipe.expire(lora_key, LORA_REPORT_TTL_S)
                await pipe.execute()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - demand is advisory; the autoscaler tolerates gaps
                log.debug("demand publish failed: %s", exc)

    async def _prune_demand(self, now: float) -> None:
        """Drop fields left by processes that died: readers skip them anyway, but the hash must not grow forever."""
        for key in [k.format(endpoint_id=eid) for eid in list(self.runtimes) for k in (DEMAND_KEY, LORA_REPORT_KEY)]:
            stale = []
            for field, raw in (await self.redis.hgetall(key)).items():
                try:
                    if now - float(json.loads(raw).get("t", 0)) > DEMAND_STALE_S:
                        stale.append(field)
                except (ValueError, TypeError, AttributeError):
                    stale.append(field)
            if stale:
                await self.redis.hdel(key, *stale)

    def spawn(self, coro) -> None:
        """Fire and forget, keeping a reference so the task is not garbage collected mid-flight."""
        task = asyncio.get_running_loop().create_task(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def close(self) -> None:
        for task in [*self._tasks, *self.background]:  # no beat may land after this process has left
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
        for runtime in self.runtimes.values():
            runtime.close()
        self.tokenize_pool.shutdown(wait=False)
        if self.scraper is not None:
            await self.scraper.stop()
            await self._scrape_client.aclose()
        if self.usage is not None:
            await self.usage.close()
        if self.session is not None:
            await self.session.close()
        if self.redis is not None:
            try:
                await self.redis.eval(LEAVE, 1, self.members_key, self.process_id)
            except Exception:  # noqa: BLE001 - the TTL removes it anyway
                pass
            await self.redis.aclose()


_state: ProxyState | None = None
_state_lock: asyncio.Lock | None = None


async def get_state() -> ProxyState:
    global _state, _state_lock
    if _state is not None:
        return _state
    if _state_lock is None:
        _state_lock = asyncio.Lock()
    async with _state_lock:
        if _state is None:
            state = ProxyState(load_config())
            try:
                await state.start()
            except BaseException:
                await state.close()  # the next request tries again from scratch
                raise
            _state = state
            # Everything loaded so far (Django, the app modules, the snapshot) lives as long as the process:
            # moved out of the collector's view, a full collection no longer walks ~100k objects and pauses
            # the event loop for tens of milliseconds (a TTFT p99 spike) every time it runs.
            gc.collect()
            gc.freeze()
    return _state
