"""The roofline the simulator's GPU profiles come from: datasheet bandwidth and FLOPs bound every profile's decode
step and prefill from below (docs/algorithms.md#simulator-engine-profiles)."""

import pytest

from capacity.hardware import roofline
from capacity.hardware.profiles import PROFILES, ROOFLINES, get_profile
from capacity.hardware.roofline import ACCELERATORS, MODELS, Efficiency
from simulator.calibration import profile_fit

A100, H100, H200 = ACCELERATORS["a100-80gb-sxm"], ACCELERATORS["h100-sxm"], ACCELERATORS["h200-sxm"]
MODEL_13B = MODELS["13b"]


def test_a_13b_model_on_an_a100_cannot_decode_a_step_in_under_12_7_ms():
    # 26 GB of FP16 weights read once per step at 2.039 TB/s.
    assert MODEL_13B.weight_bytes == 26e9
    floor = roofline.decode_floor_s(MODEL_13B, A100, batch=1, context_tokens=0)
    assert floor == pytest.approx(26e9 / 2.039e12) and 0.0127 < floor < 0.0128
    # Each context token adds its KV: 2 (K, V) · 40 layers · 8 heads · 128 dims · 2 bytes = 163,840 B.
    assert MODEL_13B.kv_bytes_per_token == 163_840
    with_context = roofline.decode_floor_s(MODEL_13B, A100, batch=64, context_tokens=64 * 800)
    assert with_context == pytest.approx((26e9 + 163_840 * 64 * 800) / 2.039e12)
    # The compute side (2 FLOPs per parameter and sequence) binds only for big batches of short contexts.
    compute_256 = roofline.decode_compute_floor_s(MODEL_13B, A100, batch=256)
    assert compute_256 == pytest.approx(2 * 13e9 * 256 / 312e12)
    assert roofline.decode_floor_s(MODEL_13B, A100, batch=256, context_tokens=256 * 16) == compute_256
    assert roofline.decode_floor_s(MODEL_13B, A100, batch=256, context_tokens=256 * 800) > compute_256


def test_prefill_costs_two_flops_per_parameter_and_token():
    assert roofline.prefill_floor_s(MODEL_13B, A100, tokens=1000) == pytest.approx(2 * 13e9 * 1000 / 312e12)
    # Tensor parallelism over 2 GPUs halves both floors.
    assert roofline.prefill_floor_s(MODEL_13B, H100, tokens=1000, gpus=2) == pytest.approx(
        roofline.prefill_floor_s(MODEL_13B, H100, tokens=1000) / 2
    )


def test_every_gpu_profile_has_a_roofline_and_respects_it():
    gpu_profiles = {name for name, p in PROFILES.items() if p.block_size == 16 and not name.startswith("tiny")}
    assert gpu_profiles == set(ROOFLINES)
    for name, line in ROOFLINES.items():
        profile = get_profile(name)
        assert profile.gpus == line.gpus
        assert line.violations(profile) == [], name
        # The per-context-token cost is at least the KV bytes the step reads, not a fraction of them.
        assert profile.decode_per_ctx_token_s >= line.model.kv_bytes_per_token / (
            line.accelerator.bandwidth_bytes_s * line.gpus
        )


def test_the_old_13b_profile_decoded_faster_than_bandwidth_allows():
    # 7.45 ms steps and a quarter of the KV bytes per context token (the profile before the roofline).
    old = get_profile("llama-13b-a100", decode_t0_s=0.00745, decode_per_seq_s=0.0001053, decode_per_ctx_token_s=2e-8)
    violations = ROOFLINES["llama-13b-a100"].violations(old)
    assert violations and all("< roofline" in v for v in violations)
    assert ROOFLINES["llama-13b-a100"].violations(get_profile("llama-13b-a100", prefill_tokens_per_s=20_000))


def test_the_default_profile_decodes_as_its_roofline_says():
    """Per-stream decode rate of the 13B profile at batch 16 / 64 / 128 (500-token prompts, 300-token outputs):
    below the roofline's ceiling, and what its step-time formula gives at ≈650 context tokens per sequence."""
    profile = get_profile("llama-13b-a100")
    measured = profile_fit(profile)
    for batch, tok_s in measured.items():
        ceiling = 1 / roofline.decode_floor_s(MODEL_13B, A100, batch=batch, context_tokens=batch * 650)
        assert tok_s < ceiling
        assert tok_s == pytest.approx(1 / profile.decode_step_s(batch, batch * 650), rel=0.05), (batch, measured)


def test_more_bandwidth_decodes_faster_and_kv_blocks_fill_what_memory_is_left():
    model = MODELS["qwen3-32b"]
    on_h100 = roofline.engine_constants(model, H100)
    on_h200 = roofline.engine_constants(model, H200)
    assert on_h200["decode_per_ctx_token_s"] == pytest.approx(on_h100["decode_per_ctx_token_s"] * 3.35 / 4.8)
    assert on_h200["prefill_tokens_per_s"] == pytest.approx(on_h100["prefill_tokens_per_s"])  # same FLOPs
    # The worked example's M_KV: 80 GB − 26 GB of weights − 10 GB overhead = 44 GB → 16,784 blocks of 16 tokens.
    blocks = roofline.kv_cache_blocks(MODEL_13B, A100, block_size=16, memory_utilization=1.0, overhead_gb=10)
    assert blocks == 16_784 == get_profile("llama-13b-a100").num_gpu_blocks
    with pytest.raises(ValueError, match="does not fit"):
        roofline.kv_cache_blocks(MODELS["qwen3-32b"], ACCELERATORS["l40s"], block_size=16)


@pytest.mark.parametrize("bad", [{"mbu": 0}, {"mfu": 1.5}, {"step_overhead_s": -1}])
def test_efficiencies_are_shares_of_the_datasheet(bad):
    with pytest.raises(ValueError):
        Efficiency(**bad)
