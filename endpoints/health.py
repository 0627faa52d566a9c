"""Blackbox health checks of ready replicas, and the lifecycle transitions they trigger.

A replica is probed only when it has shown no sign of life for ``idle_after_s``: signs of life are a
real completion recorded by the proxy (Redis ``infercap:replica_last_ok:{replica_id}``, unix seconds) or
the replica's own ``vllm:generation_tokens_total`` growing between two checks. So a busy replica, which
completes requests all the time, is never probed, let alone failed. The probe is a one-token streamed
completion sent straight to the replica (never through the proxy's admission queue) at vLLM's highest
priority, with a generous time-to-first-token budget. ``failures_to_fail`` consecutive failed probes
mark the replica failed (the proxy drops it at its next snapshot reload) and ask the endpoint's
actuator for a restart. Detection time (failure marked − last sign of life) is kept in the audit
entry; ``health_timings`` adds recovery time (failure → the next replica of that endpoint ready).

Runs from Celery beat (``workers.tasks.health``), not inside the proxy: one prober per deployment
instead of one per proxy process, lifecycle writes stay in synchronous Django code, and the prober
keeps working when the proxy itself is wedged. The decision functions at the top are pure.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import httpx
import redis
from django.conf import settings
from django.utils import timezone

from capacity.autoscaling import actuators
from capacity.autoscaling.store import release_lock
from capacity.lifecycle import IllegalTransition, replica_transition
from endpoints.models import Replica, ReplicaState, ReplicaTransition
from tenants.models import AuditEntry
from tenants.services import audit_log

log = logging.getLogger(__name__)

# vLLM serves lower priority values first (under --scheduling-policy priority); int64 range is accepted.
PROBE_PRIORITY = -(2**31)
LAST_OK_KEY = "infercap:replica_last_ok:{replica_id}"
PROGRESS_KEY = "infercap:health:progress:{replica_id}"  # JSON {"tokens": float, "at": unix s}
CYCLE_LOCK_KEY = "infercap:health:cycle_lock"
PROBE_HEADERS = {"X-Infercap-Probe": "1"}


@dataclass(frozen=True)
class HealthConfig:
    idle_after_s: float = 10.0  # N: probe only a replica with no sign of life for this long
    failures_to_fail: int = 3  # K consecutive failed probes → failed
    ttft_timeout_s: float = 10.0  # the probe's first-token budget; generous, a loaded replica is slow
    connect_timeout_s: float = 2.0
    metrics_timeout_s: float = 1.0

    def __post_init__(self):
        if self.failures_to_fail < 1 or self.idle_after_s < 0 or self.ttft_timeout_s <= 0:
            raise ValueError("health config: failures_to_fail ≥ 1, idle_after_s ≥ 0 and ttft_timeout_s > 0")

    @classmethod
    def from_settings(cls, **overrides) -> HealthConfig:
        values = dict(getattr(settings, "INFERCAP", {}).get("HEALTH", {}))
        values.update(overrides)
        return cls(**values)


@dataclass
class ProbeResult:
    ok: bool
    ttft_s: float | None = None
    status: int | None = None
    error: str = ""
    used_priority: bool = True


# -- pure decisions -------------------------------------------------------------------------------------


def last_sign_of_life(
    *, last_ok_completion_at: float | None, progress_at: float | None, last_ok_probe_at: float | None
):
    """The latest moment the replica was seen doing useful work, or None if never."""
    seen = [t for t in (last_ok_completion_at, progress_at, last_ok_probe_at) if t is not None]
    return max(seen) if seen else None


def needs_probe(*, now: float, last_alive_at: float | None, config: HealthConfig) -> bool:
    return last_alive_at is None or now - last_alive_at >= config.idle_after_s


def after_probe(*, failures: int, ok: bool, config: HealthConfig) -> tuple[int, bool]:
    """(new consecutive failure count, whether the replica must now be marked failed)."""
    if ok:
        return 0, False
    failures += 1
    return failures, failures >= config.failures_to_fail


# -- probing (async I/O, no Django) ---------------------------------------------------------------------


def _probe_body(with_priority: bool) -> dict:
    body = {
        "prompt": "ping",
        "max_tokens": 1,
        "temperature": 0,
        "stream": True,
        # Never served from or written into a tenant's cached prefix chain.
        "cache_salt": "infercap-health-probe",
    }
    if with_priority:
        body["priority"] = PROBE_PRIORITY
    return body


async def probe_replica(
    url: str, *, config: HealthConfig, client: httpx.AsyncClient, with_priority: bool = True
) -> ProbeResult:
    """Send a one-token completion and wait for its first streamed token, at most ``ttft_timeout_s``.

    A 400 that names ``priority`` means the replica runs vLLM's default fcfs scheduler, which refuses
    non-zero priorities: that answer proves the server is up, and the probe is repeated without it.
    """
    started = time.perf_counter()
    timeout = httpx.Timeout(config.ttft_timeout_s, connect=config.connect_timeout_s)
    try:
        async with asyncio.timeout(config.ttft_timeout_s + config.connect_timeout_s):
            async with client.stream(
                "POST",
                f"{url.rstrip('/')}/v1/completions",
                json=_probe_body(with_priority),
                headers=PROBE_HEADERS,
                timeout=timeout,
            ) as response:
                if response.status_code != 200:
                    text = (await response.aread()).decode(errors="replace")[:300]
                    if response.status_code == 400 and with_priority and "priority" in text.lower():
                        return await probe_replica(url, config=config, client=client, with_priority=False)
                    return ProbeResult(
                        False, status=response.status_code, error=f"HTTP {response.status_code}: {text}"
                    )
                kind = response.headers.get("content-type", "")
                if "text/event-stream" not in kind:
                    # A web server's page (or anything but vLLM's stream) at the replica's URL is no token.
                    return ProbeResult(
                        False, status=200, error=f"answered {kind or 'no content type'}, not an SSE stream: not vLLM"
                    )
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        break
                    try:
                        chunk = json.loads(payload)
                    except ValueError:
                        return ProbeResult(False, status=200, error=f"unparseable SSE chunk: {payload[:80]}")
                    if "error" in chunk:
                        return ProbeResult(False, status=200, error=f"stream error: {str(chunk['error'])[:200]}")
                    if chunk.get("choices"):
                        return ProbeResult(
                            True, ttft_s=time.perf_counter() - started, status=200, used_priority=with_priority
                        )
                return ProbeResult(False, status=200, error="stream ended without a token")
    except httpx.ConnectTimeout:
        return ProbeResult(False, error=f"no connection within {config.connect_timeout_s:g} s")
    except (TimeoutError, httpx.TimeoutException):
        # httpx's read timeout (same budget) often fires first; either way the replica sent no token in time.
        return ProbeResult(False, error=f"no first token within {config.ttft_timeout_s:g} s")
    except httpx.HTTPError as exc:
        return ProbeResult(False, error=f"{type(exc).__name__}: {exc}"[:300])


async def read_generation_tokens(url: str, *, config: HealthConfig, client: httpx.AsyncClient) -> float | None:
    """The replica's ``vllm:generation_tokens_total`` (summed over engines), None when unreadable."""
    try:
        response = await client.get(f"{url.rstrip('/')}/metrics", timeout=config.metrics_timeout_s)
        response.raise_for_status()
    except httpx.HTTPError:
        return None
    total, found = 0.0, False
    for line in response.text.splitlines():
        if line.startswith("vllm:generation_tokens_total"):
            try:
                total += float(line.rsplit(" ", 1)[1])
                found = True
            except (IndexError, ValueError):
                continue
    return total if found else None


