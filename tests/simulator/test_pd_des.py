"""The discrete-event P/D model: prefill pool, KV transfer over a shared link, decode pool from the transferred KV."""

import pytest

from capacity.hardware.profiles import get_profile
from simulator.engine import Sequence
from simulator.pd_des import PDFleet, PDRequest, PDSimulation, pd_mix_requests, pd_requests
from simulator.workloads import poisson_times

PROFILE = get_profile("llama-8b-h100").with_options(max_model_len=32768)
KV = 2 * 32 * 8 * 128 * 2  # Llama 3.1 8B, bytes per token


def pd_fleet(decode=1, prefill=1, **kw):
    return PDFleet(
        profile=PROFILE, replicas=decode, prefill_replicas=prefill, mode="disaggregated", kv_bytes_per_token=KV, **kw
    )


def test_one_request_pays_prefill_transfer_and_decodes_from_the_transferred_kv():
    # Given one 8,000-token prompt on an idle pair over a 100 Gb/s link
    result = PDSimulation(pd_fleet(link_gbps=100, link_latency_s=0.002)).run([PDRequest("a", 0.0, 8000, 100)])
    (r,) = result.requests
    # Then its TTFT is the prefill, then the transfer of 8,000 × 128 KiB at 12.5 GB/s, then one decode step
    prefill = PROFILE.prefill_s(8000) + PROFILE.decode_t0_s
    transfer = 8000 * KV / 12.5e9 + 0.002
    assert r.extra["prefill_done_s"] == pytest.approx(prefill, rel=1e-6)
    assert r.extra["transfer_s"] == pytest.approx(transfer, rel=1e-6)
    assert r.status == "ok" and r.output_tokens == 100
    # and the decode replica hit every full block of the prompt (it recomputed the last partial one only)
    assert r.cached_tokens == (8000 - 1) // 16 * 16 and not r.extra["kv_recomputed"]
    assert prefill + transfer < r.ttft_s < prefill + transfer + 0.05
    decode = next(rep for rep in result.replicas if rep.replica_id == "decode-0")
    assert decode.prefix_hits == r.cached_tokens


def test_transfers_sharing_a_link_stretch_each_other():
    # Two equal prompts on two prefill replicas finish their prefill together; on one link they share 10 Gb/s
    requests = [PDRequest("a", 0.0, 4000, 20), PDRequest("b", 0.0, 4000, 20)]
    alone = PDSimulation(pd_fleet(prefill=2, decode=2, link_gbps=10)).run(requests)
    # one prefill replica: b's prefill follows a's (one step each), then both share its link
    shared = PDSimulation(pd_fleet(prefill=1, decode=2, link_gbps=10)).run(requests)
    one = 4000 * KV / 1.25e9
    assert [r.extra["transfer_s"] for r in alone.requests] == pytest.approx([one, one], rel=1e-6)
    a, b = shared.requests
    lead = b.extra["prefill_done_s"] - a.extra["prefill_done_s"]
    assert 0.1 < lead < one
    # a sends alone for `lead`, then both at half rate until a is done, then b alone: both take 2·one − lead
    assert [a.extra["transfer_s"], b.extra["transfer_s"]] == pytest.approx([2 * one - lead] * 2, rel=1e-6)


def test_disaggregation_removes_the_prefill_stalls_from_decode():
    # Given long prompts at a load where an aggregated replica spends a third of its time prefilling
    times = list(poisson_times(2.0, count=120, seed=3))
    requests = list(pd_requests(times, prompt_tokens=(6000, 12000), output_tokens=(200, 300), seed=3))
    agg = PDSimulation(PDFleet(profile=PROFILE, replicas=2)).run(requests)
    pd = PDSimulation(pd_fleet(decode=1, prefill=1, link_gbps=400)).run(requests)
    # Then the decode replica's streams never wait behind a prompt's chunks: TPOT p90 well under aggregated's
    assert pd.percentile("tpot_s", 90) < 0.8 * agg.percentile("tpot_s", 90)
    # while TTFT pays the prefill pool's queue and the transfer
    assert pd.percentile("ttft_s", 50) > agg.percentile("ttft_s", 50)
    assert all(r.status == "ok" for r in pd.requests + agg.requests)


