"""Fault injection for the simulated replica: set by flag (``--fault k=v``) or by ``POST /admin/faults`` (JSON).

- ``hang``: the engine freezes: new requests are accepted and never answered, running streams stop mid-stream
  (``/health`` still answers 200, like a wedged vLLM engine, unless ``hang_health`` is also set);
- ``crash``: the process exits at once (``POST /admin/crash``, or ``crash_after_s`` / ``crash_after_requests``);
- ``slow_factor``: every engine step takes this many times longer;
- ``error_rate`` (0–1): that share of completion requests fails with ``error_status`` (500) in vLLM's error shape;
- ``fail_after_tokens``: every request fails after that many output tokens: a stream gets vLLM's mid-stream
  ``data: {"error": …}`` then ``data: [DONE]``, a non-streaming request a 500 (the request is aborted);
- ``reset_after_tokens``: a stream's connection is reset after that many output tokens, without an error event or
  ``[DONE]`` (a replica that died mid-answer, which a proxy resumes elsewhere); the request is aborted and what
  the engine computed stays in its counters;
- ``startup_delay_s``: the server binds its port only after this long (a cold start: connection refused, then
  ``/health`` 200).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, fields


@dataclass
class Faults:
    hang: bool = False
    hang_health: bool = False
    slow_factor: float = 1.0
    error_rate: float = 0.0
    error_status: int = 500
    fail_after_tokens: int | None = None
    reset_after_tokens: int | None = None
    crash_after_s: float | None = None
    crash_after_requests: int | None = None
    startup_delay_s: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self.validate()

    def validate(self) -> None:
        if not 0.0 <= float(self.error_rate) <= 1.0:
            raise ValueError("error_rate must be between 0 and 1")
        if float(self.slow_factor) <= 0:
            raise ValueError("slow_factor must be positive")
        if float(self.startup_delay_s) < 0:
            raise ValueError("startup_delay_s must be non-negative")
        if not 400 <= int(self.error_status) <= 599:
            raise ValueError("error_status must be an HTTP error status")
        if self.fail_after_tokens is not None and int(self.fail_after_tokens) < 0:
            raise ValueError("fail_after_tokens must be non-negative")
        if self.reset_after_tokens is not None and int(self.reset_after_tokens) < 1:
            raise ValueError("reset_after_tokens must be at least 1")

    def update(self, changes: dict) -> None:
        """Apply a partial update (admin call); unknown keys or bad values raise ValueError, nothing changes."""
        known = {f.name: f for f in fields(self)}
        unknown = set(changes) - set(known)
        if unknown:
            raise ValueError(f"unknown fault settings: {', '.join(sorted(unknown))}; known: {', '.join(known)}")
        candidate = Faults(**{**self.as_dict(), **{k: _coerce(known[k].type, v) for k, v in changes.items()}})
        for name in known:
            setattr(self, name, getattr(candidate, name))

    def should_error(self) -> bool:
        return self.error_rate > 0 and self._rng.random() < self.error_rate

    def as_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if not k.startswith("_")}


def _coerce(kind, value):
    if value is None:
        return None
    text = str(kind)
    if "bool" in text:
        if isinstance(value, str):
            if value.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise ValueError(f"not a boolean: {value!r}")
            return value.lower() in ("1", "true", "yes", "on")
        return bool(value)
    try:
        if "float" in text:
            return float(value)
        if "int" in text:
            return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"not a number: {value!r}") from None
    return value


def parse_fault_flags(flags: list[str]) -> Faults:
    """``["hang", "slow_factor=3", "error_rate=0.2"]`` → Faults (a bare name means true)."""
    changes = {}
    for flag in flags:
        key, sep, value = flag.partition("=")
        changes[key.strip().replace("-", "_")] = value if sep else "true"
    faults = Faults()
    faults.update(changes)
    return faults