# -- services (Django) ----------------------------------------------------------------------------------


@dataclass
class ReplicaCheck:
    replica_id: int
    probed: bool = False
    result: ProbeResult | None = None
    failures: int = 0
    marked_failed: bool = False
    restart: str = ""
    last_alive_at: float | None = None


@dataclass
class HealthCycleReport:
    checks: list[ReplicaCheck] = field(default_factory=list)
    skipped: str = ""  # non-empty when the cycle did not run (another one holds the lock)

    @property
    def failed_ids(self) -> list[int]:
        return [c.replica_id for c in self.checks if c.marked_failed]

    @property
    def probed_ids(self) -> list[int]:
        return [c.replica_id for c in self.checks if c.probed]


_redis_client = None


def _redis():
    global _redis_client
    url = getattr(settings, "REDIS_URL", "")
    if _redis_client is None and url:
        _redis_client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5)
    return _redis_client


def _redis_get_many(keys: list[str]) -> list[bytes | None]:
    client = _redis()
    if client is None or not keys:
        return [None] * len(keys)
    try:
        return client.mget(keys)
    except Exception as exc:  # noqa: BLE001 - without Redis we just probe more often
        log.warning("health: Redis unavailable (%s); probing without last-completion times", exc)
        return [None] * len(keys)


def _float_or_none(raw) -> float | None:
    try:
        return float(raw) if raw is not None else None
    except (TypeError, ValueError):
        return None


