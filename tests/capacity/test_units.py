"""The model-unit cost function and the endpoint → coefficients resolver."""

import pytest

from capacity.models import CapacityBenchmark
from capacity.unit_resolver import coefficients_by_endpoint, endpoint_coefficients, hardware_speeds
from capacity.units import MUCoefficients, estimate_request_mu, relative_speed, request_mu, usage_mu
from tests.factories import HardwareProfileFactory

COEFFS = MUCoefficients(alpha=0.001, alpha_cached=0.0001, beta=0.01, gamma=0.05, mu_per_min=1000)


def test_request_mu_is_linear_in_each_token_kind():
    assert request_mu(COEFFS, 500, 0, 300) == pytest.approx(0.5 + 3.0 + 0.05)
    assert request_mu(COEFFS, 0, 1000, 0) == pytest.approx(0.1 + 0.05)
    assert COEFFS.output_to_input_ratio == pytest.approx(10)


def test_usage_mu_splits_cached_prompt_tokens():
    assert usage_mu(COEFFS, prompt_tokens=600, cached_tokens=100, completion_tokens=10) == pytest.approx(
        request_mu(COEFFS, 500, 100, 10)
    )
    # A replica reporting more cached than prompt tokens must not produce a negative count.
    assert usage_mu(COEFFS, prompt_tokens=10, cached_tokens=50, completion_tokens=0) == pytest.approx(0.001 + 0.05)


def test_estimate_uses_max_tokens_else_typical_output():
    assert estimate_request_mu(COEFFS, prompt_tokens=100, max_tokens=20) == pytest.approx(0.1 + 0.2 + 0.05)
    assert estimate_request_mu(COEFFS, prompt_tokens=100) == pytest.approx(0.1 + 2.56 + 0.05)


@pytest.mark.parametrize("field", ["alpha", "beta", "mu_per_min"])
def test_negative_coefficients_are_refused(field):
    values = dict(alpha=0.001, alpha_cached=0.0, beta=0.01, gamma=0.0, mu_per_min=10.0)
    values[field] = -1
    with pytest.raises(ValueError, match=field):
        MUCoefficients(**values)
    with pytest.raises(ValueError):
        request_mu(COEFFS, -1, 0, 0)


def _benchmark(endpoint, version, status=CapacityBenchmark.Status.SUCCEEDED, beta=0.02):
    return CapacityBenchmark.objects.create(
        model_profile=endpoint.model_profile,
        hardware_profile=endpoint.hardware_profile,
        version=version,
        status=status,
        alpha=0.002,
        alpha_cached=0.0,
        beta=beta,
        gamma=0.1,
        mu_per_min=900.0,
    )


def test_resolver_prefers_pinned_then_latest_succeeded_then_profile(tenant_a, django_assert_max_num_queries):
    endpoint = tenant_a.endpoint
    assert endpoint_coefficients(endpoint).source == "profile"
    assert endpoint_coefficients(endpoint).beta == endpoint.model_profile.beta
    v1 = _benchmark(endpoint, 1, beta=0.03)
    v2 = _benchmark(endpoint, 2, beta=0.04)
    _benchmark(endpoint, 3, status=CapacityBenchmark.Status.FAILED)
    assert endpoint_coefficients(endpoint).source == f"benchmark:{v2.pk}"
    endpoint.pinned_benchmark = v1
    endpoint.save()
    assert endpoint_coefficients(endpoint).beta == 0.03
    with django_assert_max_num_queries(3):
        bulk = coefficients_by_endpoint([endpoint])
    assert bulk[endpoint.pk].source == f"benchmark:{v1.pk}"


def test_relative_speed_compares_rates_of_one_request_not_mu_per_minute():
    slow = MUCoefficients(alpha=0.002, alpha_cached=0.0002, beta=0.02, gamma=0.1, mu_per_min=1000.0)
    # Half the GPU time per token on faster hardware, the same MU/min per GPU: twice the requests per minute.
    fast = MUCoefficients(alpha=0.001, alpha_cached=0.0001, beta=0.01, gamma=0.05, mu_per_min=1000.0)
    assert relative_speed(slow, fast) == pytest.approx(2.0)
    assert relative_speed(fast, slow) == pytest.approx(0.5)
    assert relative_speed(fast, fast) == pytest.approx(1.0)
    # Two GPUs a replica: twice the MU/min at the same cost per request.
    assert relative_speed(fast, MUCoefficients(**{**fast.as_dict(), "mu_per_min": 2000.0})) == pytest.approx(2.0)


def test_hardware_speeds_from_benchmarks_else_memory_bandwidth(tenant_a, django_assert_max_num_queries):
    endpoint = tenant_a.endpoint  # its hardware: 2,039 GB/s, one GPU (tests/factories.py)
    model, a100 = endpoint.model_profile_id, endpoint.hardware_profile_id
    h100 = HardwareProfileFactory(name="h100-80g", gpu_type="H100", memory_bandwidth_gbps=3350).pk
    pair = HardwareProfileFactory(name="l40s-x2", gpu_type="L40S", gpus_per_replica=2, memory_bandwidth_gbps=864).pk
    unknown = HardwareProfileFactory(name="unlisted", gpu_type="?", memory_bandwidth_gbps=0).pk
    triples = {(model, a100, h100, None), (model, a100, pair, None), (model, a100, unknown, None)}
    triples.add((model, a100, a100, None))
    with django_assert_max_num_queries(2):
        speeds = hardware_speeds(triples)
    assert speeds[(model, a100, h100, None)] == pytest.approx(3350 / 2039)  # no benchmarks: decode's roofline
    assert speeds[(model, a100, pair, None)] == pytest.approx(2 * 864 / 2039)
    assert speeds[(model, a100, unknown, None)] == 1.0 and speeds[(model, a100, a100, None)] == 1.0

    def speed(pin=None):
        return hardware_speeds({(model, a100, h100, pin)})[(model, a100, h100, pin)]

    # Benchmarks of both pairs outrank the roofline; one of the two alone does not.
    first = _benchmark(endpoint, 1)  # alpha 0.002, beta 0.02, gamma 0.1, 900 MU/min
    assert speed() == pytest.approx(3350 / 2039)
    CapacityBenchmark.objects.create(
        model_profile_id=model, hardware_profile_id=h100, version=1, status=CapacityBenchmark.Status.SUCCEEDED,
        alpha=0.001, alpha_cached=0.0, beta=0.01, gamma=0.05, mu_per_min=900.0,
    )  # fmt: skip
    assert speed() == pytest.approx(2.0)
    # The endpoint's side is the benchmark its model units come from: the pinned one over a later, slower one.
    _benchmark(endpoint, 2, beta=0.04)
    assert speed() > 2.2
    with django_assert_max_num_queries(3):
        assert speed(first.pk) == pytest.approx(2.0)
    # A benchmark that served nothing says nothing about speed: 1, not a replica the router would never pick.
    CapacityBenchmark.objects.filter(hardware_profile_id=h100).update(mu_per_min=0.0)
    assert speed() == 1.0


def test_pure_modules_import_no_django():
    """The proxy, Celery and the simulator share these; they must not need Django's settings or apps."""
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys; import capacity.units, capacity.planning.barriers, capacity.replica_benchmark.sweep, "
        "simulator.replica_driver, capacity.replica_benchmark.http_driver; "
        "sys.exit(1 if any(m == 'django' or m.startswith('django.') for m in sys.modules) else 0)"
    )
    root = Path(__file__).resolve().parents[2]
    assert subprocess.run([sys.executable, "-c", code], cwd=root, timeout=60).returncode == 0
