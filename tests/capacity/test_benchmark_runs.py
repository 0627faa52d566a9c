"""Benchmark runs end to end: stored versions, pinning, failures, the command over HTTP against a live simulated
replica process, and the planner benchmark's figures."""

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from capacity.hardware.profiles import get_profile
from capacity.models import CapacityBenchmark
from capacity.replica_benchmark.sweep import BenchmarkError, summarize
from capacity.services import QUICK_SWEEP, benchmark_run
from capacity.unit_resolver import endpoint_coefficients
from endpoints.models import ReplicaState, Runtime
from simulator.replica_driver import EngineDriver, engine_true_costs
from tenants.models import AuditEntry
from tests.factories import ReplicaFactory

PROFILE = get_profile("llama-13b-a100")


@pytest.fixture
def sim_endpoint(tenant_a):
    endpoint = tenant_a.endpoint
    endpoint.runtime = Runtime.SIM
    endpoint.tpot_slo_ms = 34  # ≈ 29 tok/s per stream: B_max 16 on the roofline-derived 13B profile
    endpoint.ttft_slo_ms = 2000
    endpoint.save()
    return endpoint


def test_runs_are_versioned_per_pair_and_the_latest_is_used(sim_endpoint):
    first = benchmark_run(endpoint=sim_endpoint, quick=True, driver=EngineDriver(PROFILE))
    second = benchmark_run(endpoint=sim_endpoint, quick=True, driver=EngineDriver(PROFILE))
    assert (first.version, second.version) == (1, 2)
    assert second.status == CapacityBenchmark.Status.SUCCEEDED and second.b_max >= 1
    assert second.throughput_table[0]["batch"] == 1 and second.fit_error < 0.1
    assert endpoint_coefficients(sim_endpoint).source == f"benchmark:{second.pk}"
    pinned = benchmark_run(endpoint=sim_endpoint, quick=True, pin=True, driver=EngineDriver(PROFILE))
    sim_endpoint.refresh_from_db()
    assert sim_endpoint.pinned_benchmark_id == pinned.pk
    assert AuditEntry.objects.filter(action="benchmark.complete").count() == 3


def test_a_full_sweep_stores_a_table_per_shape_and_plans_use_the_nearest(sim_endpoint):
    from capacity.planning.inputs import PlanRequest, plan_from_request

    benchmark = benchmark_run(endpoint=sim_endpoint, driver=EngineDriver(PROFILE))
    tables = benchmark.detail["tables"]
    assert "512/128" in tables and "1024/256" in tables
    batches = [row["batch"] for row in tables["1024/256"]["rows"]]
    assert benchmark.b_max in batches and len(batches) == 3  # B_max/2, B_max, 2·B_max
    workload = {"arrival_rate_per_s": 5, "input_tokens": 1000, "output_tokens": 250}
    result, sources = plan_from_request(PlanRequest(workload=workload, endpoint=sim_endpoint))
    assert sources["throughput_table"].endswith("shape 1024/256")
    assert result.feasible and result.n_base >= 1


def test_an_unreachable_slo_is_stored_as_a_failed_benchmark(sim_endpoint):
    sim_endpoint.tpot_slo_ms = 1
    sim_endpoint.save()
    with pytest.raises(BenchmarkError, match="No concurrency meets the SLO"):
        benchmark_run(endpoint=sim_endpoint, quick=True, driver=EngineDriver(PROFILE))
    failed = CapacityBenchmark.objects.get()
    assert failed.status == CapacityBenchmark.Status.FAILED and "SLO" in failed.detail["error"]
    assert failed.throughput_table[0]["batch"] == 1  # what was measured is kept
    assert endpoint_coefficients(sim_endpoint).source == "profile"


def test_a_crashing_driver_leaves_no_running_benchmark(sim_endpoint):
    class Broken:
        name = "broken"

        def run(self, *args):
            raise RuntimeError("driver bug")

    with pytest.raises(RuntimeError):
        benchmark_run(endpoint=sim_endpoint, quick=True, driver=Broken())
    assert CapacityBenchmark.objects.get().status == CapacityBenchmark.Status.FAILED


