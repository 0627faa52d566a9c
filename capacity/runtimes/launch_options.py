"""Which launch options a tenant may set, with the values each may take, and the check every value passes before it
becomes an element of a replica's argv (pure: no Django; the API, the services and the local actuator use it).

Tenants tune their own replicas within an allowlist; anything else (which actuator, Deployment, namespace, CPU
placement, executable, raw flags, host, port, faults, tensor parallelism, GPU memory, dtype, the model path) is the
operators' call. The served model is the endpoint's model profile, never a launch option a tenant can write.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

_TOKEN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_OPTION_KEY = re.compile(r"^[a-z_][a-z0-9_]{0,31}$")
# A value that reaches argv: no leading '-' (a flag), no whitespace, NUL or other control characters.
_ARGV_UNSAFE = re.compile(r"[\s\x00-\x1f\x7f]")


def _whole(low: int, high: int) -> Callable[[object], str | None]:
    def check(value) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            return f"must be a whole number from {low} to {high}"
        return None

    return check


def _number(low: float, high: float) -> Callable[[object], str | None]:
    def check(value) -> str | None:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or not low < value <= high:
            return f"must be a number above {low:g} and at most {high:g}"
        return None

    return check


def _choice(*values) -> Callable[[object], str | None]:
    def check(value) -> str | None:
        if isinstance(value, bool) or value not in values:
            return f"must be one of {', '.join(map(str, values))}"
        return None

    return check


def _boolean(value) -> str | None:
    return None if isinstance(value, bool) else "must be true or false"


def _token(value) -> str | None:
    if not isinstance(value, str) or not _TOKEN.match(value):
        return "must be a name of letters, digits, '.', '_' or '-' (starting with a letter or digit)"
    return None


def _profile_opts(value) -> str | None:
    if not isinstance(value, dict) or len(value) > 16:
        return "must be a JSON object of at most 16 entries"
    for key, item in value.items():
        if not isinstance(key, str) or not _OPTION_KEY.match(key):
            return f"key {key!r} must be a lower-case identifier"
        if _token(item) and _number(-1e12, 1e12)(item) and not isinstance(item, bool):
            return f"{key} must be a number, true/false or a simple name"
    return None


# The adapter ranks vLLM's --max-lora-rank accepts.
LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
# The options tenants may set on their own endpoints, each with its check.
TENANT_LAUNCH_OPTIONS: dict[str, Callable[[object], str | None]] = {
    "speed": _number(0, 1000),  # simulated replicas
    "profile": _token,
    "profile_opts": _profile_opts,
    "autoscale": _boolean,
    "max_num_seqs": _whole(1, 4096),  # vllm serve
    "max_num_batched_tokens": _whole(1, 1_048_576),
    "max_model_len": _whole(1, 1_048_576),
    "scheduling_policy": _choice("fcfs", "priority"),
    "enable_prefix_caching": _boolean,
    "block_size": _choice(8, 16, 32),
    # Multi-LoRA (docs/lora-serving.md): adapter slots per replica (vLLM --max-loras; 0 = LoRA off) and the largest rank.
    "max_loras": _whole(0, 256),
    "max_lora_rank": _choice(*LORA_RANKS),
    "lora_load_s": _number(0, 600),  # simulated replicas: seconds an adapter load takes
    "runner": _choice("generate", "pooling"),  # vLLM's --runner: pooling serves /v1/embeddings
}
# Set by the platform alone, from the replica's role and the endpoint's kv_connector (docs/disaggregation.md): the
# connector's configuration names directories and network peers, so no launch option may carry it.
PLATFORM_LAUNCH_OPTIONS = {
    "kv_transfer_config": "kv_transfer_config is set by the platform from the replica's role and the endpoint's "
    "kv_connector",
}
# vLLM's --max-lora-rank default, used when an endpoint enables LoRA without naming one.
DEFAULT_MAX_LORA_RANK = 16


def lora_settings(options) -> tuple[int, int]:
    """(adapter slots per replica, largest adapter rank) from an endpoint's launch options; (0, 0) with LoRA off
    (or values the allowlist would refuse: an endpoint's stored options are checked when they are written)."""
    options = options if isinstance(options, dict) else {}
    slots = options.get("max_loras")
    if isinstance(slots, bool) or not isinstance(slots, int) or slots <= 0:
        return 0, 0
    rank = options.get("max_lora_rank")
    return slots, rank if rank in LORA_RANKS else DEFAULT_MAX_LORA_RANK


def launch_options_shown_to_non_owners(options) -> dict:
    """The launch options a tenant that reserves on an endpoint it does not own may read: the allowlisted tuning
    (context length, batch limits, …), never the operators' placement (actuator, Deployment, namespace, cpuset, host,
    port, executable, raw flags)."""
    return {key: value for key, value in (options or {}).items() if key in TENANT_LAUNCH_OPTIONS}


def tenant_launch_option_errors(options: dict, *, current: dict | None = None) -> list[str]:
    """What a tenant may not do in ``options`` compared with the ``current`` ones: set, change or drop a key outside
    the allowlist (existing operator-set values may be resent unchanged), or give an allowlisted key a bad value."""
    current = current or {}
    errors = []
    changed = sorted(
        key
        for key in set(options) | set(current)
        if key not in TENANT_LAUNCH_OPTIONS
        and key not in PLATFORM_LAUNCH_OPTIONS
        and (key not in options or key not in current or options[key] != current[key])
    )
    if changed:
        errors.append(f"only operators may set {', '.join(changed)}")
    errors += [message for key, message in PLATFORM_LAUNCH_OPTIONS.items() if key in options]
    for key, check in TENANT_LAUNCH_OPTIONS.items():
        if key in options and options[key] is not None and (problem := check(options[key])):
            errors.append(f"{key} {problem}")
    return errors


def allowlisted_value_errors(options: dict) -> list[str]:
    """The allowlist's value checks, for every principal: an operator's value goes through them too; and no one
    sets what the platform sets."""
    return [
        f"{key} {problem}"
        for key, check in TENANT_LAUNCH_OPTIONS.items()
        if options.get(key) is not None and (problem := check(options[key]))
    ] + [message for key, message in PLATFORM_LAUNCH_OPTIONS.items() if key in options]


def argv_value(name: str, value) -> str:
    """``value`` as one argv element, or ValueError: scalars only, never a flag, no whitespace or control characters
    (an argv element cannot inject a shell command, but one starting with '-' would be read as an option)."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"{name} must be a string or a number, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{name} must be finite")
    text = str(value)
    if not text or _ARGV_UNSAFE.search(text) or (text.startswith("-") and isinstance(value, str)):
        raise ValueError(f"{name} {text!r} is not allowed: no leading '-', whitespace or control characters")
    return text
