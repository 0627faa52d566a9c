"""Prefill/decode disaggregation in the data model and the proxy's snapshot: the endpoint's serving mode, its prefill
pool's coefficients and each replica's role reach the snapshot; the model refuses inconsistent pools."""

import pytest
from django.core.exceptions import ValidationError

from capacity.models import CapacityBenchmark
from endpoints.models import ReplicaState
from gateway.proxy.snapshot_loader import read_snapshot
from tests.factories import EndpointFactory, HardwareProfileFactory, ReplicaFactory


def _benchmark(model_profile, hardware_profile, version, **coeffs):
    values = {"alpha": 0.001, "alpha_cached": 0.0001, "beta": 0.01, "gamma": 0.1, "mu_per_min": 600.0} | coeffs
    return CapacityBenchmark.objects.create(
        model_profile=model_profile,
        hardware_profile=hardware_profile,
        version=version,
        status=CapacityBenchmark.Status.SUCCEEDED,
        **values,
    )


@pytest.mark.django_db
def test_an_aggregated_endpoint_keeps_todays_snapshot(tenant_a):
    replica = ReplicaFactory(endpoint=tenant_a.endpoint, state=ReplicaState.READY)
    info = read_snapshot().endpoints_by_name[tenant_a.endpoint.name]
    assert info.serving_mode == "aggregated" and not info.disaggregated
    assert info.prefill_coeffs is None
    assert info.kv_connector == "shared_storage" and info.pd_min_uncached_tokens == 256
    assert [(r.id, r.role) for r in info.replicas] == [(replica.pk, "mixed")]


@pytest.mark.django_db
def test_a_disaggregated_endpoint_carries_roles_and_the_prefill_pools_coefficients(django_assert_max_num_queries):
    prefill_hw = HardwareProfileFactory(name="h100-prefill", memory_bandwidth_gbps=3350)
    endpoint = EndpointFactory(serving_mode="disaggregated", kv_connector="nixl", pd_min_uncached_tokens=64)
    endpoint.prefill_hardware_profile = prefill_hw
    endpoint.save()
    _benchmark(endpoint.model_profile, endpoint.hardware_profile, 1, beta=0.02)
    _benchmark(endpoint.model_profile, prefill_hw, 1, alpha=0.0005, gamma=0.05)
    prefill = ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY, role="prefill", hardware_profile=prefill_hw)
    decode = ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY, role="decode")
    with django_assert_max_num_queries(16):
        info = read_snapshot().endpoints_by_name[endpoint.name]
    assert info.disaggregated and info.kv_connector == "nixl" and info.pd_min_uncached_tokens == 64
    assert {r.id: r.role for r in info.replicas} == {prefill.pk: "prefill", decode.pk: "decode"}
    assert info.coeffs.beta == 0.02 and info.coeffs.alpha == 0.001, "the endpoint's own: the decode pool's"
    assert info.prefill_coeffs.alpha == 0.0005 and info.prefill_coeffs.gamma == 0.05, "the prefill hardware's"


@pytest.mark.django_db
def test_the_prefill_pools_pinned_benchmark_wins_and_same_hardware_falls_back_to_the_endpoints():
    endpoint = EndpointFactory(serving_mode="disaggregated")
    _benchmark(endpoint.model_profile, endpoint.hardware_profile, 1, alpha=0.002)
    info = read_snapshot().endpoints_by_name[endpoint.name]
    assert info.prefill_coeffs == info.coeffs, "no prefill hardware or benchmark of its own: the endpoint's pair"
    pinned = _benchmark(endpoint.model_profile, endpoint.hardware_profile, 2, alpha=0.0007)
    _benchmark(endpoint.model_profile, endpoint.hardware_profile, 3, alpha=0.003)
    endpoint.prefill_pinned_benchmark = pinned
    endpoint.save()
    info = read_snapshot().endpoints_by_name[endpoint.name]
    assert info.prefill_coeffs.alpha == 0.0007 and info.coeffs.alpha == 0.003


@pytest.mark.django_db
def test_inconsistent_pools_are_field_errors():
    endpoint = EndpointFactory.build(serving_mode="disaggregated", kv_connector="", prefill_min_replicas=3)
    endpoint.prefill_max_replicas = 2
    with pytest.raises(ValidationError) as exc:
        endpoint.clean()
    assert set(exc.value.message_dict) == {"kv_connector", "prefill_min_replicas"}
    endpoint.kv_connector = "shared_storage"
    endpoint.prefill_max_replicas = 3
    endpoint.clean()
    aggregated = EndpointFactory.build(kv_connector="")
    aggregated.clean()  # an aggregated endpoint moves no KV: no connector needed


@pytest.mark.django_db
def test_a_prefill_replica_takes_priority_by_its_pools_launch_options():
    endpoint = EndpointFactory(serving_mode="disaggregated", prefill_launch_options={"scheduling_policy": "fcfs"})
    prefill = ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY, role="prefill")
    decode = ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY, role="decode")
    info = read_snapshot().endpoints_by_name[endpoint.name]
    assert {r.id: r.takes_priority for r in info.replicas} == {prefill.pk: False, decode.pk: True}
