"""``benchmark_replica --smoke`` against the real engine: the load sweep, the fit of α, α_c, β, γ and the held-out
error, stored as a benchmark of the endpoint's (model, hardware) pair. The figures of a 2-core shared machine are
rough; what must hold is that the sweep runs through, the fit is a fit and the error is reported."""

from __future__ import annotations

import json
import math
from io import StringIO

import pytest
from django.core.management import call_command

from capacity.models import CapacityBenchmark

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db]


def test_benchmark_replica_fits_the_real_engine_and_reports_held_out_error(engine_endpoint, capsys):
    endpoint, replica = engine_endpoint
    out = StringIO()
    call_command("benchmark_replica", "--endpoint", endpoint.name, "--smoke", stdout=out)
    result = json.loads(out.getvalue())
    coefficients = [result[name] for name in ("alpha", "alpha_cached", "beta", "gamma")]
    assert all(math.isfinite(c) and c >= 0 for c in coefficients), result
    assert sum(coefficients) > 0 and result["mu_per_min"] > 0 and result["b_max"] >= 1
    assert math.isfinite(result["fit_error"]), result  # the held-out relative error
    benchmark = CapacityBenchmark.objects.get(pk=result["benchmark"])
    assert benchmark.status == CapacityBenchmark.Status.SUCCEEDED and benchmark.detail["url"] == replica.url
    shapes = benchmark.detail["fit"]["shapes"]
    assert sum(row["held_out"] for row in shapes) == 2 and len(shapes) == 6
    # The engine's own usage, not a guess: the shared-prefix shape was served from its prefix cache.
    assert any(row["cached_in"] > 0 for row in shapes if "p/" in row["shape"]), shapes
    assert "held out 256+128p/12" in capsys.readouterr().err  # progress, as an operator watches it