def record_completion(*, replica_id: int | str, at: float | None = None) -> None:
    """What the proxy calls (or mirrors) when a real request completes: evidence the replica is alive."""
    client = _redis()
    if client is not None:
        client.set(LAST_OK_KEY.format(replica_id=replica_id), repr(time.time() if at is None else at), ex=86_400)


def request_restart(*, replica) -> str:
    """Ask the endpoint's actuator for a replacement; a failed request is logged and leaves the replica failed."""
    if replica.actuator == "static":
        # Attached by an operator (a server the platform did not start): whoever runs it restarts it.
        return "unavailable: an attached replica is restarted by whoever runs it"
    try:
        actuator = actuators.get_actuator(replica.endpoint)
        for method in ("restart", "replace"):
            if hasattr(actuator, method):
                getattr(actuator, method)(replica)
                return f"requested via {type(actuator).__name__}.{method}"
        return f"unavailable: {type(actuator).__name__} has no restart()"
    except Exception as exc:  # noqa: BLE001 - a failed restart request must not undo the failure marking
        log.exception("health: restart of replica %s failed", replica.pk)
        return f"error: {type(exc).__name__}: {exc}"[:200]


def _mark_failed(*, replica, check: ReplicaCheck, errors: list[str], now: float) -> None:
    detected_after_s = None if check.last_alive_at is None else round(now - check.last_alive_at, 3)
    reason = f"health: {check.failures} consecutive failed probes ({errors[-1] if errors else 'no detail'})"
    try:
        replica_transition(replica=replica, to_state=ReplicaState.FAILED, reason=reason)
    except IllegalTransition as exc:
        log.info("health: %s", exc)  # someone (an actuator, an operator) moved it first
        return
    check.marked_failed = True
    check.restart = request_restart(replica=replica)
    audit_log(
        action="replica.health_failed",
        obj=replica,
        tenant=replica.endpoint.owner_tenant,
        detail={
            "endpoint": replica.endpoint.name,
            "failures": check.failures,
            "errors": errors[-3:],
            "last_alive_at": check.last_alive_at,
            "detected_after_s": detected_after_s,
            "restart": check.restart,
        },
    )
    log.warning(
        "health: replica %s marked failed after %s probes; restart: %s", replica.pk, check.failures, check.restart
    )


async def _gather_evidence_and_probe(replicas, to_probe_ids, config: HealthConfig, need_progress: set[int]):
    limits = httpx.Limits(max_connections=max(8, 2 * len(replicas)), max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits) as client:
        tokens = await asyncio.gather(
            *(read_generation_tokens(r.url, config=config, client=client) for r in replicas if r.pk in need_progress)
        )
        token_by_id = dict(zip([r.pk for r in replicas if r.pk in need_progress], tokens, strict=True))
        chosen = to_probe_ids(token_by_id)
        probe_targets = [r for r in replicas if r.pk in chosen]
        results = await asyncio.gather(*(probe_replica(r.url, config=config, client=client) for r in probe_targets))
        return token_by_id, dict(zip([r.pk for r in probe_targets], results, strict=True))


