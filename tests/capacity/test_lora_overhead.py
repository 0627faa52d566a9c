"""The benchmark's LoRA pass: paired base/adapter runs at B_max and the overhead fit (pure, virtual time).

On the simulator's engine the truth is ``LoraConfig.overhead × rank / 16`` (``simulator.adapter_slots``): every
step of a batch holding an adapter request costs that much more. The fit must recover it within a few per cent.
"""

import pytest

from capacity.hardware.profiles import get_profile
from capacity.replica_benchmark.sweep import (
    BenchmarkError,
    CostFit,
    LevelStats,
    Shape,
    SweepConfig,
    fit_lora_overhead,
    run_sweep,
)
from simulator.replica_driver import EngineDriver
from tests.adapter_artifacts import LORA_OPTIONS, write_adapter

QUICK = dict(
    levels=(1, 8, 16),
    reference_shape=Shape(512, 64),
    fit_shapes=(Shape(128, 32), Shape(1024, 32), Shape(128, 128), Shape(768, 128, shared_prefix_tokens=512)),
    held_out_shapes=(Shape(512, 96),),
    requests_per_stream=6,
    grid_multipliers=(),
    bisect_steps=0,
)


def _level(gpu_s: float, *, uncached=500.0, out=64.0, window=40) -> LevelStats:
    return LevelStats(
        shape=Shape(512, 64), concurrency=8, requests=window + 16, failed=0, window_s=gpu_s * window,
        window_requests=window, gpu_s_per_request=gpu_s, req_per_s=1 / gpu_s, aggregate_tok_s=0.0,
        per_stream_tok_s=None, ttft_p50_s=None, ttft_p95_s=None, mean_uncached_in=uncached, mean_cached_in=0.0,
        mean_out=out,
    )  # fmt: skip


FIT = CostFit(alpha_s=0.0001, alpha_cached_s=0.0, beta_s=0.002, gamma_s=0.01)


def test_overhead_is_the_cost_ratio_minus_one_with_its_sample_count():
    result = fit_lora_overhead([(_level(0.20), _level(0.23)), (_level(0.21), _level(0.2415))], FIT)
    assert result["overhead"] == pytest.approx(0.15)
    assert result["pairs"] == [pytest.approx(0.15), pytest.approx(0.15)]
    assert (result["samples"], result["base_samples"]) == (80, 80)
    assert result["spread"] == pytest.approx(0.0, abs=1e-9)


def test_a_pass_that_served_fewer_tokens_is_compared_per_unit_of_work():
    # The adapter pass served shorter answers (half the output): the raw per-request ratio would say no overhead,
    # the cost per predicted GPU-second says +10 %.
    base = _level(0.20)
    short = CostFit(**vars(FIT))
    ratio = short.gpu_seconds(500, 0, 32) / short.gpu_seconds(500, 0, 64)
    adapter = _level(0.20 * ratio * 1.10, out=32.0)
    assert fit_lora_overhead([(base, adapter)], FIT)["overhead"] == pytest.approx(0.10)


def test_no_pairs_is_an_error():
    with pytest.raises(BenchmarkError):
        fit_lora_overhead([], FIT)


@pytest.mark.parametrize(("rank", "overhead"), [(16, 0.1), (32, 0.1), (8, 0.25)])
def test_the_sweep_recovers_the_simulators_lora_overhead(rank, overhead):
    profile = get_profile("llama-13b-a100")
    cfg = SweepConfig(tpot_slo_ms=1000 / 30, ttft_slo_ms=2000, **QUICK)
    adapter_driver = EngineDriver(profile, adapter_rank=rank, lora_overhead=overhead)
    result = run_sweep(EngineDriver(profile), cfg, adapter_driver=adapter_driver)
    lora = result["lora_overhead"]
    truth = overhead * rank / 16
    assert lora["overhead"] == pytest.approx(truth, rel=0.01)  # virtual time: no clock noise
    assert lora["concurrency"] == result["b_max"] and lora["shape"] == "512/64"
    assert lora["samples"] > 0 and len(lora["pairs"]) == cfg.lora_pairs


def test_without_an_adapter_driver_there_is_no_lora_figure():
    profile = get_profile("llama-13b-a100")
    cfg = SweepConfig(tpot_slo_ms=1000 / 30, ttft_slo_ms=2000, **QUICK)
    assert run_sweep(EngineDriver(profile), cfg)["lora_overhead"] is None


