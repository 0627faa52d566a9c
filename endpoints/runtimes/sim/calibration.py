"""Measure a profile the way the 13B table was measured: per-stream decode tok/s at a fixed batch (pure)."""

from __future__ import annotations

from .engine import Engine, Sequence
from .profiles import EngineProfile
from .tokens import block_hashes, count_tokens, filler_text


def decode_tok_s_per_stream(profile: EngineProfile, batch: int, *, prompt: int = 500, output: int = 300) -> float:
    """Per-stream tokens/s while ``batch`` sequences decode together (prefills excluded), by running the engine.

    All sequences are submitted at once; the rate is taken between the step when the last one got its first
    token and the first finish, so it is the steady decode rate of that batch with 500–800 context tokens.
    """
    engine = Engine(profile)
    seqs = []
    for i in range(batch):
        text = filler_text(prompt, seed=f"calibration-{i}")
        seqs.append(engine.add(Sequence(f"c{i}", count_tokens(text), output, block_hashes(text))))
    now = 0.0
    window_start = None
    while True:
        plan = engine.plan(now, 10**9)
        if plan is None:
            break
        if window_start is None and not plan.admitted and all(s.generated > 0 for s in seqs):
            window_start = (now, seqs[0].generated)
        now += plan.duration()
        finished = engine.commit(plan, plan.steps, now)
        if finished and window_start is not None:
            start_s, start_tokens = window_start
            return (seqs[0].generated - start_tokens) / (now - start_s) if now > start_s else 0.0
    raise RuntimeError(f"batch {batch} never reached a steady decode window (max_num_seqs or KV too small?)")


def profile_fit(profile: EngineProfile, batches=(16, 64, 128)) -> dict[int, float]:
    return {b: round(decode_tok_s_per_stream(profile, b), 2) for b in batches}
