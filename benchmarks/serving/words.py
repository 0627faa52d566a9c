"""Random prompt text for the routing benches (sim and live), in whole simulator tokens of 4 characters."""

import random

_WORDS = (
    "data",
    "node",
    "gpus",
    "kv_c",
    "fast",
    "slow",
    "tick",
    "rack",
    "warm",
    "cold",
    "load",
    "unit",
    "heap",
    "page",
)


def random_text(tokens: int, rng: random.Random) -> str:
    """``tokens`` simulator tokens (4 characters each) of random words."""
    return "".join(rng.choices(_WORDS, k=tokens))
