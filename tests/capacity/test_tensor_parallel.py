"""The planner chooses the TP size (capacity.planning.tensor_parallel): the all-reduce term, the table at another TP
size, and the choice by memory, the TPOT SLO, placement and GPUs. Figures are worked by hand in the comments."""

import pytest

from capacity.planning.barriers import SLO, Hardware, ModelShape, ThroughputRow, Workload
from capacity.planning.tensor_parallel import (
    STEP_OVERHEAD_S,
    Topology,
    allreduce_s,
    choose_tp,
    d_model,
    table_at_tp,
    topology_answer,
)
from tests.conftest import client_for
from tests.factories import HardwareProfileFactory

# 10 layers, 100 GB of weights: too big for one 80 GB GPU. KV per token: 2·10·8·128·2 = 40,960 B.
BIG = ModelShape(n_layers=10, n_kv_heads=8, d_head=128, dtype_bytes=2, weights_gb=100.0)
# A link so fast that the bytes cost nothing: every all-reduce is its 100 µs latency, 2·10 of them a step = 2 ms.
FLAT = Topology(domain_link_gb_s=1e12, domain_latency_s=1e-4, cross_link_gb_s=1e12, cross_latency_s=1e-3)


def test_allreduce_time_is_two_ring_allreduces_per_layer_over_the_groups_link():
    model = ModelShape(n_layers=1, n_kv_heads=1, d_head=1, dtype_bytes=2, weights_gb=1.0)
    topo = Topology(gpus_per_node=4, domain_gpus=4)
    # Message 10·1000·2 = 20,000 B. TP 4 over NVLink: 8 µs + 2·(3/4)·20,000 / 450e9 s = 8.0667 µs, ×2 per layer.
    assert allreduce_s(model, topo, 4, 10, hidden=1000) == pytest.approx(2 * (8e-6 + 30_000 / 450e9))
    # TP 8 is larger than the domain: the 50 GB/s link across and its 25 µs, 2·(25 µs + 35,000 / 50e9 s) = 51.4 µs.
    assert allreduce_s(model, topo, 8, 10, hidden=1000) == pytest.approx(51.4e-6)
    assert allreduce_s(model, topo, 1, 10, hidden=1000) == 0.0
    # d_model from the weights: 13B FP16 over 40 layers, √(13e9 / 480) ≈ 5,204 (the real model: 5,120).
    assert d_model(ModelShape(n_layers=40, n_kv_heads=8, d_head=128, weights_gb=26.0)) == pytest.approx(
        5204.2, abs=0.1
    )


def test_table_at_another_tp_splits_the_step_but_not_the_overhead_or_the_allreduces():
    rows = [ThroughputRow(batch=32, per_stream_tok_s=50.0, ttft_p95_s=0.4)]  # a 20 ms step on one GPU
    two = table_at_tp(rows, base_tp=1, tp=2, model=BIG, topology=FLAT)[0]
    # 0.5 ms + (20 − 0.5) / 2 ms + 2 ms all-reduce = 12.25 ms a step: 81.63 tok/s per stream; TTFT scales with it.
    assert STEP_OVERHEAD_S == 0.0005
    assert two.per_stream_tok_s == pytest.approx(1000 / 12.25)
    assert two.ttft_p95_s == pytest.approx(0.4 * 12.25 / 20)
    # Measured at TP 2, back to TP 1: (12.25 − 0.5 − 2) · 2 + 0.5 = 20 ms.
    back = table_at_tp([two], base_tp=2, tp=1, model=BIG, topology=FLAT)[0]
    assert back.per_stream_tok_s == pytest.approx(50.0)


