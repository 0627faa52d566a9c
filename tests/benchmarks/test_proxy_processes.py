"""``bench proxy --opt processes=2`` end to end at a tiny size: two proxy processes on one Redis hold a replica's
concurrency limit and a key's RPM limit together, and the same check with a Redis each (``shared_redis=0``) sees both
broken, so the check can tell."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command

from benchmarks.serving.proxy_processes import PREFIX, REPLICA_LIMIT, RPM_LIMIT, Options

TINY = ["--opt", "processes=2", "--opt", "duration_s=1.5", "--opt", "max_streams=8", "--opt", "refine=0"]


def bench(*opts: str) -> dict:
    out = StringIO()
    call_command("bench", "proxy", "--quick", *TINY, *opts, stdout=out, stderr=StringIO())
    return json.loads(out.getvalue().strip().splitlines()[-1])


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)  # the proxies are other processes: the world must be committed
def test_two_processes_share_the_limits_through_redis(clean_redis):
    figures = bench()
    for key in ("streams_at_bound", "stopped_by", "search"):
        assert f"{PREFIX}.2.{key}" in figures, key
    if figures[f"{PREFIX}.2.streams_at_bound"]:  # the one level met the bound (a busy machine may say no)
        for key in ("added_ttft_p50_ms", "tokens_per_s", "cpu_ms_per_1k_tokens", "redis_calls_per_request"):
            assert f"{PREFIX}.2.{key}" in figures, key
    assert len(figures[f"{PREFIX}.idle"]["cpu_ms_per_s"]) == 2
    assert figures[f"{PREFIX}.2.streams_at_bound"] in (0, 8)
    assert len(figures[f"{PREFIX}.2.search"][0]["proxy_cpu_cores"]) == 2
    limits = {k.removeprefix(f"{PREFIX}.limits."): v for k, v in figures.items() if k.startswith(f"{PREFIX}.limits.")}
    assert limits["processes"] == 2
    # 16 streams over two processes, each of which alone would fill the replica's 4 slots: together never more.
    assert REPLICA_LIMIT // 2 <= limits["replica_max_in_flight"] <= REPLICA_LIMIT
    assert limits["replica_limit_held"] and limits["replica_errors"] == 0
    # 360 requests for a key of 120 a minute: one bucket for both, the rest refused with 429.
    assert RPM_LIMIT // 2 < limits["rpm_admitted"] <= limits["rpm_allowed_max"] < 2 * RPM_LIMIT
    assert limits["rate_limit_held"] and limits["rpm_429s"] == limits["rpm_sent"] - limits["rpm_admitted"]


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_processes_on_separate_redis_break_both_limits(clean_redis):
    figures = bench("--opt", "shared_redis=0")
    assert figures[f"{PREFIX}.shared_redis"] is False
    assert figures[f"{PREFIX}.limits.replica_max_in_flight"] > REPLICA_LIMIT
    assert figures[f"{PREFIX}.limits.rpm_admitted"] > figures[f"{PREFIX}.limits.rpm_allowed_max"]
    assert not figures[f"{PREFIX}.limits.replica_limit_held"] and not figures[f"{PREFIX}.limits.rate_limit_held"]


@pytest.mark.parametrize(
    "opts, message",
    [
        ({"processes": "two"}, "processes= must be a number"),
        ({"processes": "0"}, "1 to 16 processes"),
        ({"processes": "2", "bound_ms": "0"}, "bound_ms must be > 0"),
        ({"processes": "2", "start": "64", "max_streams": "8"}, "start <= max_streams"),
    ],
)
def test_bad_options_are_refused_with_a_clear_message(opts, message):
    with pytest.raises(ValueError, match=message):
        Options.parse(opts, quick=True)