def health_check_cycle(
    *, config: HealthConfig | None = None, endpoint_ids: Iterable[int] | None = None, now: float | None = None
) -> HealthCycleReport:
    """One pass over ready replicas: gather signs of life, probe the quiet ones, fail the dead ones."""
    config = config or HealthConfig.from_settings()
    client = _redis()
    lock_ttl = int(config.ttft_timeout_s + config.connect_timeout_s + 5)
    token = f"{os.getpid()}-{time.monotonic_ns()}"
    if client is not None:
        try:
            if not client.set(CYCLE_LOCK_KEY, token, nx=True, ex=lock_ttl):
                return HealthCycleReport(skipped="another health cycle is running")
        except redis.TimeoutError:
            pass  # the SET may still have landed (only its reply was late): the release below still runs
        except Exception:  # noqa: BLE001 - without Redis the overlap guard is lost, not the check
            client = None
    try:
        return _cycle(
            config=config, endpoint_ids=endpoint_ids, now=now, replica_model=Replica, ready=ReplicaState.READY
        )
    finally:
        if client is not None:
            _release_cycle_lock(client, token)


def _release_cycle_lock(client, token: str) -> None:
    """Release the overlap guard, only while it is ours and trying again after a timeout: a lock left behind by
    one slow reply (a socket timeout of 0.5 s on a busy host) would make every cycle skip until it expires."""
    if not release_lock(client, CYCLE_LOCK_KEY, token):
        log.warning("health: could not release the cycle lock; it expires on its own")


def _cycle(*, config, endpoint_ids, now, replica_model, ready) -> HealthCycleReport:
    queryset = replica_model.objects.filter(state=ready).exclude(url="").select_related("endpoint")
    if endpoint_ids is not None:
        queryset = queryset.filter(endpoint_id__in=list(endpoint_ids))
    replicas = list(queryset)
    report = HealthCycleReport()
    if not replicas:
        return report
    now = time.time() if now is None else now
    raw = _redis_get_many(
        [LAST_OK_KEY.format(replica_id=r.pk) for r in replicas]
        + [PROGRESS_KEY.format(replica_id=r.pk) for r in replicas]
    )
    last_ok = {r.pk: _float_or_none(v) for r, v in zip(replicas, raw[: len(replicas)], strict=True)}
    progress: dict[int, dict] = {}
    for r, v in zip(replicas, raw[len(replicas) :], strict=True):
        try:
            progress[r.pk] = json.loads(v) if v else {}
        except ValueError:
            progress[r.pk] = {}
    last_probe_ok = {
        r.pk: r.last_probe_at.timestamp() if r.last_probe_ok and r.last_probe_at else None for r in replicas
    }
    checks = {r.pk: ReplicaCheck(replica_id=r.pk, failures=r.consecutive_probe_failures) for r in replicas}

    def alive_at(pk: int, tokens: float | None) -> float | None:
        previous = progress[pk]
        progress_at = previous.get("at")
        if tokens is not None and previous.get("tokens") is not None and tokens > previous["tokens"]:
            progress_at = now
        return last_sign_of_life(
            last_ok_completion_at=last_ok[pk], progress_at=progress_at, last_ok_probe_at=last_probe_ok[pk]
        )

    # Only replicas that the proxy's evidence alone does not clear need a look at their token counter.
    need_progress = {r.pk for r in replicas if needs_probe(now=now, last_alive_at=alive_at(r.pk, None), config=config)}

    def to_probe(token_by_id: dict[int, float | None]) -> set[int]:
        chosen = set()
        for pk in need_progress:
            checks[pk].last_alive_at = alive_at(pk, token_by_id.get(pk))
            if needs_probe(now=now, last_alive_at=checks[pk].last_alive_at, config=config):
                chosen.add(pk)
        return chosen

    token_by_id, results = asyncio.run(_gather_evidence_and_probe(replicas, to_probe, config, need_progress))
    _store_progress(token_by_id, progress, now)
    probe_time = timezone.now()
    for replica in replicas:
        check = checks[replica.pk]
        report.checks.append(check)
        result = results.get(replica.pk)
        if result is None:
            if check.failures:  # alive again by other evidence: the failure streak is over
                replica_model.objects.filter(pk=replica.pk).update(consecutive_probe_failures=0)
                check.failures = 0
            continue
        check.probed, check.result = True, result
        check.failures, must_fail = after_probe(
            failures=replica.consecutive_probe_failures, ok=result.ok, config=config
        )
        replica_model.objects.filter(pk=replica.pk).update(
            last_probe_at=probe_time, last_probe_ok=result.ok, consecutive_probe_failures=check.failures
        )
        if must_fail:
            errors = _recent_errors(replica.pk, result.error)
            _mark_failed(replica=replica, check=check, errors=errors, now=now)
        elif not result.ok:
            _recent_errors(replica.pk, result.error)
        else:
            _error_log.pop(replica.pk, None)
    return report


