"""``bench proxy``: its prompt and interval helpers, and a one-stream quick run through the management command
against real processes (simulated replica, proxy worker with the production settings, bare pass-through)."""

import json
import random
from io import StringIO

import pytest
from django.core.management import call_command

from benchmarks.serving import proxy as bench
from benchmarks.serving.stats import added_p50_interval


def test_prompt_has_the_asked_length_and_is_unique_per_request():
    a = bench._prompt("n0", 3, 7, 64)
    b = bench._prompt("n0", 3, 8, 64)
    assert len(a) == len(b) == 64
    assert a != b
    assert a.startswith("n0 worker 3 request 7: ")
    # Never cut into the unique head, however short the asked length.
    assert bench._prompt("n0", 3, 7, 4) == "n0 worker 3 request 7: "
    assert len(bench._prompt("n0", "proxy", 1, 280)) == 280


def test_added_p50_interval_brackets_a_known_shift_and_narrows_with_more_samples():
    rng = random.Random(1)

    def sample(n, shift):
        return [0.080 + shift + rng.gauss(0, 0.010) for _ in range(n)]

    small = added_p50_interval(sample(200, 0.0), sample(200, 0.003))
    large = added_p50_interval(sample(3000, 0.0), sample(3000, 0.003))
    assert small[0] < 3.0 < small[1]
    assert large[0] < 3.0 < large[1]
    assert (large[1] - large[0]) < (small[1] - small[0]) / 2
    # The interval holds the run's own point estimate.
    direct, proxied = sample(1000, 0.0), sample(1000, 0.0)
    low, high = added_p50_interval(direct, proxied)
    point = (bench._pct(proxied, 50) - bench._pct(direct, 50)) * 1000
    assert low <= point <= high
    assert added_p50_interval([0.1] * 5, [0.1] * 500) is None  # too few to say anything


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_quick_one_stream_run_reports_the_figures(clean_redis):
    out = StringIO()
    call_command(
        "bench",
        "proxy",
        "--quick",
        "--opt",
        "levels=1",
        stdout=out,
        stderr=StringIO(),
    )
    figures = json.loads(out.getvalue().strip().splitlines()[-1])
    row = figures["streams_1"]
    assert row["errors"] == 0 and row["direct_errors"] == 0
    assert row["requests"] >= 20
    assert row["added_ttft_p50_ci95_ms"][0] <= row["added_ttft_p50_ms"] <= row["added_ttft_p50_ci95_ms"][1]
    # The proxy is a real extra hop: it cannot make the first token arrive sooner than the replica sends it,
    # and on an idle machine it costs a few milliseconds at most.
    assert -1.0 < row["added_ttft_p50_ms"] < 10.0
    assert 0.8 < row["tokens_per_s_ratio"] < 1.2
    assert row["bare_passthrough"]["errors"] == 0
    assert row["proxy_cpu_ms_per_1k_tokens"] > 0