def _choose(**changes):
    args = {
        "model": BIG,
        # Measured on TP 2: 10 GB of overhead for the replica, 5 GB a GPU.
        "hardware": Hardware(gpu_memory_gb=80.0, overhead_gb=10.0, gpus_per_replica=2, usd_per_gpu_hour=2.0),
        "workload": Workload(arrival_rate_per_s=10.0, input_tokens=500, output_tokens=500, context_tokens=1000),
        "slo": SLO(min_stream_tok_s=60.0),
        # 20 ms and 18.18 ms steps at TP 2: neither meets 60 tok/s per stream.
        "throughput_table": [ThroughputRow(batch=32, per_stream_tok_s=50.0), ThroughputRow(8, 55.0)],
        "topology": FLAT,
    }
    return choose_tp(**{**args, **changes})


def test_the_cheapest_tp_that_holds_the_model_and_meets_the_tpot_slo_is_chosen():
    choice = _choose()
    by_tp = {c.tp: c for c in choice.candidates}
    # TP 1: 80 − 100 − 5 GB < 0, no room for the weights.
    assert not by_tp[1].fits_memory and "leaves -25.0 GB of KV" in by_tp[1].reason
    # TP 2 holds it (160 − 100 − 10 = 50 GB of KV) but its measured rows miss 60 tok/s.
    assert by_tp[2].fits_memory and by_tp[2].kv_gb == pytest.approx(50.0) and not by_tp[2].meets_slo
    # TP 4 at batch 32: 0.5 + (20 − 0.5 − 2)·2/4 + 2 = 11.25 ms, 88.9 tok/s; 32 × 88.9 = 2,844 tok/s a replica;
    # λ·ō = 5,000 tok/s → N_thr = 2; W = 500 / 88.9 = 5.625 s, L = 56.25 → N_lat = 2: 2 replicas, 8 GPUs.
    assert by_tp[4].plan.stream_tok_s_at_b_max == pytest.approx(1000 / 11.25)
    assert (by_tp[4].replicas, by_tp[4].gpus, by_tp[4].usd_per_hour) == (2, 8, 16.0)
    # TP 8: 6.875 ms, 145.5 tok/s, 4,655 tok/s a replica → still 2 replicas, 16 GPUs.
    assert (by_tp[8].replicas, by_tp[8].gpus) == (2, 16)
    assert choice.chosen == 4 and choice.chosen_plan is by_tp[4].plan
    assert "TP 4: 2 replicas × 4 GPUs = 8 GPUs" in choice.explanation
    assert by_tp[4].placement == "4 GPUs inside one node's NVLink island"


def test_a_group_larger_than_the_domain_is_never_chosen_and_pays_the_slow_link():
    # Domains of 4 GPUs (NVLink pairs … of 4): TP 8 crosses domains, its 20 all-reduces take 1 ms each.
    topo = Topology(gpus_per_node=8, domain_gpus=4, domain_link_gb_s=1e12, domain_latency_s=1e-4,
                    cross_link_gb_s=1e12, cross_latency_s=1e-3)  # fmt: skip
    choice = _choose(topology=topo, slo=SLO(min_stream_tok_s=40.0))
    by_tp = {c.tp: c for c in choice.candidates}
    assert not by_tp[8].placeable and "no interconnect domain holds a group of 8 GPUs" in by_tp[8].placement
    # 0.5 + 17.5/4 + 20 ms = 24.875 ms: slower than TP 2's measured 20 ms, though it has four times the GPUs.
    assert by_tp[8].link == "the link across domains"
    assert by_tp[8].plan.stream_tok_s_at_b_max == pytest.approx(1000 / 24.875)
    # At 40 tok/s TP 2 meets the SLO at batch 32 (50 tok/s, 1,600 tok/s a replica): N_thr = ⌈5,000 / 1,600⌉ = 4,
    # W = 10 s, L = 100, N_lat = 4: 8 GPUs, as TP 4's 2 replicas; the tie goes to the smaller TP.
    assert (by_tp[2].gpus, by_tp[4].gpus) == (8, 8) and choice.chosen == 2


