"""The routing workload suite: request shapes where the choice of replica decides throughput (pure, seeded).

Each generator takes the arrival times (``times``: requests, or session starts for ``chat_sessions``) and a seed,
and yields ``SimRequest`` objects whose ``extra`` names what an oracle with full knowledge would use (``group``,
``true_output_tokens``). Parameters and where each shape comes from are in docs/algorithms.md (the routing
workload suite); in short:

* ``prefix_groups``: G groups, each a P-token shared prefix (system prompt, few-shot examples or a document),
  then a Q-token question of its own and an O-token answer. llm-d's shared-prefix benchmark is 32 × 2,048; the
  cache-pressure row is 256 × 4,096 on a fleet whose KV holds about a quarter of them; ``zipf_s`` draws groups
  with Zipf popularity (s ≈ 1.1, the skew of system-prompt and document popularity in production traces,
  e.g. Mooncake's and Character.AI's reports of a few very hot prefixes);
* ``chat_sessions``: multi-turn chats of 3–12 turns (uniform), an exponential think time between an answer and
  the next question, each turn's prompt the whole conversation so far (ShareGPT/LMSYS-Chat-style sessions);
* ``mixed_lengths``: independent prompts with log-normal lengths and long-tailed log-normal outputs (the shape
  of ShareGPT and Azure LLM inference traces: median prompts of ~1k tokens, outputs with a heavy tail).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Iterator

from simulator.tokens import distinct_text, filler_text, output_text
from simulator.workloads import SimRequest


def zipf_weights(n: int, s: float) -> list[float]:
    """Popularity of ranks 1..n under Zipf(s), normalized to sum 1."""
    raw = [1.0 / (k**s) for k in range(1, n + 1)]
    total = sum(raw)
    return [w / total for w in raw]


def prefix_groups(
    *,
    times: Iterable[float],
    groups: int,
    prefix_tokens: int,
    question_tokens: int,
    output_tokens: int,
    zipf_s: float | None = None,
    seed: int = 0,
    name: str = "pg",
) -> Iterator[SimRequest]:
    """A random group's shared prefix, then a question of its own (never repeated), then a fixed-length answer."""
    rng = random.Random(f"{name}-pick-{seed}")
    prefixes = [filler_text(prefix_tokens, seed=f"{name}-prefix-{seed}-{g}") for g in range(groups)]
    weights = zipf_weights(groups, zipf_s) if zipf_s else None
    cumulative = list(_cumulative(weights)) if weights else None
    for i, t in enumerate(times):
        g = rng.randrange(groups) if cumulative is None else _draw(rng, cumulative)
        question = filler_text(question_tokens, seed=f"{name}-q-{seed}-{i}")
        yield SimRequest(
            request_id=f"{name}-{i}",
            arrival_s=t,
            prompt_parts=(prefixes[g], question),
            output_tokens=output_tokens,
            extra={"group": g, "true_output_tokens": output_tokens},
        )


def chat_sessions(
    *,
    times: Iterable[float],
    turns: tuple[int, int] = (3, 12),
    system_tokens: int = 1024,
    user_tokens_median: int = 128,
    answer_tokens_median: int = 200,
    sigma: float = 0.6,
    think_time_s: float = 10.0,
    seed: int = 0,
    ends_at: list[float] | None = None,
) -> Iterator[SimRequest]:
    """Sessions starting at ``times``; turn k+1 arrives an exponential think time after turn k ended, its prompt
    the system prompt + every earlier question and answer + the new question (context grows by each answer).
    ``ends_at`` (a one-element list the caller may lower while the run goes on): no turn arrives after it.

    Each session draws its turn count, lengths and think times from a generator of its own: a shared one would be
    consumed in the order turns finish, so a router that served faster would get other conversations (other
    lengths, other turn counts) than one that served slower, and the policies would not be compared on one
    workload. Only when a turn arrives depends on the service."""
    system = filler_text(system_tokens, seed=f"chat-system-{seed}")

    def turn(session: str, rng: random.Random, k: int, last: int, history: str, at: float) -> SimRequest:
        def draw(median: int, cap: int) -> int:
            return max(8, min(cap, int(median * math.exp(rng.gauss(0.0, sigma)))))

        user = filler_text(draw(user_tokens_median, 1024), seed=f"chat-{seed}-{session}-{k}")
        answer_tokens = draw(answer_tokens_median, 1024)
        request = SimRequest(
            request_id=f"{session}-t{k}",
            arrival_s=at,
            prompt_parts=(system, history + user),
            output_tokens=answer_tokens,
            session_id=session,
            extra={"group": session, "true_output_tokens": answer_tokens, "turn": k},
        )
        if k < last:
            think_s = rng.expovariate(1 / think_time_s)

            def followup(result, _history=history + user) -> SimRequest | None:
                at = result.finish_s + think_s
                if ends_at is not None and at > ends_at[0]:
                    return None
                answer = output_text(0, result.output_tokens or 0)
                return turn(session, rng, k + 1, last, _history + answer, at)

            request.followup = followup
        return request

    for i, t in enumerate(times):
        session = f"s{seed}-{i}"
        rng = random.Random(f"chat-{seed}-{session}")
        yield turn(session, rng, 0, rng.randint(*turns) - 1, "", t)


def mixed_lengths(
    *,
    times: Iterable[float],
    prompt_median: int = 1024,
    prompt_sigma: float = 1.0,
    prompt_range: tuple[int, int] = (32, 8192),
    output_median: int = 128,
    output_sigma: float = 1.2,
    output_range: tuple[int, int] = (8, 2048),
    seed: int = 0,
) -> Iterator[SimRequest]:
    """Independent prompts (no shared prefix), log-normal prompt lengths and long-tailed log-normal outputs."""
    rng = random.Random(f"mixed-{seed}")
    for i, t in enumerate(times):
        prompt = _clamp(int(prompt_median * math.exp(rng.gauss(0.0, prompt_sigma))), prompt_range)
        output = _clamp(int(output_median * math.exp(rng.gauss(0.0, output_sigma))), output_range)
        yield SimRequest(
            request_id=f"mx-{i}",
            arrival_s=t,
            prompt_parts=(distinct_text(prompt, seed=f"mixed-{seed}-{i}"),),
            output_tokens=output,
            extra={"true_output_tokens": output},
        )


def _clamp(value: int, bounds: tuple[int, int]) -> int:
    return max(bounds[0], min(bounds[1], value))


def _cumulative(weights: list[float]) -> Iterator[float]:
    total = 0.0
    for w in weights:
        total += w
        yield total


def _draw(rng: random.Random, cumulative: list[float]) -> int:
    x = rng.random() * cumulative[-1]
    lo, hi = 0, len(cumulative) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if cumulative[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo
