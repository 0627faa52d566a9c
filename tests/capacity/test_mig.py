"""MIG slices (placement/mig.py, docs/placement.md "MIG slices"): a hardware profile that names a slice
describes one replica on one slice; the planner plans TP 1 on it and says why no TP group places; an endpoint on it
may not ask for a TP group; the names reaching CUDA_VISIBLE_DEVICES are MIG device UUIDs and nothing else."""

import pytest
from django.urls import reverse

from capacity.planning.barriers import SLO, Hardware, ModelShape, ThroughputRow, Workload
from capacity.planning.tensor_parallel import Topology, choose_tp, topology_answer
from endpoints.models import Endpoint, ReplicaState
from placement import mig
from tests.conftest import client_for
from tests.factories import HardwareProfileFactory, ReplicaFactory

UUID_A = "MIG-4f8a1c2e-0b7d-5e3a-9c61-2d4b8e7f0a13"
UUID_B = "MIG-9b2c7d1e-4a6f-5b8c-8d2e-1f3a5c7e9b24"


def test_profile_names_read_as_compute_sevenths_and_memory():
    assert mig.parse("1g.10gb") == mig.MigSlice("1g.10gb", 1, 10)
    assert mig.parse("3g.40gb").describe() == "one MIG 3g.40gb slice (3/7 of a GPU's compute, 40 GB)"
    assert mig.parse("1g.10gb+me").memory_gb == 10
    for bad in ("8g.80gb", "1g.0gb", "1g10gb", "a100", "", "1g.10gb;rm", "1g.10gb\n"):
        with pytest.raises(ValueError, match="expected <compute>g.<memory>gb"):
            mig.parse(bad)


def test_the_device_plugins_resource_per_strategy():
    assert mig.resource_name("1g.10gb", "mixed") == "nvidia.com/mig-1g.10gb"
    assert mig.resource_name("1g.10gb", "single") == "nvidia.com/gpu"
    assert mig.product_label_value("NVIDIA-A100-SXM4-80GB", "1g.10gb") == "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"
    with pytest.raises(ValueError, match="strategy 'none'"):
        mig.resource_name("1g.10gb", "none")
    assert mig.strategy_of("") == "mixed" and mig.strategy_of(None) == "mixed"
    # A label value takes no "+", and feature discovery's spelling of it there is not known: refused, not guessed.
    with pytest.raises(ValueError, match="single strategy"):
        mig.product_label_value("NVIDIA-A100-SXM4-80GB", "1g.10gb+me")


def test_local_slices_take_uuids_only_each_once():
    assert mig.local_slices(f"1g.10gb={UUID_A},{UUID_B}; 3g.40gb=MIG-GPU-0a1b2c3d/1/0") == {
        "1g.10gb": [UUID_A, UUID_B],
        "3g.40gb": ["MIG-GPU-0a1b2c3d/1/0"],
    }
    assert mig.local_slices("") == {} and mig.local_slices(None) == {}
    # An index is not a MIG device (CUDA_VISIBLE_DEVICES would read it as a whole GPU); a duplicate would be
    # allotted twice; a missing "=" names no profile.
    with pytest.raises(ValueError, match="'0' is not a MIG device's UUID"):
        mig.local_slices(f"1g.10gb={UUID_A},0")
    with pytest.raises(ValueError, match="listed twice"):
        mig.local_slices(f"1g.10gb={UUID_A};2g.20gb={UUID_A}")
    with pytest.raises(ValueError, match="expected <profile>=<MIG device UUID>"):
        mig.local_slices(UUID_A)


