"""Run the platform's real processes for fault injection: the proxy (uvicorn on ``config.asgi``), a
Celery worker with embedded beat, and simulated replicas started by the local actuator. PostgreSQL
and Redis are reached through ``TcpRelay``s so a scenario can cut either without touching the servers.

The harness seeds its own tenant, keys and endpoint (unique names), and ``usage_books()`` compares
the request ids that clients saw (every proxy response carries ``x-request-id``) with the usage
records in PostgreSQL: lost = seen but never recorded, duplicated = recorded more than once or
recorded without a client having seen it.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
from django.conf import settings
from django.db.models import Count

from benchmarks.harness.reliability.chaos import TcpRelay
from billing.models import UsageRecord
from capacity.autoscaling.actuators import get_actuator
from capacity.autoscaling.services import reconcile
from capacity.runtimes.processes import celery_worker_argv, database_url, free_port
from capacity.services import simulated_profiles_get_or_create
from endpoints.models import Endpoint, Replica, ReplicaState, Runtime
from tenants.models import CapacityReservation, PriorityClass, Tenant
from tenants.services import api_key_create

ROOT = Path(__file__).resolve().parents[3]


@dataclass
class Outcome:
    request_id: str | None
    priority: str
    status: int  # HTTP status; 0 when no response arrived
    started: float
    ttft_s: float | None = None
    ended: float | None = None
    tokens: int = 0
    error_event: bool = False
    done: bool = False
    retry_after: str | None = None
    error: str | None = None
    tenant: str = ""
    fallback_from: str | None = None  # x-infercap-fallback-from: served by the named endpoint's fallback
    degraded: bool = False  # x-infercap-degraded: served shorter
    code: str | None = None  # a refusal's OpenAI-shaped error code (queue_age, overloaded, evicted, rate_limit…)


def error_code(body: bytes) -> str | None:
    """The ``error.code`` of an OpenAI-shaped error body, if it is one."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return None
    code = error.get("code") if isinstance(error, dict) else None
    return str(code) if code is not None else None


@dataclass
class Seeded:
    tenant_id: int
    endpoint_id: int
    endpoint_name: str
    keys: dict[str, str]  # priority class → raw key
    fallback_id: int | None = None
    fallback_name: str | None = None
    tenant_keys: dict[str, str] = field(default_factory=dict)  # extra tenants (``extra_tenants``): name → raw key
    tenant_ids: dict[str, int] = field(default_factory=dict)


_free_port = free_port
database_url_from_connection = database_url


