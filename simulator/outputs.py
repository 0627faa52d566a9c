"""Where a simulated answer ends, and the text, token ids and logprobs it shows (pure).

An engine stops at the first of: EOS (sampled after a natural length; the EOS token counts in
``completion_tokens`` but shows no text), a stop string completed in the text (``finish_reason: "stop"``,
``stop_reason`` the string, the text cut before it), or ``max_tokens`` (``"length"``). The natural length is
drawn from the profile's log-normal (``output_tokens_median``, ``output_tokens_sigma``) by a hash of the prompt,
the request's ``seed`` and the choice index, so a replay answers alike, as greedy decoding would; ``ignore_eos``
removes it and ``min_tokens`` holds EOS and stop strings back, as in vLLM. While a stop string might still
match, streaming holds back its length minus one characters (vLLM's ``stop_buffer_length``).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from statistics import NormalDist

from capacity.hardware.profiles import EngineProfile
from simulator.tokens import CHARS_PER_TOKEN, OUTPUT_WORDS, output_text

_NORMAL = NormalDist()


@dataclass(frozen=True)
class OutputPlan:
    tokens: int  # tokens the engine generates (an EOS included)
    finish_reason: str  # "stop" or "length"
    stop_reason: str | None = None  # the stop string that ended it
    text_chars: int | None = None  # characters of text shown, when the end cuts it (EOS, stop string)
    holdback_chars: int = 0  # characters a stream keeps back until a stop string can no longer match

    def visible_chars(self, generated: int, finished: bool) -> int:
        """Characters of text a client has seen after ``generated`` tokens."""
        chars = generated * CHARS_PER_TOKEN
        if self.text_chars is not None:
            chars = min(chars, self.text_chars)
        return chars if finished else max(0, chars - self.holdback_chars)

    def text(self) -> str:
        full = output_text(0, self.tokens)
        return full if self.text_chars is None else full[: self.text_chars]


def natural_length(profile: EngineProfile, *, prompt_text: str, seed: int | None, index: int) -> int:
    """Tokens until EOS (EOS included) for this prompt and choice: a log-normal draw keyed by a hash."""
    key = f"{seed}|{index}|".encode() + prompt_text.encode()
    u = (zlib.crc32(key) + 0.5) / 2**32
    z = _NORMAL.inv_cdf(u)
    return max(1, round(profile.output_tokens_median * math.exp(profile.output_tokens_sigma * z)))


def plan_output(
    *,
    natural_tokens: int,
    max_tokens: int,
    min_tokens: int = 0,
    ignore_eos: bool = False,
    stop: list[str] | tuple = (),
    include_stop_str_in_output: bool = False,
) -> OutputPlan:
    """The end of one choice: EOS, a stop string or ``max_tokens``, whichever comes first."""
    # vLLM masks EOS until min_tokens tokens are out.
    eos_at = None if ignore_eos else max(natural_tokens, min_tokens + 1)
    holdback = max(map(len, stop)) - 1 if stop and not include_stop_str_in_output else 0
    with_text = max_tokens if eos_at is None or eos_at > max_tokens else eos_at - 1  # the EOS token shows no text
    if stop and with_text > min_tokens:
        text = output_text(0, with_text)
        floor = min_tokens * CHARS_PER_TOKEN  # stop strings count only once min_tokens are out
        best = None
        for s in stop:
            start = text.find(s, max(0, floor - len(s) + 1))
            if start != -1 and (best is None or start + len(s) < best[0] + len(best[1])):
                best = (start, s)
        if best is not None:
            start, s = best
            end = start + len(s)
            tokens = -(-end // CHARS_PER_TOKEN)
            shown = end if include_stop_str_in_output else start
            return OutputPlan(tokens, "stop", s, shown, holdback)
    if eos_at is not None and eos_at <= max_tokens:
        return OutputPlan(eos_at, "stop", None, (eos_at - 1) * CHARS_PER_TOKEN, holdback)
    return OutputPlan(max_tokens, "length", None, None, holdback)


def token_id(text: str, vocab_size: int) -> int:
    return zlib.crc32(text.encode()) % vocab_size


def prompt_token_ids(text: str, vocab_size: int) -> list[int]:
    """Stand-in token ids of a text prompt (one per 4 characters), for ``echo`` with streaming."""
    return [token_id(text[i : i + CHARS_PER_TOKEN], vocab_size) for i in range(0, len(text), CHARS_PER_TOKEN)]


def _logprob(position: int, rank: int) -> float:
    """A plausible log-probability of a random-weight model: about -8 for the sampled token, a bit higher for
    the alternatives, deterministic per position."""
    jitter = (zlib.crc32(f"{position}:{rank}".encode()) % 10_000) / 10_000
    return -(8.0 + jitter) if rank == 0 else -(7.0 + jitter / 2 + rank * 0.05)


def _alternatives(position: int, sampled: str, count: int) -> list[tuple[str, float]]:
    words = [w for w in OUTPUT_WORDS if w != sampled]
    start = position % len(words)
    return [(words[(start + i) % len(words)], _logprob(position, i + 1)) for i in range(count)]


def chat_logprobs(start: int, tokens: list[str], top: int) -> dict:
    """``choices[].logprobs`` of a chat answer's tokens (``start``: the position of the first)."""
    content = []
    for offset, token in enumerate(tokens):
        position = start + offset
        sampled = _logprob(position, 0)
        # vLLM lists the sampled token first among the top ones, ``top`` entries in all.
        ranked = [(token, sampled), *_alternatives(position, token, max(0, top - 1))][:top]
        content.append(
            {
                "token": token,
                "logprob": sampled,
                "bytes": list(token.encode()),
                "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in ranked],
            }
        )
    return {"content": content}


def completion_logprobs(start: int, tokens: list[str], top: int, text_offset: int) -> dict:
    """``choices[].logprobs`` of a completion's tokens: parallel lists, ``top_logprobs`` as token → logprob maps
    of the sampled token and ``top`` alternatives."""
    offsets, values, tops = [], [], []
    for offset, token in enumerate(tokens):
        position = start + offset
        sampled = _logprob(position, 0)
        offsets.append(text_offset)
        text_offset += len(token)
        values.append(sampled)
        tops.append({token: sampled, **dict(_alternatives(position, token, top))})
    return {"text_offset": offsets, "token_logprobs": values, "tokens": list(tokens), "top_logprobs": tops}