def test_no_tp_fits_says_why_for_each_size():
    choice = _choose(slo=SLO(min_stream_tok_s=500.0))
    assert choice.chosen is None and choice.chosen_plan is None
    assert choice.explanation.startswith("No TP size fits: TP 1: ")
    assert "SLO unreachable" in choice.explanation
    assert "plan" not in choice.as_dict()["candidates"][0]


def test_topology_answer_names_the_shape_and_where_a_replica_goes():
    rack = Topology(gpus_per_node=4, domain_gpus=72, domain_node_label="nvidia.com/gpu.clique")
    answer = topology_answer(rack, 16)
    assert answer["fits"] and answer["nodes"] == 4 and answer["reason"] == "4 nodes × 4 GPUs in domain domain"
    assert answer["domain_node_label"] == "nvidia.com/gpu.clique" and answer["link"] == "NVLink inside one domain"
    assert not topology_answer(Topology(gpus_per_node=8, domain_gpus=2), 4)["fits"]


PLAN_URL = "/api/v1/capacity/plan"
API_BODY = {
    "model": {"n_layers": 10, "n_kv_heads": 8, "d_head": 128, "dtype_bytes": 2, "weights_gb": 100},
    "hardware": {
        "gpu_memory_gb": 80,
        "overhead_gb": 10,
        "gpus_per_replica": 2,
        "usd_per_gpu_hour": 2,
        "gpus_per_node": 8,
        "interconnect_domain_gpus": 8,
    },  # fmt: skip
    "workload": {"arrival_rate_per_s": 10, "input_tokens": 500, "output_tokens": 500, "context_tokens": 1000},
    "slo": {"min_stream_tok_s": 60},
    "throughput_table": [{"batch": 32, "per_stream_tok_s": 50}, {"batch": 8, "per_stream_tok_s": 55}],
}


@pytest.mark.django_db
def test_api_chooses_tp_and_says_the_topology_it_assumed(tenant_a):
    client = client_for(tenant_a.member)
    plain = client.post(PLAN_URL, API_BODY, format="json").json()
    # At the measured TP 2 the SLO is out of reach; the answer still names the shape it assumed.
    assert plain["feasible"] is False and "tensor_parallel" not in plain
    assert plain["topology"]["gpus_per_replica"] == 2 and plain["topology"]["interconnect_domain_gpus"] == 8
    body = client.post(PLAN_URL, {**API_BODY, "choose_tp": True}, format="json").json()
    assert body["feasible"] is True and body["tensor_parallel"]["chosen"] == 4
    chosen = body["tensor_parallel"]["chosen"]
    row = next(c for c in body["tensor_parallel"]["candidates"] if c["tp"] == chosen)
    assert body["n_with_headroom"] == row["replicas"] and body["topology"]["gpus_per_replica"] == chosen
    assert body["topology"]["reason"] == f"{chosen} GPUs inside one node's NVLink island"
    assert [c["tp"] for c in body["tensor_parallel"]["candidates"]] == [1, 2, 4, 8]


@pytest.mark.django_db
def test_api_takes_the_topology_from_the_hardware_profile(tenant_a):
    rack = HardwareProfileFactory(
        name="gb200-nvl72", gpus_per_replica=16, gpu_memory_gb=186, gpus_per_node=4, interconnect_domain_gpus=72,
        domain_node_label="nvidia.com/gpu.clique",
    )  # fmt: skip
    body = {key: API_BODY[key] for key in ("model", "workload", "slo", "throughput_table")}
    answer = client_for(tenant_a.member).post(PLAN_URL, {**body, "hardware_profile": rack.pk}, format="json").json()
    assert answer["topology"] == {
        "gpus_per_node": 4,
        "interconnect_domain_gpus": 72,
        "domain_node_label": "nvidia.com/gpu.clique",
        "gpus_per_replica": 16,
        "fits": True,
        "nodes": 4,
        "reason": "4 nodes × 4 GPUs in domain domain",
        "mig_profile": "",
        "link": "NVLink inside one domain",
    }