def test_command_refuses_an_endpoint_without_a_replica(sim_endpoint):
    with pytest.raises(CommandError, match="no ready replica"):
        call_command("benchmark_replica", "--endpoint", sim_endpoint.name)
    with pytest.raises(CommandError, match="no endpoint"):
        call_command("benchmark_replica", "--endpoint", "nope")


def test_plan_capacity_command(tenant_a):
    out = StringIO()
    call_command("plan_capacity", "--worked-example", "--json", stdout=out)
    assert json.loads(out.getvalue())["n_with_headroom"] == 3
    out = StringIO()
    table = json.dumps([{"batch": 64, "per_stream_tok_s": 68}])
    call_command(
        "plan_capacity", "--endpoint", tenant_a.endpoint.name, "--rate", "20", "--input", "500", "--output", "300",
        "--context", "800", "--min-stream-tok-s", "60", "--ttft-s", "0.3", "--table", table, "--json", stdout=out,
    )  # fmt: skip
    assert json.loads(out.getvalue())["n_base"] == 2
    with pytest.raises(CommandError, match="--rate"):
        call_command("plan_capacity", "--endpoint", tenant_a.endpoint.name)
    with pytest.raises(CommandError, match="invalid input"):
        call_command("plan_capacity", "--rate", "-3", "--input", "5", "--output", "5", "--table", table)


def test_bench_planner_worked_example_and_one_workload_agree():
    from benchmarks.capacity import planner

    figures, checks = planner.worked_example()
    assert all(check["matches"] for check in checks), [c for c in checks if not c["matches"]]
    assert figures["spike_backlog_tokens"] == 444_960  # exact; the source's 445,500 uses 14.5 req/s per replica
    # The chat workload (the RAG one, prefill-heavy at ρ 0.9, needs one replica more than the planner's N_base on the
    # roofline-derived 13B profile: bench planner reports it as planner_off_by_replicas).
    agreement = planner.sim_agreement(planner.WORKLOADS[0], quick=True, progress=lambda _m: None)
    assert agreement["n_base"] >= 2
    assert agreement["slo_met_at_n_base"] is True
    assert agreement["slo_met_at_n_base_minus_1"] is False


@pytest.mark.e2e
@pytest.mark.slow
def test_benchmark_replica_over_http_against_a_simulated_replica(sim_endpoint):
    """The command sweeps a live replica process over HTTP; its fit and capacity match the simulator's truth."""
    from simulator.process import start_replica

    with start_replica(profile="llama-13b-a100", speed=1.0) as process:
        ReplicaFactory(endpoint=sim_endpoint, state=ReplicaState.READY, url=process.url)
        out = StringIO()
        call_command("benchmark_replica", "--endpoint", sim_endpoint.name, "--quick", stdout=out, stderr=StringIO())
    result = json.loads(out.getvalue())
    benchmark = CapacityBenchmark.objects.get(pk=result["benchmark"])
    assert benchmark.status == CapacityBenchmark.Status.SUCCEEDED
    assert "B_max" in " ".join(benchmark.detail["progress"])
    b_max = benchmark.b_max
    reference = QUICK_SWEEP["reference_shape"]
    true = engine_true_costs(PROFILE, batch=b_max, context_tokens=reference.input_tokens + 32).in_mu()
    # Real time on a shared machine is noisier than virtual time (test_benchmarking holds the fit to 10 % there):
    # the dominant coefficients within 15 % (observed 2–11 % at load average 7–9 on 2 cores), capacity within 10 %.
    assert benchmark.alpha == pytest.approx(true["alpha"], rel=0.15)
    assert benchmark.beta == pytest.approx(true["beta"], rel=0.15)
    assert benchmark.alpha_cached < true["alpha"] / 3  # prefix-cache hits are much cheaper than prefill
    assert benchmark.fit_error < 0.15
    # The simulator's true SLO-compliant capacity at that batch, measured in virtual time with the same shape.
    truth = summarize(reference, b_max, EngineDriver(PROFILE).run(reference, b_max, 20 * b_max, "truth"))
    measured = benchmark.detail["capacity"]
    assert measured["req_per_s"] == pytest.approx(truth.req_per_s, rel=0.10)
    assert benchmark.mu_per_min == pytest.approx(1000.0, rel=0.10)
    assert endpoint_coefficients(sim_endpoint).source == f"benchmark:{benchmark.pk}"