@pytest.mark.django_db
def test_a_mig_profile_is_one_slice_a_replica_and_no_more_memory_than_its_name(operator):
    url = reverse("hardware-profile-list")
    body = {"name": "a100-1g", "gpu_type": "A100-80GB", "gpu_memory_gb": 10, "memory_bandwidth_gbps": 255,
            "usd_per_gpu_hour": 0.55, "mig_profile": "1g.10gb"}  # fmt: skip
    client = client_for(operator)
    # The default 10 GB of overhead would leave a 10 GB slice nothing for weights or KV: refused, not planned empty.
    no_room = client.post(url, body, format="json")
    assert no_room.status_code == 400 and "leaves nothing for weights" in no_room.json()["memory_overhead_gb"][0]
    body["memory_overhead_gb"] = 1.5
    created = client.post(url, body, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["replica_fit"] == {
        "fits": True,
        "nodes": 1,
        "reason": "one MIG 1g.10gb slice (1/7 of a GPU's compute, 10 GB)",
    }
    tp2 = client.post(url, {**body, "name": "a100-1g-tp2", "gpus_per_replica": 2}, format="json")
    assert tp2.status_code == 400 and "cannot span MIG instances" in tp2.json()["gpus_per_replica"][0]
    big = client.post(url, {**body, "name": "a100-1g-big", "gpu_memory_gb": 20}, format="json")
    assert big.status_code == 400 and "has 10 GB" in big.json()["gpu_memory_gb"][0]
    odd = client.post(url, {**body, "name": "a100-odd", "mig_profile": "9g.10gb"}, format="json")
    assert odd.status_code == 400 and "mig_profile" in odd.json()


@pytest.mark.django_db
def test_an_endpoint_on_a_slice_may_not_ask_its_engine_for_a_tp_group(tenant_a, operator):
    piece = HardwareProfileFactory(name="h100-1g", gpu_memory_gb=10, mig_profile="1g.10gb")
    Endpoint.objects.filter(pk=tenant_a.endpoint.pk).update(hardware_profile=piece)
    url = reverse("endpoint-detail", args=[tenant_a.endpoint.pk])
    refused = client_for(operator).patch(url, {"launch_options": {"tensor_parallel_size": 2}}, format="json")
    assert refused.status_code == 400, refused.content
    assert "a MIG 1g.10gb replica is one slice" in str(refused.json()["launch_options"])
    allowed = client_for(operator).patch(url, {"launch_options": {"tensor_parallel_size": 1}}, format="json")
    assert allowed.status_code == 200, allowed.content
    # A spot pool on slices runs the endpoint's launch options too: TP 2 there is refused the same way.
    whole = HardwareProfileFactory(name="h100-whole", gpus_per_replica=2)
    Endpoint.objects.filter(pk=tenant_a.endpoint.pk).update(hardware_profile=whole, spot_hardware_profile=piece)
    spot = client_for(operator).patch(url, {"launch_options": {"tensor_parallel_size": 2}}, format="json")
    assert spot.status_code == 400 and "h100-1g: a MIG 1g.10gb replica is one slice" in str(spot.json())


@pytest.mark.django_db
def test_a_profile_turns_into_a_slice_or_back_only_with_nothing_running_or_asking_for_a_tp_group(tenant_a, operator):
    whole = HardwareProfileFactory(name="h100-one", gpus_per_replica=1, gpu_memory_gb=80)
    Endpoint.objects.filter(pk=tenant_a.endpoint.pk).update(
        hardware_profile=whole, launch_options={"tensor_parallel_size": 2}
    )
    url = reverse("hardware-profile-detail", args=[whole.pk])
    client = client_for(operator)
    cut = {"mig_profile": "1g.10gb", "gpu_memory_gb": 10, "memory_overhead_gb": 1.5}
    refused = client.patch(url, cut, format="json")
    assert refused.status_code == 400, refused.content
    assert "tensor_parallel_size 2 on h100-one: a MIG 1g.10gb replica is one slice" in str(
        refused.json()["mig_profile"]
    )
    Endpoint.objects.filter(pk=tenant_a.endpoint.pk).update(launch_options={})
    running = ReplicaFactory(endpoint=tenant_a.endpoint, state=ReplicaState.READY)
    refused = client.patch(url, cut, format="json")
    assert refused.status_code == 400 and "1 replica(s) run on h100-one" in str(refused.json()["mig_profile"])
    running.state = ReplicaState.STOPPED
    running.save(update_fields=["state"])
    assert client.patch(url, cut, format="json").status_code == 200
    whole.refresh_from_db()
    assert whole.mig_profile == "1g.10gb"
    # Any other change goes through whatever runs: a price
    ReplicaFactory(endpoint=tenant_a.endpoint, state=ReplicaState.READY)
    assert client.patch(url, {"usd_per_gpu_hour": 0.4}, format="json").status_code == 200
    back = client.patch(url, {"mig_profile": ""}, format="json")
    assert back.status_code == 400 and "run on h100-one" in str(back.json()["mig_profile"])


@pytest.mark.django_db
def test_only_a_version_a_rollout_moves_to_or_from_holds_a_profiles_change_back(tenant_a, operator):
    from endpoints.models import EndpointVersion, Rollout

    whole = HardwareProfileFactory(name="h100-one", gpus_per_replica=1, gpu_memory_gb=80)
    endpoint = tenant_a.endpoint
    old = EndpointVersion.objects.create(endpoint=endpoint, number=1, model_profile=endpoint.model_profile,
                                         hardware_profile=whole, launch_options={"tensor_parallel_size": 2})  # fmt: skip
    url = reverse("hardware-profile-detail", args=[whole.pk])
    client = client_for(operator)
    cut = {"mig_profile": "1g.10gb", "gpu_memory_gb": 10, "memory_overhead_gb": 1.5}
    assert client.patch(url, cut, format="json").status_code == 200  # a retired version launches nothing again
    assert client.patch(url, {"mig_profile": "", "gpu_memory_gb": 80}, format="json").status_code == 200
    current = EndpointVersion.objects.create(endpoint=endpoint, number=2, model_profile=endpoint.model_profile,
                                             hardware_profile=endpoint.hardware_profile)  # fmt: skip
    Rollout.objects.create(endpoint=endpoint, from_version=current, to_version=old)
    refused = client.patch(url, cut, format="json")
    assert refused.status_code == 400 and "version 1: tensor_parallel_size 2" in str(refused.json()["mig_profile"])
    # A replica of that version, on the version's profile, holds it back too
    Rollout.objects.all().delete()
    ReplicaFactory(endpoint=endpoint, version=old, state=ReplicaState.STARTING)
    EndpointVersion.objects.filter(pk=old.pk).update(launch_options={})
    refused = client.patch(url, cut, format="json")
    assert refused.status_code == 400 and "1 replica(s) run on h100-one" in str(refused.json()["mig_profile"])


# 3 GB of weights, 2 layers: KV per token 2·2·8·128·2 = 8,192 B. A 10 GB slice less 2 GB overhead holds 5 GB of KV.
SMALL = ModelShape(n_layers=2, n_kv_heads=8, d_head=128, dtype_bytes=2, weights_gb=3.0)
TABLE = [ThroughputRow(batch=8, per_stream_tok_s=40.0), ThroughputRow(batch=16, per_stream_tok_s=30.0)]


def _choose(topology: Topology, weights_gb: float = 3.0):
    return choose_tp(
        model=ModelShape(**{**SMALL.__dict__, "weights_gb": weights_gb}),
        hardware=Hardware(gpu_memory_gb=10.0, overhead_gb=2.0, gpus_per_replica=1, usd_per_gpu_hour=0.5),
        workload=Workload(arrival_rate_per_s=2.0, input_tokens=200, output_tokens=100, context_tokens=300),
        slo=SLO(min_stream_tok_s=25.0),
        throughput_table=TABLE,
        topology=topology,
    )


def test_the_planner_plans_one_replica_a_slice_and_no_tp_group():
    choice = _choose(Topology(mig_profile="1g.10gb"))
    by_tp = {c.tp: c for c in choice.candidates}
    assert choice.chosen == 1 and by_tp[1].placeable and by_tp[1].kv_gb == pytest.approx(5.0)
    assert by_tp[1].placement == "one MIG 1g.10gb slice (1/7 of a GPU's compute, 10 GB)"
    assert by_tp[1].link == "none (one MIG slice)"
    # The same figures on whole GPUs place TP 2 too; on slices it never places, whatever its memory.
    assert all(not by_tp[t].placeable and "cannot span MIG instances" in by_tp[t].placement for t in (2, 4, 8))
    answer = topology_answer(Topology(mig_profile="1g.10gb"), 1)
    assert answer["fits"] and answer["mig_profile"] == "1g.10gb" and answer["reason"].startswith("one MIG 1g.10gb")
    assert not topology_answer(Topology(mig_profile="1g.10gb"), 2)["fits"]
    # A model the slice cannot hold: no TP size fits, and the answer says the slice's memory is why.
    too_big = _choose(Topology(mig_profile="1g.10gb"), weights_gb=9.0)
    assert too_big.chosen is None and "TP 1: 1 × 10 GB − weights 9 GB − overhead 2 GB" in too_big.explanation


@pytest.mark.django_db
def test_the_plan_api_takes_the_slice_from_the_hardware_profile(tenant_a):
    piece = HardwareProfileFactory(name="h100-3g", gpu_memory_gb=40, mig_profile="3g.40gb")
    body = {
        "model": {"n_layers": 2, "n_kv_heads": 8, "d_head": 128, "dtype_bytes": 2, "weights_gb": 3},
        "workload": {"arrival_rate_per_s": 2, "input_tokens": 200, "output_tokens": 100},
        "slo": {"min_stream_tok_s": 25},
        "throughput_table": [{"batch": 8, "per_stream_tok_s": 40}],
        "hardware_profile": piece.pk,
        "choose_tp": True,
    }
    answer = client_for(tenant_a.member).post("/api/v1/capacity/plan", body, format="json").json()
    assert answer["tensor_parallel"]["chosen"] == 1
    assert answer["topology"]["mig_profile"] == "3g.40gb" and answer["topology"]["link"] == "none (one MIG slice)"
    bad = client_for(tenant_a.member).post(
        "/api/v1/capacity/plan", {**body, "hardware": {"mig_profile": "1g"}}, format="json"
    )
    assert bad.status_code == 400 and "mig_profile" in str(bad.json())