def peak_rss_mb(pid: int) -> float:
    """VmHWM: the process's peak resident set size."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


@dataclass
class Platform:
    progress: Callable[[str], None] = print
    replicas: int = 3
    concurrency_limit: int = 4
    # Real time (speed 1) and few slots: the replicas, not the shared CPU, must be the bottleneck in
    # the overload scenario, as they are in production.
    replica_speed: float = 1.0
    replica_profile: str = "llama-13b-a100"
    max_tokens: int = 32
    ttft_slo_ms: int = 2000
    tpot_slo_ms: int = 200
    health_idle_s: float = 1.0
    health_failures: int = 2
    health_ttft_timeout_s: float = 1.5
    with_worker: bool = True
    # Graceful degradation (the overload section): a fallback endpoint of this many replicas (0: none), its
    # replicas' speed and slots, the primary's degrade cap, and extra tenants: name → (priority class of its key,
    # reserved MU/min on the primary or None for best effort); every tenant accepts fallbacks.
    fallback_replicas: int = 0
    fallback_speed: float = 2.5
    fallback_concurrency: int = 8
    degrade_max_tokens: int | None = None
    degrade_slot_share: float | None = None  # the primary's (the fallback has none)
    extra_tenants: dict = field(default_factory=dict)
    extra_env: dict = field(default_factory=dict)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    worker_restarts: int = 0
    log_paths: dict[str, Path] = field(default_factory=dict)
    outcomes: list[Outcome] = field(default_factory=list)

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> Platform:
        if settings.BACKENDS.embedded_database or settings.BACKENDS.embedded_redis:
            raise RuntimeError("the reliability harness needs PostgreSQL and Redis (DATABASE_URL, REDIS_URL)")
        db_url = database_url_from_connection()
        redis_url = settings.REDIS_URL
        pg, rd = urlsplit(db_url), urlsplit(redis_url)
        self.pg_relay = TcpRelay(pg.hostname or "127.0.0.1", pg.port or 5432).start()
        self.redis_relay = TcpRelay(rd.hostname or "127.0.0.1", rd.port or 6379).start()
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "config.settings.production",
            "DJANGO_SECRET_KEY": secrets.token_urlsafe(48),
            "DJANGO_SECURE_SSL_REDIRECT": "0",
            "DATABASE_URL": self.pg_relay.url_for(db_url),
            "REDIS_URL": self.redis_relay.url_for(redis_url),
            "INFERCAP_QUIET": "1",
            "INFERCAP_VAR_DIR": str(ROOT / "var" / f"reliability-{os.getpid()}"),
            "INFERCAP_BROKER_VISIBILITY_TIMEOUT": "6",
            "INFERCAP_HEALTH_IDLE_S": str(self.health_idle_s),
            "INFERCAP_PROXY_BODY_TIMEOUT_S": "5",
            "INFERCAP_HEALTH_FAILURES": str(self.health_failures),
            "INFERCAP_HEALTH_TTFT_TIMEOUT_S": str(self.health_ttft_timeout_s),
            "PYTHONUNBUFFERED": "1",
            **self.extra_env,
        }
        self.seeded = self._seed()
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self._spawn(
            "proxy",
            [
                sys.executable,
                "-m",
                "uvicorn",
                "config.asgi:application",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--no-access-log",
                "--log-level",
                "warning",
            ],
        )
        if self.with_worker:
            self.start_worker()
            self._supervising = True
            threading.Thread(target=self._supervise_worker, name="worker-supervisor", daemon=True).start()
        self._launch_replicas()
        self._wait(lambda: self._http_ok(f"{self.base}/healthz"), 60, "proxy up")
        self._wait(lambda: self._reconciled() >= self.replicas, 90, f"{self.replicas} replicas ready")
        self._wait(self._proxy_serves, 30, "proxy serving the endpoint")
        return self

    def stop(self) -> None:
        self._supervising = False
        for name in list(self.procs):
            self.kill(name, sig=signal.SIGTERM)
        seeded = getattr(self, "seeded", None)
        ids = [seeded.endpoint_id, seeded.fallback_id] if seeded else []
        for endpoint in Endpoint.objects.filter(pk__in=[i for i in ids if i is not None]):
            live = list(endpoint.replicas.exclude(state=ReplicaState.STOPPED))
            if live:
                get_actuator(endpoint).terminate(live, reason="reliability harness stopped")
        if seeded:
            self._kill_strays(seeded.endpoint_name)
            if seeded.fallback_name:
                self._kill_strays(seeded.fallback_name)
        for relay in (getattr(self, "pg_relay", None), getattr(self, "redis_relay", None)):
            if relay is not None:
                relay.close()

    def __enter__(self) -> Platform:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

    def start_worker(self) -> None:
        schedule = ROOT / "var" / f"beat-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._spawn(
            "worker",
            celery_worker_argv(schedule, loglevel="ERROR", extra=("--without-gossip", "--without-mingle")),
        )

    @staticmethod
    def _kill_strays(endpoint_name: str) -> None:
        """Replicas started by a worker that was killed meanwhile are nobody's children: find them by name."""
        marker = f"--served-model-name\x00{endpoint_name}\x00".encode()
        for proc_dir in Path("/proc").iterdir():
            if not proc_dir.name.isdigit():
                continue
            try:
                if marker in (proc_dir / "cmdline").read_bytes() + b"\x00":
                    os.kill(int(proc_dir.name), signal.SIGKILL)
            except (OSError, ProcessLookupError):
                continue

    def _supervise_worker(self) -> None:
        """Restart the Celery worker when it exits on its own, as Kubernetes or systemd would: kombu's Redis
        transport can end the worker with an "Unrecoverable error" when the broker connection drops."""
        while self._supervising:
            proc = self.procs.get("worker")
            if proc is not None and proc.poll() is not None and self._supervising:
                self.worker_restarts += 1
                self.progress(f"Celery worker exited ({proc.returncode}); restarting it")
                self.start_worker()
            time.sleep(0.5)

    def kill(self, name: str, *, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=5)

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        log_dir = ROOT / "var" / "reliability-logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_paths[name] = log_dir / f"{name}-{os.getpid()}.log"
        out = open(self.log_paths[name], "ab")  # noqa: SIM115 (kept open for the child)
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.procs[name] = proc
        return proc

    def _seed(self) -> Seeded:
        tag = f"rel-{uuid.uuid4().hex[:6]}"
        hardware, model = simulated_profiles_get_or_create()
        tenant = Tenant.objects.create(name=f"Reliability {tag}", slug=tag)
        endpoint = Endpoint.objects.create(
            name=tag,
            model_profile=model,
            hardware_profile=hardware,
            runtime=Runtime.SIM,
            min_replicas=self.replicas,
            max_replicas=self.replicas,
            desired_replicas=self.replicas,
            concurrency_min=1,
            concurrency_max=max(self.concurrency_limit, 1),
            concurrency_limit=self.concurrency_limit,
            ttft_slo_ms=self.ttft_slo_ms,
            tpot_slo_ms=self.tpot_slo_ms,
            # min = max: the autoscaler's reconcile loop keeps the count fixed and replaces lost replicas,
            # so each fault's effect is measured alone.
            launch_options={"actuator": "local", "speed": self.replica_speed, "profile": self.replica_profile},
        )
        CapacityReservation.objects.create(
            tenant=tenant, endpoint=endpoint, mu_per_min=1e9, priority=PriorityClass.CRITICAL, burst_minutes=1.0
        )
        keys = {}
        for cls in (PriorityClass.CRITICAL, PriorityClass.STANDARD, PriorityClass.SHEDDABLE):
            _, raw = api_key_create(tenant=tenant, name=f"{tag} {cls}", max_priority=cls)
            keys[str(cls)] = raw
        seeded = Seeded(tenant_id=tenant.pk, endpoint_id=endpoint.pk, endpoint_name=endpoint.name, keys=keys)
        if self.fallback_replicas:
            self._seed_fallback(seeded, endpoint, tag)
        for name, (cls, reserved_mu_per_min) in self.extra_tenants.items():
            other = Tenant.objects.create(
                name=f"Reliability {tag} {name}", slug=f"{tag}-{name}", accepts_fallback=True
            )
            if reserved_mu_per_min is not None:
                CapacityReservation.objects.create(
                    tenant=other, endpoint=endpoint, mu_per_min=reserved_mu_per_min, priority=cls, burst_minutes=1.0
                )
            seeded.tenant_keys[name] = api_key_create(tenant=other, name=f"{tag} {name}", max_priority=cls)[1]
            seeded.tenant_ids[name] = other.pk
        return seeded

    def _seed_fallback(self, seeded: Seeded, endpoint: Endpoint, tag: str) -> None:
        """A fallback endpoint on faster replicas (a smaller model's speed); the primary degrades and falls back."""
        fallback = Endpoint.objects.create(
            name=f"{tag}-fallback",
            model_profile=endpoint.model_profile,
            hardware_profile=endpoint.hardware_profile,
            runtime=Runtime.SIM,
            min_replicas=self.fallback_replicas,
            max_replicas=self.fallback_replicas,
            desired_replicas=self.fallback_replicas,
            concurrency_min=1,
            concurrency_max=self.fallback_concurrency,
            concurrency_limit=self.fallback_concurrency,
            ttft_slo_ms=self.ttft_slo_ms,
            tpot_slo_ms=self.tpot_slo_ms,
            degrade_max_tokens=self.degrade_max_tokens,
            launch_options={"actuator": "local", "speed": self.fallback_speed, "profile": self.replica_profile},
        )
        Endpoint.objects.filter(pk=endpoint.pk).update(
            fallback=fallback, degrade_max_tokens=self.degrade_max_tokens, degrade_slot_share=self.degrade_slot_share
        )
        Tenant.objects.filter(pk=seeded.tenant_id).update(accepts_fallback=True)
        seeded.fallback_id, seeded.fallback_name = fallback.pk, fallback.name

    def _launch_replicas(self) -> None:
        reconcile(endpoint=Endpoint.objects.get(pk=self.seeded.endpoint_id))
        if self.seeded.fallback_id is not None:
            reconcile(endpoint=Endpoint.objects.get(pk=self.seeded.fallback_id))

    def _reconciled(self) -> int:
        self._launch_replicas()  # promotes started replicas whose /health answers
        if self.seeded.fallback_id is not None:
            fallback_ready = Replica.objects.filter(endpoint_id=self.seeded.fallback_id, state=ReplicaState.READY)
            if fallback_ready.count() < self.fallback_replicas:
                return 0
        return self.ready_replicas()

    # -- observations ------------------------------------------------------------------------------
    def replicas_by_state(self) -> dict[str, int]:
        rows = Replica.objects.filter(endpoint_id=self.seeded.endpoint_id).values("state").annotate(n=Count("id"))
        return {row["state"]: row["n"] for row in rows}

    def ready_replicas(self) -> int:
        return self.replicas_by_state().get("ready", 0)

    def ready_replica_rows(self) -> list:
        return list(Replica.objects.filter(endpoint_id=self.seeded.endpoint_id, state=ReplicaState.READY))

    def usage_books(self) -> dict:
        """Compare what clients saw with what PostgreSQL holds, for this harness's tenants."""
        # Metered: everything the proxy admitted or rejected for capacity (200, 429, 5xx, 503); a request it
        # refused as invalid (other 4xx) never reached metering and has no usage record by design.
        seen = {o.request_id for o in self.outcomes if o.request_id and (o.status in (200, 429) or o.status >= 500)}
        tenants = [self.seeded.tenant_id, *self.seeded.tenant_ids.values()]
        rows = UsageRecord.objects.filter(tenant_id__in=tenants)
        recorded = dict(rows.values_list("request_id").annotate(n=Count("id")))
        lost = len(seen - recorded.keys())
        duplicated = sum(n - 1 for n in recorded.values() if n > 1) + len(recorded.keys() - seen)
        return {"seen": len(seen), "recorded": len(recorded), "lost": lost, "duplicated": duplicated}

    def wait_books_settled(self, timeout_s: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout_s
        books = self.usage_books()
        while books["lost"] and time.monotonic() < deadline:
            time.sleep(0.5)
            books = self.usage_books()
        return books

    # -- load --------------------------------------------------------------------------------------
    def body(self, *, max_tokens: int | None = None, stream: bool = True, content: str | None = None) -> dict:
        return {
            "model": self.seeded.endpoint_name,
            "messages": [{"role": "user", "content": content or f"reliability check {uuid.uuid4().hex[:8]}"}],
            "max_tokens": max_tokens or self.max_tokens,
            "stream": stream,
        }

    async def one_request(
        self,
        session: aiohttp.ClientSession,
        priority: str = "standard",
        *,
        body: dict | None = None,
        timeout_s: float = 60.0,
        tenant: str = "",
    ) -> Outcome:
        """One streamed request with the seeded key of ``priority``, or with extra tenant ``tenant``'s key."""
        outcome = Outcome(request_id=None, priority=priority, status=0, started=time.monotonic(), tenant=tenant)
        raw_key = self.seeded.tenant_keys[tenant] if tenant else self.seeded.keys[priority]
        headers = {"Authorization": f"Bearer {raw_key}"}
        try:
            async with session.post(
                f"{self.base}/v1/chat/completions",
                json=body or self.body(),
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as response:
                outcome.status = response.status
                outcome.request_id = response.headers.get("x-request-id")
                outcome.retry_after = response.headers.get("retry-after")
                outcome.fallback_from = response.headers.get("x-infercap-fallback-from")
                outcome.degraded = "x-infercap-degraded" in response.headers
                if response.status == 200:
                    async for raw in response.content:
                        line = raw.strip()
                        if not line.startswith(b"data: "):
                            continue
                        if line == b"data: [DONE]":
                            outcome.done = True
                            break
                        event = json.loads(line[6:])
                        if "error" in event:
                            outcome.error_event = True
                        elif any(c.get("delta", {}).get("content") for c in event.get("choices") or ()):
                            # One token per content chunk, as vLLM streams (the role chunk is empty).
                            if outcome.ttft_s is None:
                                outcome.ttft_s = time.monotonic() - outcome.started
                            outcome.tokens += 1
                else:
                    outcome.code = error_code(await response.read())
        except (TimeoutError, aiohttp.ClientError) as exc:
            outcome.error = type(exc).__name__
        outcome.ended = time.monotonic()
        self.outcomes.append(outcome)
        return outcome

    async def open_loop(self, *, rate_per_s: dict[str, float], duration_s: float, seed: int = 7) -> list[Outcome]:
        """Poisson arrivals per priority class for ``duration_s``; waits for every request to end."""
        rng = random.Random(seed)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            tasks: list[asyncio.Task] = []
            start = time.monotonic()

            async def arrivals(priority: str, rate: float) -> None:
                t = start
                while True:
                    t += rng.expovariate(rate)
                    if t - start > duration_s:
                        return
                    await asyncio.sleep(max(0.0, t - time.monotonic()))
                    tasks.append(asyncio.create_task(self.one_request(session, priority)))

            await asyncio.gather(*(arrivals(p, r) for p, r in rate_per_s.items() if r > 0))
            return list(await asyncio.gather(*tasks))

    async def open_loop_tenants(self, *, rate_per_s: dict[str, float], duration_s: float, seed: int = 7) -> list:
        """Poisson arrivals per extra tenant (``extra_tenants``), each with its key's class; waits for every end."""
        rng = random.Random(seed)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            tasks: list[asyncio.Task] = []
            start = time.monotonic()

            async def arrivals(tenant: str, rate: float) -> None:
                t, priority = start, str(self.extra_tenants[tenant][0])
                while True:
                    t += rng.expovariate(rate)
                    if t - start > duration_s:
                        return
                    await asyncio.sleep(max(0.0, t - time.monotonic()))
                    tasks.append(asyncio.create_task(self.one_request(session, priority, tenant=tenant)))

            await asyncio.gather(*(arrivals(t, r) for t, r in rate_per_s.items() if r > 0))
            return list(await asyncio.gather(*tasks))

    async def closed_loop(self, *, clients: int, duration_s: float, priority: str = "standard") -> list[Outcome]:
        results: list[Outcome] = []
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            stop_at = time.monotonic() + duration_s

            async def client() -> None:
                while time.monotonic() < stop_at:
                    results.append(await self.one_request(session, priority))

            await asyncio.gather(*(client() for _ in range(clients)))
        return results

    # -- helpers -----------------------------------------------------------------------------------
    @staticmethod
    def _http_ok(url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                return response.status == 200
        except OSError:
            return False

    def _proxy_serves(self) -> bool:
        async def probe() -> bool:
            async with aiohttp.ClientSession() as session:
                outcome = await self.one_request(session, "critical", timeout_s=10)
                return outcome.status == 200 and outcome.done

        return asyncio.run(probe())

    def _wait(self, predicate: Callable[[], bool], timeout_s: float, what: str) -> float:
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            for name, proc in list(self.procs.items()):
                if name != "worker" and proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode} while waiting for {what}")
            if predicate():
                self.progress(f"{what} ({time.monotonic() - started:.1f} s)")
                return time.monotonic() - started
            time.sleep(0.25)
        raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
