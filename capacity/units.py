"""The model-unit (MU) cost function: the capacity currency of sold, used and have (pure: no Django).

``MU = alpha·uncached_in + alpha_cached·cached_in + beta·out + gamma``, with coefficients per (model, hardware)
fitted by ``replica_benchmark.sweep``. The scale is GPU time: **1 MU = 60 ms of one GPU's time at its SLO-compliant
maximum load**, so one fully used GPU delivers 1,000 MU/min and a dollar figure follows from the GPU-hour rate.
The Django-side resolver (endpoint → coefficients) lives in ``capacity.unit_resolver``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

# GPU-seconds per model unit: 60 ms, so a GPU at full SLO-compliant load sells 1,000 MU per minute.
GPU_SECONDS_PER_MU = 0.06
MU_PER_GPU_MINUTE = 60.0 / GPU_SECONDS_PER_MU
# Output length assumed for a request that sets no max_tokens, when the caller has no better estimate.
TYPICAL_OUTPUT_TOKENS = 256


@dataclass(frozen=True)
class MUCoefficients:
    """Cost per token kind and per request in MU, and the MU/min one replica delivers at its SLO-compliant maximum."""

    alpha: float  # per uncached prompt token (prefill)
    alpha_cached: float  # per prompt token served from the prefix cache
    beta: float  # per generated token (decode)
    gamma: float  # per request (scheduling, prefill overhead)
    mu_per_min: float  # one replica's capacity
    source: str = "profile"  # "profile" or "benchmark:<id>" — where the numbers came from
    lora_overhead: float | None = (
        None  # an adapter request costs 1 + this times more (its benchmark); None: unmeasured
    )

    def __post_init__(self) -> None:
        for name in ("alpha", "alpha_cached", "beta", "gamma", "mu_per_min"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or math.isnan(value) or value < 0:
                raise ValueError(f"{name} must be a non-negative number, got {value!r}")

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def output_to_input_ratio(self) -> float:
        """How many uncached prompt tokens one output token is worth (Azure PTU: ≈3 for gpt-4o)."""
        return self.beta / self.alpha if self.alpha else math.inf


def request_mu(coeffs: MUCoefficients, uncached_in: int, cached_in: int, out: int) -> float:
    """The exact cost of a finished request from its usage (prompt tokens split by prefix-cache hit)."""
    if uncached_in < 0 or cached_in < 0 or out < 0:
        raise ValueError("token counts must be non-negative")
    return coeffs.alpha * uncached_in + coeffs.alpha_cached * cached_in + coeffs.beta * out + coeffs.gamma


# The chat-shaped request a request count is turned into MU with (docs/algorithms.md#the-reference-request).
REFERENCE_REQUEST = (500, 300)  # prompt tokens, output tokens


def relative_speed(reference: MUCoefficients, other: MUCoefficients) -> float:
    """How fast a replica with ``other``'s coefficients serves against one with ``reference``'s: the ratio of the
    reference requests each completes per minute at its SLO-compliant maximum. MU are GPU time on their own
    hardware, so two hardware types' MU/min are not comparable; their rates of one request are. A replica on
    ``other``'s hardware sustains ``reference.mu_per_min × this`` in ``reference``'s units."""
    prompt, output = REFERENCE_REQUEST

    def rate(coeffs: MUCoefficients) -> float:
        return coeffs.mu_per_min / max(request_mu(coeffs, prompt, 0, output), 1e-12)

    return rate(other) / rate(reference) if rate(reference) > 0 else 1.0


def usage_mu(coeffs: MUCoefficients, *, prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> float:
    """The same cost from an OpenAI ``usage`` block, where prompt_tokens includes the cached ones."""
    cached = min(max(cached_tokens, 0), max(prompt_tokens, 0))
    return request_mu(coeffs, max(prompt_tokens, 0) - cached, cached, max(completion_tokens, 0))


def estimate_request_mu(
    coeffs: MUCoefficients,
    *,
    prompt_tokens: int,
    max_tokens: int | None = None,
    expected_cached_tokens: int = 0,
    typical_output_tokens: int = TYPICAL_OUTPUT_TOKENS,
) -> float:
    """Cost charged at admission, before the output length is known.

    Uses ``max_tokens`` when the client set it (an upper bound: admission must not under-count a reservation),
    else a typical output length. Metering later replaces it with ``usage_mu`` of what actually ran.
    """
    out = max_tokens if max_tokens is not None and max_tokens >= 0 else typical_output_tokens
    prompt = max(prompt_tokens, 0)
    cached = min(max(expected_cached_tokens, 0), prompt)
    return request_mu(coeffs, prompt - cached, cached, out)


def estimate_prompt_tokens(text_chars: int) -> int:
    """Rough token count of a prompt before tokenizing (≈4 characters per token for English BPE vocabularies)."""
    return max(1, math.ceil(max(text_chars, 0) / 4))


def mu_to_gpu_seconds(mu: float) -> float:
    return mu * GPU_SECONDS_PER_MU


def gpu_seconds_to_mu(gpu_seconds: float) -> float:
    return gpu_seconds / GPU_SECONDS_PER_MU