def test_selective_disaggregation_sends_short_prompts_straight_to_decode():
    requests = [PDRequest("short", 0.0, 100, 10), PDRequest("long", 0.0, 3000, 10)]
    result = PDSimulation(pd_fleet(min_uncached_tokens=256)).run(requests)
    paths = {r.request_id: r.extra["path"] for r in result.requests}
    assert paths == {"short": "direct", "long": "prefill"}
    short = result.requests[0]
    assert short.cached_tokens == 0 and "transfer_s" not in short.extra


def test_kv_that_does_not_fit_the_decode_cache_is_recomputed():
    # A decode replica with fewer free blocks than the prompt's KV prefills the prompt itself
    small = PROFILE.with_options(num_gpu_blocks=300)
    fleet = PDFleet(
        profile=small, replicas=1, prefill_replicas=1, mode="disaggregated", kv_bytes_per_token=KV,
        prefill_profile=PROFILE,
    )  # fmt: skip
    # a decodes 700 tokens while b's KV arrives: 250 blocks for b, 50 free
    result = PDSimulation(fleet).run([PDRequest("a", 0.0, 4000, 700), PDRequest("b", 0.01, 4000, 10)])
    a, b = result.requests
    assert a.status == b.status == "ok"
    assert not a.extra["kv_recomputed"] and b.extra["kv_recomputed"] and b.cached_tokens == 0
    assert b.first_token_s > a.finish_s  # b waited for a's blocks, then prefilled itself


def test_same_inputs_same_results_and_oracle_router():
    times = list(poisson_times(4.0, count=60, seed=1))
    shapes = [(0.5, (128, 1024), (64, 256)), (0.5, (4096, 8192), (64, 128))]
    requests = list(pd_mix_requests(times, shapes=shapes, seed=1))
    runs = [PDSimulation(pd_fleet(prefill=2, decode=2, router="oracle")).run(requests) for _ in range(2)]
    assert runs[0].digest() == runs[1].digest()
    assert {r.replica_id for r in runs[0].requests} == {"decode-0", "decode-1"}  # both decode replicas took streams
    assert {r.extra["prefill_replica"] for r in runs[0].requests} == {"prefill-0", "prefill-1"}


@pytest.mark.parametrize(
    ("router", "expected"),
    [("least_loaded", "decode-0"), ("oracle", "decode-1"), ("oracle_overlap", "decode-0")],
)
def test_the_clairvoyant_pairings_weigh_what_the_streams_have_left(router, expected):
    """decode-0 holds one stream with 1,000 tokens to go, decode-1 three with 200 each; a new stream of 100 tokens
    shares 100 stream-steps with decode-0 and 300 with decode-1 over its life."""
    sim = PDSimulation(pd_fleet(decode=2, router=router))
    for node, outputs in zip(sim.decode, ([1000], [200, 200, 200]), strict=True):
        for i, out in enumerate(outputs):
            node.in_flight[f"{node.replica_id}-{i}"] = (None, None, Sequence(f"{node.replica_id}-{i}", 64, out, []))
    new = PDRequest("new", 0.0, prompt_tokens=4096, output_tokens=100)
    assert sim._pick_decode(new).replica_id == expected


def test_bad_fleets_are_refused():
    with pytest.raises(ValueError):
        PDFleet(profile=PROFILE, replicas=1, mode="disaggregated", prefill_replicas=0, kv_bytes_per_token=KV)
    with pytest.raises(ValueError):
        PDFleet(profile=PROFILE, replicas=1, mode="disaggregated", prefill_replicas=1)  # no KV size
    with pytest.raises(ValueError):
        PDFleet(profile=PROFILE, replicas=1, router="random")
    # a prompt over the context is the engine's 400, not a crash
    result = PDSimulation(PDFleet(profile=PROFILE.with_options(max_model_len=1000), replicas=1)).run(
        [PDRequest("x", 0.0, 2000, 10)]
    )
    assert result.requests[0].status == "error"