_error_log: dict[int, list[str]] = {}


def _recent_errors(replica_pk: int, error: str) -> list[str]:
    """The last few probe errors of a replica in this process, for the failure's audit entry."""
    errors = _error_log.setdefault(replica_pk, [])
    errors.append(error)
    del errors[:-5]
    return list(errors)


def _store_progress(token_by_id: Mapping[int, float | None], previous: Mapping[int, dict], now: float) -> None:
    client = _redis()
    if client is None:
        return
    try:
        pipe = client.pipeline()
        for pk, tokens in token_by_id.items():
            if tokens is None:
                continue
            old = previous.get(pk) or {}
            # "at" is when the counter was last seen growing; first sight of a counter is no evidence, and
            # a counter that went down (the replica restarted) is re-based without counting as progress.
            grew = old.get("tokens") is not None and tokens > old["tokens"]
            value = {"tokens": tokens, "at": now if grew else old.get("at")}
            pipe.set(PROGRESS_KEY.format(replica_id=pk), json.dumps(value), ex=86_400)
        pipe.execute()
    except Exception as exc:  # noqa: BLE001
        log.warning("health: could not store progress counters: %s", exc)


# -- selectors ------------------------------------------------------------------------------------------


def health_timings(*, endpoint) -> list[dict]:
    """Each health failure of an endpoint's replicas: when, detection time, and recovery time.

    Recovery = the failure → the next moment another replica of the endpoint became ready (None while
    no replacement is ready yet).
    """
    replica_ids = list(endpoint.replicas.values_list("pk", flat=True))
    failures = ReplicaTransition.objects.filter(
        replica_id__in=replica_ids, to_state=ReplicaState.FAILED, reason__startswith="health:"
    ).order_by("at")
    audits = {
        int(a.object_id): a.detail
        for a in AuditEntry.objects.filter(
            action="replica.health_failed", object_type="replica", object_id__in=[str(i) for i in replica_ids]
        )
    }
    timings = []
    for failure in failures:
        ready_after = (
            ReplicaTransition.objects.filter(
                replica_id__in=replica_ids, to_state=ReplicaState.READY, at__gt=failure.at
            )
            .exclude(replica_id=failure.replica_id)
            .order_by("at")
            .first()
        )
        detail = audits.get(failure.replica_id, {})
        timings.append(
            {
                "replica_id": failure.replica_id,
                "failed_at": failure.at,
                "detected_after_s": detail.get("detected_after_s"),
                "recovered_after_s": (ready_after.at - failure.at).total_seconds() if ready_after else None,
                "restart": detail.get("restart", ""),
                "reason": failure.reason,
            }
        )
    return timings
