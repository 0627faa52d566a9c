"""How fast a GPU can run a dense model at best, from datasheet figures (pure): the simulator's GPU profiles come
from here (``profiles.py``), and a profile that decodes or prefills faster than this is wrong.

    decode step ≥ max((weight bytes + KV bytes read) / memory bandwidth,  2 · params · batch / peak FLOPs)
    prefill     ≥ 2 · params · tokens / peak FLOPs

Every decode step reads all the weights once and the KV cache of every running sequence's whole context; at the
batches vLLM serves the bandwidth side binds (the compute side overtakes it only at hundreds of sequences).
A profile is the floor divided by what engines achieve (``Efficiency``): a share of the datasheet bandwidth (MBU)
and of the peak FLOPs (MFU), plus a fixed cost per step. The engine's step is linear,
``t0 + per_seq · batch + per_ctx · context_tokens``, so the memory time and the compute time are added, not
maxed: a little pessimistic where they overlap, never faster than the roofline.
Datasheet figures (dense BF16, no 2:4 sparsity): A100 80GB SXM 2.039 TB/s, 312 TFLOPS; H100 SXM 3.35 TB/s,
989 TFLOPS; H200 SXM 4.8 TB/s, 989 TFLOPS; L40S 0.864 TB/s, 362 TFLOPS.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Accelerator:
    name: str
    memory_gb: float
    memory_bandwidth_tb_s: float  # datasheet peak
    bf16_dense_tflops: float  # datasheet peak, dense (the "with sparsity" figure is twice this)

    @property
    def bandwidth_bytes_s(self) -> float:
        return self.memory_bandwidth_tb_s * 1e12

    @property
    def flops(self) -> float:
        return self.bf16_dense_tflops * 1e12


ACCELERATORS: dict[str, Accelerator] = {
    "a100-80gb-sxm": Accelerator("NVIDIA A100 80GB SXM", 80, 2.039, 312),
    "h100-sxm": Accelerator("NVIDIA H100 SXM", 80, 3.35, 989),
    "h200-sxm": Accelerator("NVIDIA H200 SXM", 141, 4.8, 989),
    "l40s": Accelerator("NVIDIA L40S", 48, 0.864, 362),
}


@dataclass(frozen=True)
class DenseModel:
    name: str
    params_b: float  # billions of parameters
    n_layers: int
    n_kv_heads: int
    d_head: int
    dtype_bytes: int = 2

    @property
    def params(self) -> float:
        return self.params_b * 1e9

    @property
    def weight_bytes(self) -> float:
        return self.params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """Keys and values of one token in every layer (the planner's ``kv_tok``)."""
        return 2 * self.n_layers * self.n_kv_heads * self.d_head * self.dtype_bytes


MODELS: dict[str, DenseModel] = {
    # The planner's worked example (docs/algorithms.md#the-worked-example): 26 GB of FP16 weights, 163,840 B of KV
    # per token.
    "13b": DenseModel("13B dense (the worked example)", 13.0, 40, 8, 128),
    "llama-3.1-8b": DenseModel("Llama 3.1 8B", 8.03, 32, 8, 128),
    "qwen3-32b": DenseModel("Qwen3 32B", 32.8, 64, 8, 128),
}


@dataclass(frozen=True)
class Efficiency:
    """What a tuned engine reaches of the datasheet: assumptions, not measurements (``bench fidelity`` measures
    a real engine; these stand for GPUs no test can reach)."""

    mbu: float = 0.8  # share of the memory bandwidth decode kernels sustain
    mfu: float = 0.5  # share of the peak FLOPs matmuls sustain (prefill, and decode's per-sequence compute)
    step_overhead_s: float = 0.0005  # per step: scheduling, sampling, kernel launches
    prefill_overhead_s: float = 0.005  # per step that prefills: attention set-up, the chunk's bookkeeping

    def __post_init__(self) -> None:
        if not (0 < self.mbu <= 1 and 0 < self.mfu <= 1):
            raise ValueError("mbu and mfu are shares of the datasheet peak: in (0, 1]")
        if self.step_overhead_s < 0 or self.prefill_overhead_s < 0:
            raise ValueError("overheads cannot be negative")


def decode_memory_floor_s(model: DenseModel, gpu: Accelerator, *, context_tokens: float, gpus: int = 1) -> float:
    """Time to read the weights and ``context_tokens`` tokens of KV once at full bandwidth (tensor parallelism
    splits both over ``gpus``)."""
    return (model.weight_bytes + model.kv_bytes_per_token * context_tokens) / (gpu.bandwidth_bytes_s * gpus)


def decode_compute_floor_s(model: DenseModel, gpu: Accelerator, *, batch: int, gpus: int = 1) -> float:
    return 2 * model.params * batch / (gpu.flops * gpus)


def decode_floor_s(model: DenseModel, gpu: Accelerator, *, batch: int, context_tokens: float, gpus: int = 1) -> float:
    """The roofline of one decode step of ``batch`` sequences holding ``context_tokens`` tokens in all."""
    return max(
        decode_memory_floor_s(model, gpu, context_tokens=context_tokens, gpus=gpus),
        decode_compute_floor_s(model, gpu, batch=batch, gpus=gpus),
    )


def prefill_floor_s(model: DenseModel, gpu: Accelerator, *, tokens: int, gpus: int = 1) -> float:
    return 2 * model.params * tokens / (gpu.flops * gpus)


def engine_constants(
    model: DenseModel, gpu: Accelerator, *, gpus: int = 1, efficiency: Efficiency = Efficiency()
) -> dict[str, float]:
    """The simulator profile's step-time constants (``EngineProfile`` field names) for this model on this GPU."""
    bandwidth = gpu.bandwidth_bytes_s * gpus * efficiency.mbu
    flops = gpu.flops * gpus * efficiency.mfu
    return {
        "decode_t0_s": model.weight_bytes / bandwidth + efficiency.step_overhead_s,
        "decode_per_seq_s": 2 * model.params / flops,
        "decode_per_ctx_token_s": model.kv_bytes_per_token / bandwidth,
        "prefill_tokens_per_s": flops / (2 * model.params),
        "prefill_overhead_s": efficiency.prefill_overhead_s,
    }


def kv_cache_blocks(
    model: DenseModel,
    gpu: Accelerator,
    *,
    block_size: int,
    gpus: int = 1,
    memory_utilization: float = 0.9,
    overhead_gb: float = 4.0,
) -> int:
    """KV blocks left once the weights and the per-GPU overhead (activations, CUDA graphs) are placed in the share
    of GPU memory vLLM may use (``--gpu-memory-utilization``); 1 GB = 1e9 bytes, as the planner's M_KV."""
    kv_bytes = gpus * (gpu.memory_gb * memory_utilization - overhead_gb) * 1e9 - model.weight_bytes
    if kv_bytes <= 0:
        raise ValueError(f"{model.name} does not fit on {gpus} × {gpu.name}")
    return int(kv_bytes // (model.kv_bytes_per_token * block_size))


def roofline_violations(
    profile, model: DenseModel, gpu: Accelerator, *, gpus: int = 1, batches=None, context_tokens=None
) -> list[str]:
    """Where ``profile`` (an ``EngineProfile``) is faster than the roofline: empty when it never is.

    Checked at every batch up to ``max_num_seqs`` (or ``batches``) and at context totals from 0 to the whole KV
    cache, and for prefills of 1 to ``max_num_batched_tokens`` tokens."""
    out = []
    capacity = profile.num_gpu_blocks * profile.block_size
    batches = batches or sorted({1, 2, 4, 8, 16, 32, 64, 128, 256, 512, profile.max_num_seqs} - {0})
    contexts = context_tokens or [0, capacity // 100, capacity // 10, capacity // 2, capacity]
    for batch in (b for b in batches if b <= profile.max_num_seqs):
        for context in contexts:
            step, floor = (
                profile.decode_step_s(batch, context),
                decode_floor_s(model, gpu, batch=batch, context_tokens=context, gpus=gpus),
            )
            if step < floor * (1 - 1e-9):
                out.append(
                    f"decode of {batch} sequences over {context} context tokens: {step * 1e3:.3f} ms < roofline "
                    f"{floor * 1e3:.3f} ms"
                )
    for tokens in (1, 128, 512, profile.max_num_batched_tokens):
        time_s, floor = profile.prefill_s(tokens), prefill_floor_s(model, gpu, tokens=tokens, gpus=gpus)
        if time_s < floor * (1 - 1e-9):
            out.append(f"prefill of {tokens} tokens: {time_s * 1e3:.3f} ms < roofline {floor * 1e3:.3f} ms")
    return out
