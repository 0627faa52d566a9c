"""``bench scale``'s vertical loop: the autoscaler's 30-s vertical tick (per-replica concurrency) over every endpoint,
each replica's ``/metrics`` scraped from local servers answering the simulator's vLLM exposition
(``benchmarks/operations/metrics_servers.py``, run as their own processes so the CPU measured is the tick's).

One size at a time in a transaction rolled back after it, on the fleet ``scale_fleet`` builds (10 ready replicas
an endpoint), its replicas' URLs pointed at the servers' ports.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys

import httpx
from django.db import connection, transaction

from benchmarks.operations.scale_fleet import REPLICAS_PER_ENDPOINT, _fleet
from benchmarks.operations.scale_rows import timed_cpu
from capacity.autoscaling import store
from capacity.autoscaling import vertical_ticks as vertical_ticks_module
from capacity.autoscaling.vertical_ticks import STREAK_KEY, vertical_ticks
from capacity.models import AutoscalerDecision
from endpoints.models import Replica
from workers.tasks.autoscaling import VERTICAL_BATCH

SERVER_PROCESSES = 2
PORTS_PER_PROCESS = 2
TICKS = 3  # the first stores each replica's first histogram snapshot; the later ones are steady


def vertical_tick(endpoints: int, *, progress, sample: int | None = None) -> dict:
    """CPU and wall seconds of one vertical tick over ``endpoints`` endpoints of 10 ready replicas, ``sample`` of
    each read (None: the product's ``AUTOSCALE_VERTICAL_SAMPLE``; 0: all); the best of the steady ticks."""
    sample = vertical_ticks_module._sample_size() if sample is None else sample
    with metrics_servers() as (ports, advance), transaction.atomic():
        stamp, ids = _fleet(endpoints, replicas=REPLICAS_PER_ENDPOINT)
        replica_ids = _point_at(ids, ports)
        try:
            ticks = []
            for tick in range(TICKS):
                advance()  # a cycle's worth of new latency observations on every replica
                label = f"v-scale-{stamp}-{tick}"
                seconds, cpu, _ = timed_cpu(_tick_in_batches, ids, label, sample)
                stored = AutoscalerDecision.objects.filter(tick=label, endpoint_id__in=ids).count()
                ticks.append((seconds, cpu, stored))
            scraped = _snapshots_stored(replica_ids)
        finally:
            _drop_state(ids, replica_ids)
        transaction.set_rollback(True)
    seconds, cpu, stored = min(ticks[1:])
    replicas = endpoints * REPLICAS_PER_ENDPOINT
    progress(
        f"  vertical: {endpoints:,} endpoints × {REPLICAS_PER_ENDPOINT} replicas: {seconds:.2f} s, {cpu:.2f} CPU-s a "
        f"tick ({cpu / replicas * 1e6:.0f} CPU-µs a replica; {stored:,} decisions stored, {scraped:,} replicas "
        f"scraped, sample {sample or 'all'}); the first tick {ticks[0][0]:.2f} s"
    )
    return {
        "seconds": seconds,
        "cpu_s": round(cpu, 3),
        "replicas": replicas,
        "cpu_us_per_replica": round(cpu / replicas * 1e6, 1),
        "decisions_stored": stored,
        "replicas_scraped": scraped,
        "sample": sample,
        "first_tick_s": round(ticks[0][0], 3),
    }


def _tick_in_batches(ids: list[int], label: str, sample: int) -> None:
    """The beat's batches (``workers.tasks.autoscaling.VERTICAL_BATCH``) one after another in this process: the CPU a
    tick costs the workers together."""
    for first in range(0, len(ids), VERTICAL_BATCH):
        vertical_ticks(endpoint_ids=ids[first : first + VERTICAL_BATCH], tick=label, sample=sample)


def _point_at(ids: list[int], ports: list[int]) -> list[int]:
    """Each replica's URL on one of the servers' ports (round robin by id); returns the replicas' ids."""
    table = connection.ops.quote_name(Replica._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET url = 'http://127.0.0.1:' || (%s::int[])[1 + id %% %s] WHERE endpoint_id = ANY(%s)",
            [ports, len(ports), ids],
        )
    return list(Replica.objects.filter(endpoint_id__in=ids).values_list("pk", flat=True))


def _snapshots_stored(replica_ids: list[int]) -> int:
    """Replicas whose histogram snapshot the ticks stored: the ones scraped."""
    pipe = store.client().pipeline(transaction=False)
    for replica_id in replica_ids:
        pipe.exists(store.HIST_KEY.format(replica_id=replica_id))
    return sum(1 for found in pipe.execute() if found)


def _drop_state(ids: list[int], replica_ids: list[int]) -> None:
    pipe = store.client().pipeline(transaction=False)
    for replica_id in replica_ids:
        pipe.delete(store.HIST_KEY.format(replica_id=replica_id))
    for endpoint_id in ids:
        pipe.delete(STREAK_KEY.format(endpoint_id=endpoint_id))
        pipe.delete(store.LOCK_KEY.format(axis=AutoscalerDecision.Axis.VERTICAL, endpoint_id=endpoint_id))
    pipe.execute()


@contextlib.contextmanager
def metrics_servers(ports: int = SERVER_PROCESSES * PORTS_PER_PROCESS):
    """Start the servers (``ports`` ports over ``SERVER_PROCESSES`` processes); yields their ports and a function
    moving every replica one cycle on."""
    count = ports
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    processes = []
    try:
        # A port found free can be taken by another process before a server binds it (test suites run side by
        # side): then the servers start again on ports found afresh.
        for _attempt in range(3):
            _stop(processes)
            ports, processes = _free_ports(count), []
            per_process = -(-len(ports) // SERVER_PROCESSES)
            for first in range(0, len(ports), per_process):
                argv = [sys.executable, "-m", "benchmarks.operations.metrics_servers"]
                argv += [str(p) for p in ports[first : first + per_process]]
                processes.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True))
            if all(process.stdout.readline().strip() == "ready" for process in processes):
                break
        else:
            raise RuntimeError("a metrics server did not start")
        heads = ports[::per_process]  # one port of each process

        def advance() -> None:
            for port in heads:
                httpx.post(f"http://127.0.0.1:{port}/advance", timeout=10).raise_for_status()

        yield ports, advance
    finally:
        _stop(processes)


def _stop(processes: list) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()
