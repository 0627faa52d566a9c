"""The benchmark against the simulator's engine in virtual time, and the simulator's true costs from its profile.

The engine is the performance model the simulated HTTP replica runs (``simulator/engine.py``); driven
in virtual time there is no clock noise, so a sweep here is what a perfect measurement of that replica would see.
"""

from __future__ import annotations

from capacity.replica_benchmark.sweep import BenchmarkError, CostFit, Sample, Shape, output_lengths, prompt_text
from simulator.engine import Engine, Sequence
from simulator.tokens import block_hashes, count_tokens


class EngineDriver:
    """The simulator's engine in virtual time: the same performance model as the HTTP replica, with no clock noise.

    Used for the simulator's *true* figures (what a perfect measurement would see) and fast tests of the fit.
    """

    name = "sim-engine"

    def __init__(self, profile, *, adapter_rank: int = 0, lora_overhead: float = 0.0):
        """``adapter_rank`` > 0: every request names an adapter of that rank, on an engine whose LoRA step overhead
        is ``lora_overhead`` (``simulator.adapter_slots.LoraConfig.overhead``, at rank 16)."""
        self.profile = profile
        self.adapter_rank, self.lora_overhead = adapter_rank, lora_overhead

    def run(self, shape: Shape, concurrency: int, requests: int, run_id: str) -> list[Sample]:
        engine = Engine(self.profile)
        engine.lora_overhead = self.lora_overhead
        adapter = "bench-adapter" if self.adapter_rank > 0 else None
        outputs = output_lengths(shape, requests, run_id)
        samples: list[Sample] = []
        issued = 0
        now = 0.0

        def issue() -> None:
            nonlocal issued
            text = prompt_text(
                shape.input_tokens, prefix_tokens=shape.shared_prefix_tokens, run_id=run_id, index=issued
            )
            engine.add(
                Sequence(
                    f"{run_id}-{issued}",
                    count_tokens(text),
                    outputs[issued],
                    block_hashes(text),
                    arrival_s=now,
                    adapter=adapter,
                    lora_rank=self.adapter_rank,
                )
            )
            issued += 1

        for _ in range(min(concurrency, requests)):
            issue()
        while len(samples) < requests:
            plan = engine.plan(now, 1 << 30)
            if plan is None:
                raise BenchmarkError("engine idle with requests outstanding")
            now += plan.duration()
            for seq in engine.commit(plan, plan.steps, now):
                samples.append(
                    Sample(seq.arrival_s, now, seq.first_token_s, seq.prompt_tokens, seq.cached_tokens, seq.generated)
                )
                if issued < requests:
                    issue()
        return samples


def engine_true_costs(profile, *, batch: int, context_tokens: float, admitted_per_prefill: float = 1.0) -> CostFit:
    """The simulator's costs straight from its profile (``simulator/engine.py``), in GPU-seconds.

    A prefill step stops the whole replica for ``overhead + uncached / rate``; cached tokens cost nothing. A decode
    step of ``batch`` sequences takes ``t0 + per_seq·batch + per_ctx·Σcontext`` and yields one token per sequence,
    so one output token costs ``t0/batch + per_seq + per_ctx·context``.
    """
    gpus = profile.gpus
    return CostFit(
        alpha_s=gpus / profile.prefill_tokens_per_s,
        alpha_cached_s=0.0,
        beta_s=gpus
        * (profile.decode_t0_s / batch + profile.decode_per_seq_s + profile.decode_per_ctx_token_s * context_tokens),
        gamma_s=gpus * profile.prefill_overhead_s / admitted_per_prefill,
    )
