"""Usage ingestion off the request path: the proxy hands each finished request's record to a
``UsageWriter``, which inserts them in batches (``INSERT … ON CONFLICT (request_id) DO NOTHING``, so a
record delivered twice is stored once).

When PostgreSQL is unreachable a batch is spooled, to a Redis stream when Redis answers, else to a local
JSON-lines file under ``INFERCAP["SPOOL_DIR"]``; every later flush first drains the spool into
PostgreSQL, deleting spooled entries only after their insert committed. Nothing is lost as long as the
spool survives; a crash between insert and delete only re-delivers, which the unique request id absorbs.
``drain_spool()`` can also be called from any process (e.g. a periodic task).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import redis
from django.conf import settings
from django.db import (
    IntegrityError,
    InterfaceError,
    OperationalError,
    close_old_connections,
    connection,
    transaction,
)
from django.utils import timezone

from billing.models import UsageRecord
from tenants.models import ApiKey

log = logging.getLogger(__name__)

STREAM_KEY = "infercap:usage:spool"
TOUCH_EVERY_S = 30.0  # how stale a key's last_used_at may be (KeyTouches)
DRAIN_BATCH = 500
_DB_DOWN_ERRORS = (OperationalError, InterfaceError)
_FK_FIELDS = ("replica_id", "api_key_id", "endpoint_id")
_TIME_FIELDS = ("started_at", "finished_at")
STAGING_TABLE = "billing_usage_staging"


def _to_model(record: dict):
    data = dict(record)
    for name in _TIME_FIELDS:
        value = data.get(name)
        if isinstance(value, (int, float)):
            data[name] = datetime.fromtimestamp(value, tz=UTC)
    return UsageRecord(**data)


def insert_records(records: list[dict]) -> None:
    """Insert idempotently, one statement per batch (records already stored are skipped by the unique request id).
    Raises OperationalError when the DB is down."""
    if not records:
        return
    try:
        with transaction.atomic():  # a savepoint: the lenient path below still runs inside a caller's transaction
            if not _insert_columnar(records):
                UsageRecord.objects.bulk_create([_to_model(r) for r in records], ignore_conflicts=True)
    except IntegrityError:
        # A replica, key or endpoint was deleted since the request ran: keep the record, drop the dangling link.
        for record in records:
            _insert_one_lenient(record)


def _insert_columnar(records: list[dict]) -> bool:
    """PostgreSQL: the batch COPied into this session's staging table, then one ``INSERT … SELECT … ON CONFLICT
    DO NOTHING`` from it, with no model instance built: about four times ``bulk_create``'s rate (``bench scale``,
    benchmarks/README.md). False, having done nothing, on another database or when a record names something that
    is not a column."""
    if connection.vendor != "postgresql":
        return False
    fields = _insert_fields()
    known = {f.attname for f in fields} | {f.name for f in fields}
    if any(not known.issuperset(record) for record in records):
        return False
    quote = connection.ops.quote_name
    names = ", ".join(quote(f.column) for f in fields)
    table = quote(UsageRecord._meta.db_table)
    with connection.cursor() as cursor:
        # Per session, kept between batches; emptied after each (a caller's transaction may span several).
        cursor.execute(
            f"CREATE TEMP TABLE IF NOT EXISTS {STAGING_TABLE} ON COMMIT DELETE ROWS AS "
            f"SELECT {names} FROM {table} WITH NO DATA"
        )
        with cursor.cursor.copy(f"COPY {STAGING_TABLE} ({names}) FROM STDIN") as copy:
            for row in _rows(records, fields):
                copy.write_row(row)
        cursor.execute(
            f"INSERT INTO {table} ({names}) SELECT {names} FROM {STAGING_TABLE} "
            f"ON CONFLICT ({quote('request_id')}) DO NOTHING"
        )
        cursor.execute(f"DELETE FROM {STAGING_TABLE}")
    return True


def _rows(records: list[dict], fields: list) -> list[tuple]:
    """Each record's values in column order: by column name (``tenant_id``) or field name (``tenant``, a model or
    its key), else the field's default (taken once per batch: ``created_at`` is the batch's insert time); unix
    seconds become aware datetimes."""
    by_column = [(f.attname, f.get_default()) for f in fields]
    by_name = {f.name: f.attname for f in fields if f.name != f.attname}
    times = [i for i, f in enumerate(fields) if f.attname in _TIME_FIELDS]
    rows = []
    for record in records:
        if not by_name.keys().isdisjoint(record):
            record = {by_name.get(k, k): getattr(v, "pk", v) if k in by_name else v for k, v in record.items()}
        row = [record.get(attname, default) for attname, default in by_column]
        for i in times:
            if isinstance(row[i], (int, float)):
                row[i] = datetime.fromtimestamp(row[i], tz=UTC)
        rows.append(tuple(row))
    return rows


def _insert_fields() -> list:
    return [f for f in UsageRecord._meta.concrete_fields if not f.primary_key]


def _insert_one_lenient(record: dict) -> None:
    data = dict(record)
    for fk in (None, *_FK_FIELDS):
        if fk:
            data[fk] = None
        try:
            UsageRecord.objects.bulk_create([_to_model(data)], ignore_conflicts=True)
            return
        except IntegrityError:
            continue
    log.error("usage record %s dropped: its tenant no longer exists", record.get("request_id"))


class Spool:
    """Where records wait while PostgreSQL is down: a Redis stream, else a local file."""

    def __init__(self, *, redis_url: str = "", spool_dir: str | None = None) -> None:
        self.redis_url = redis_url
        self.dir = Path(spool_dir or settings.INFERCAP["SPOOL_DIR"])
        self._redis = None
        self._file = self.dir / f"usage-{os.getpid()}-{int(time.time() * 1000)}.jsonl"

    def _client(self):
        if self._redis is None and self.redis_url:
            self._redis = redis.Redis.from_url(self.redis_url, socket_connect_timeout=0.5, socket_timeout=2)
        return self._redis

    def put(self, records: list[dict]) -> str:
        """Returns where the records went: "redis" or "file"."""
        client = self._client()
        if client is not None:
            try:
                pipe = client.pipeline(transaction=False)
                for r in records:
                    pipe.xadd(STREAM_KEY, {"r": json.dumps(r)})
                pipe.execute()
                return "redis"
            except Exception as exc:  # noqa: BLE001 - fall through to the file
                log.warning("usage spool: Redis unavailable (%s); spooling to %s", exc, self._file)
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self._file, "a", encoding="utf-8") as fh:
            for r in records:
                fh.write(json.dumps(r) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        return "file"

    def pending(self) -> int:
        n = 0
        client = self._client()
        if client is not None:
            try:
                n += int(client.xlen(STREAM_KEY))
            except Exception:  # noqa: BLE001
                pass
        if self.dir.exists():
            for path in self.dir.glob("usage-*.jsonl*"):
                with open(path, encoding="utf-8") as fh:
                    n += sum(1 for line in fh if line.strip())
        return n

    def drain(self) -> int:
        """Move spooled records into PostgreSQL; returns how many were moved. Raises when the DB is down."""
        moved = 0
        client = self._client()
        if client is not None:
            try:
                entries = client.xrange(STREAM_KEY, count=DRAIN_BATCH)
            except Exception:  # noqa: BLE001 - Redis down: nothing to drain from it now
                entries = []
            while entries:
                insert_records([json.loads(fields[b"r"]) for _, fields in entries])
                client.xdel(STREAM_KEY, *[entry_id for entry_id, _ in entries])
                moved += len(entries)
                entries = client.xrange(STREAM_KEY, count=DRAIN_BATCH)
        if self.dir.exists():
            for path in sorted(self.dir.glob("usage-*.jsonl")):
                claimed = path.with_suffix(f".jsonl.claimed-{os.getpid()}")
                try:
                    path.rename(claimed)  # atomic: only one process drains a file
                except FileNotFoundError:
                    continue
                moved += self._drain_file(claimed)
            for claimed in self.dir.glob(f"usage-*.jsonl.claimed-{os.getpid()}"):
                moved += self._drain_file(claimed)
        return moved

    def _drain_file(self, path: Path) -> int:
        with open(path, encoding="utf-8") as fh:
            records = [json.loads(line) for line in fh if line.strip()]
        for i in range(0, len(records), DRAIN_BATCH):
            insert_records(records[i : i + DRAIN_BATCH])
        path.unlink()
        return len(records)


def drain_spool(*, redis_url: str | None = None) -> int:
    """Drain every spooled usage record into PostgreSQL (any process may call this)."""
    return Spool(redis_url=settings.REDIS_URL if redis_url is None else redis_url).drain()


class UsageWriter:
    """Batches records from the event loop and writes them on one dedicated thread."""

    def __init__(
        self,
        *,
        flush_s: float = 0.25,
        batch: int = 500,
        redis_url: str | None = None,
        touch_every_s: float = TOUCH_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.flush_s = flush_s
        self.batch = batch
        self._touched = KeyTouches(every_s=touch_every_s, clock=clock)
        self.spool = Spool(redis_url=settings.REDIS_URL if redis_url is None else redis_url)
        self._buffer: list[dict] = []
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="usage-writer")
        self._spooled = _quick_spool_check(self.spool)
        self._task: asyncio.Task | None = None
        self._closing = False
        self._wake = asyncio.Event()
        self.written = 0
        self.spooled_total = 0

    def submit(self, record: dict) -> None:
        """Non-blocking: called on the request path."""
        self._buffer.append(record)
        if len(self._buffer) >= self.batch:
            self._wake.set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="usage-writer")

    async def _run(self) -> None:
        # Python 3.11's ``wait_for`` swallows a cancellation that lands as the event it waits on fires (a full
        # batch submitted just before ``close``): the flag still ends the loop, where the cancel alone hung close.
        while not self._closing:
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self.flush_s)
            except TimeoutError:
                pass
            self._wake.clear()
            await self.flush()

    async def flush(self) -> None:
        if not self._buffer and not self._spooled:
            return
        batch, self._buffer = self._buffer, []
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._write, batch)

    def _write(self, batch: list[dict]) -> None:
        close_old_connections()
        try:
            if self._spooled:
                moved = self.spool.drain()
                self._spooled = False
                if moved:
                    log.info("usage spool: drained %d records into PostgreSQL", moved)
            if batch:
                insert_records(batch)
                self.written += len(batch)
                self._touched.touch(batch)
        except _DB_DOWN_ERRORS as exc:
            connection.close_if_unusable_or_obsolete()
            try:
                connection.close()
            except Exception:  # noqa: BLE001
                pass
            if batch:
                where = self.spool.put(batch)
                self.spooled_total += len(batch)
                log.warning("usage: PostgreSQL unavailable (%s); spooled %d records to %s", exc, len(batch), where)
            self._spooled = True

    async def close(self) -> None:
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
            self._task = None
        await self.flush()
        # The writer thread owns its own connection; close it there so the database sees no stray session.
        await asyncio.get_running_loop().run_in_executor(self._executor, lambda: connection.close())
        self._executor.shutdown(wait=True)


class KeyTouches:
    """Keys' ``last_used_at`` for the console: one UPDATE for a batch's keys, each key at most once every ``every_s``
    per writer (every 0.25 s flush wrote one before, and a busy proxy's UPDATEs cost as much as its inserts). ``update``
    sends no signal, so the proxies' config snapshot is not invalidated by traffic."""

    def __init__(self, *, every_s: float, clock: Callable[[], float]) -> None:
        self.every_s, self.clock = every_s, clock
        self._at: dict[int, float] = {}
        self.updates = 0

    def touch(self, records: list[dict]) -> None:
        now = self.clock()
        ids = {r["api_key_id"] for r in records if r.get("api_key_id")}
        due = sorted(i for i in ids if now - self._at.get(i, float("-inf")) >= self.every_s)
        if not due:
            return
        ApiKey.objects.filter(pk__in=due).update(last_used_at=timezone.now())
        self.updates += 1
        for key_id in due:
            self._at[key_id] = now
        if len(self._at) > 100_000:  # keys long idle: forget them (they are touched again on their next use)
            self._at = {k: at for k, at in self._at.items() if now - at < self.every_s}


def _quick_spool_check(spool: Spool) -> bool:
    # At start-up something may have been spooled by an earlier process; check cheaply once.
    try:
        return spool.pending() > 0
    except Exception:  # noqa: BLE001
        return False
