"""Rows for ``bench scale``, generated in PostgreSQL (``INSERT … SELECT … FROM generate_series``): the columns a
bench cares about from SQL expressions of ``g`` (1, 2, …), every other column its field's default, read from the
model, so a column added later needs no change here. Also the growth-exponent fit and its projections."""

from __future__ import annotations

import math
import os
import time

from django.db import connection, models


def insert_series(model: type[models.Model], count: int, exprs: dict[str, str], params: dict | None = None) -> None:
    """``count`` rows of ``model``; ``exprs`` maps column names to SQL over ``g`` (``%(name)s`` takes ``params``)."""
    if count <= 0:
        return
    params = dict(params or {})
    columns, values = [], []
    for f in model._meta.concrete_fields:
        if f.column in exprs:
            columns.append(f.column)
            values.append(exprs[f.column])
        elif not f.primary_key:
            default = f.get_db_prep_save(f.get_default(), connection)
            params[f"default_{f.column}"] = default
            columns.append(f.column)
            values.append(f"%(default_{f.column})s::{f.db_type(connection)}")
    quote = connection.ops.quote_name
    params["count"] = count
    sql = (
        f"INSERT INTO {quote(model._meta.db_table)} ({', '.join(quote(c) for c in columns)}) "
        f"SELECT {', '.join(values)} FROM generate_series(1, %(count)s) AS g"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def analyze(*models_: type[models.Model]) -> None:
    with connection.cursor() as cursor:
        for model in models_:
            cursor.execute(f"ANALYZE {connection.ops.quote_name(model._meta.db_table)}")


def timed(fn, *args, **kwargs) -> tuple[float, object]:
    started = time.perf_counter()
    result = fn(*args, **kwargs)
    return time.perf_counter() - started, result


def backend_cpu_seconds(database: str) -> float:
    """CPU seconds used so far by the PostgreSQL backends serving ``database`` (found by their process titles in
    /proc: the server is local in the bench's setting)."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as handle:
                title = handle.read()
            if not title.startswith(b"postgres: ") or f" {database} ".encode() not in title:
                continue
            with open(f"/proc/{entry.name}/stat", encoding="ascii") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def cpu_seconds(database: str) -> float:
    """This process's CPU seconds and its database's backends': on a machine shared with other work the wall
    clock measures the others too; this does not."""
    return backend_cpu_seconds(database) + time.process_time()


def timed_cpu(fn, *args, **kwargs) -> tuple[float, float, object]:
    """(wall seconds, CPU seconds of this process and its database's backends, result) of one call. The loops are
    synchronous round trips, so on a quiet machine the wall clock is about the CPU figure."""
    database = connection.settings_dict["NAME"]
    backends = backend_cpu_seconds(database)
    process = time.process_time()
    started = time.perf_counter()
    result = fn(*args, **kwargs)
    wall = time.perf_counter() - started
    process = time.process_time() - process  # before the /proc scan below, which is not the call's
    return wall, process + backend_cpu_seconds(database) - backends, result


def growth_exponent(sizes: list[float], seconds: list[float]) -> float | None:
    """k in seconds ≈ c · size^k: the least-squares slope of log(seconds) against log(size). None with fewer than
    two distinct sizes or a non-positive figure."""
    points = [(math.log(s), math.log(t)) for s, t in zip(sizes, seconds, strict=True) if s > 0 and t > 0]
    if len(points) < 2 or len({x for x, _ in points}) < 2:
        return None
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    return sxy / sxx


def projected(sizes: list[float], seconds: list[float], exponent: float | None, size: float) -> float | None:
    """The cost at ``size`` from the largest measured point along the fitted exponent (the measured figure when
    ``size`` was measured)."""
    if not sizes or exponent is None:
        return None
    if size in sizes:
        return seconds[sizes.index(size)]
    return seconds[-1] * (size / sizes[-1]) ** exponent


def breaks_at(sizes: list[float], seconds: list[float], exponent: float | None, limit: float) -> float | None:
    """The size at which the cost reaches ``limit`` along the fitted exponent (None when it does not grow)."""
    if not sizes or exponent is None or exponent <= 0.05 or seconds[-1] <= 0:
        return None
    return sizes[-1] * (limit / seconds[-1]) ** (1 / exponent)