# --- Stored with the benchmark, priced by the proxy ------------------------------------------------------------


@pytest.fixture
def lora_endpoint(tenant_a, lora_root):
    from endpoints.models import Runtime

    endpoint = tenant_a.endpoint
    endpoint.runtime = Runtime.SIM
    endpoint.tpot_slo_ms, endpoint.ttft_slo_ms = 34, 2000
    endpoint.launch_options = {**(endpoint.launch_options or {}), **LORA_OPTIONS}
    endpoint.save()
    return endpoint


def test_the_fitted_overhead_is_stored_and_prices_adapter_requests(lora_endpoint, settings):
    from capacity.services import benchmark_run
    from endpoints.models import Adapter
    from gateway.proxy.snapshot_loader import read_snapshot
    from tests.factories import EndpointFactory, HardwareProfileFactory

    settings.INFERCAP = {**settings.INFERCAP, "LORA_MU_OVERHEAD": 0.05}
    profile = get_profile("llama-13b-a100")
    benchmark = benchmark_run(
        endpoint=lora_endpoint, quick=True, driver=EngineDriver(profile),
        adapter_driver=EngineDriver(profile, adapter_rank=32, lora_overhead=0.1),
    )  # fmt: skip
    assert benchmark.lora_overhead == pytest.approx(0.2, rel=0.01)
    assert benchmark.lora_overhead_samples == benchmark.detail["lora_overhead"]["samples"] > 0
    # Another (model, hardware) pair: no benchmark there.
    unmeasured = EndpointFactory(launch_options=LORA_OPTIONS, hardware_profile=HardwareProfileFactory(name="h100"))
    Adapter.objects.create(name="fitted-ft", endpoint=lora_endpoint, rank=16, artifact_path="fitted-ft")
    Adapter.objects.create(name="default-ft", endpoint=unmeasured, rank=16, artifact_path="default-ft")
    adapters = read_snapshot().adapters_by_name
    assert adapters["fitted-ft"].mu_factor == pytest.approx(1.2, rel=0.01)
    assert adapters["default-ft"].mu_factor == pytest.approx(1.05)


def test_a_benchmark_without_an_adapter_driver_leaves_the_setting_in_charge(lora_endpoint):
    from capacity.services import benchmark_run
    from capacity.unit_resolver import endpoint_coefficients

    benchmark = benchmark_run(endpoint=lora_endpoint, quick=True, driver=EngineDriver(get_profile("llama-13b-a100")))
    assert benchmark.lora_overhead is None and benchmark.detail["lora_overhead"] is None
    assert endpoint_coefficients(lora_endpoint).lora_overhead is None


def test_the_http_pass_loads_the_highest_rank_adapter_and_names_it(lora_endpoint, lora_root):
    from capacity.replica_benchmark.http_driver import HttpReplicaDriver
    from capacity.services import _adapter_driver
    from endpoints.models import Adapter

    owner = lora_endpoint.owner_tenant_id
    store = lora_root / "tenants" / str(owner)  # the owner's part of the root
    for name, rank in (("small-ft", 8), ("big-ft", 16)):
        write_adapter(store, name, rank=rank)
        Adapter.objects.create(name=name, owner_tenant_id=owner, endpoint=lora_endpoint, rank=rank, artifact_path=name)
    big = Adapter.objects.get(name="big-ft")
    driver = HttpReplicaDriver.__new__(HttpReplicaDriver)
    driver.url, driver.model, driver.headers = "http://replica", "base", {}
    loads, lines = [], []
    driver.load_adapter = lambda name, path: loads.append((name, path))
    adapter_driver = _adapter_driver(lora_endpoint, driver, lines.append)
    [(loaded_as, path)] = loads
    assert path == str((store / "big-ft").resolve())
    # Loaded under the engine name the proxies give this artifact version, never the public name.
    assert loaded_as.startswith(f"lora-t{owner}-{big.pk}-") and adapter_driver.model == loaded_as
    assert driver.model == "base"
    # An artifact gone from the store: the overhead is not measured; the benchmark goes on without it.
    (store / "big-ft" / "adapter_config.json").unlink()
    (store / "big-ft" / "adapter_model.safetensors").unlink()
    (store / "big-ft").rmdir()
    assert _adapter_driver(lora_endpoint, driver, lines.append) is None
    assert "LoRA overhead not measured" in lines[-1]
