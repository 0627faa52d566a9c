"""Measured drain rate (MU finished per second) and the Retry-After it implies."""

import math


class DrainRateMeter:
    """Exponentially weighted MU/s of finished requests, over a time constant of ``tau_s`` seconds.

    Updated on every completion; reading decays the estimate when nothing finishes, so a stuck
    endpoint's Retry-After grows instead of advertising a stale, optimistic rate.
    """

    def __init__(self, *, tau_s: float = 10.0, now: float = 0.0) -> None:
        self.tau_s = tau_s
        self._rate = 0.0
        self._last = now
        self._started = now

    def _decay(self, now: float) -> None:
        dt = max(0.0, now - self._last)
        if dt > 0:
            self._rate *= math.exp(-dt / self.tau_s)
            self._last = now

    def record(self, mu: float, now: float) -> None:
        self._decay(now)
        # Impulse response of an EWMA: each finished MU adds mu/tau to the rate.
        self._rate += max(0.0, mu) / self.tau_s

    def rate_mu_per_s(self, now: float) -> float:
        self._decay(now)
        # Early on the EWMA has not filled yet; scale by how much of the window we have seen.
        warm = 1.0 - math.exp(-max(1e-9, now - self._started) / self.tau_s)
        return self._rate / warm if warm > 0.05 else self._rate


def retry_after_s(*, queued_mu: float, drain_mu_per_s: float, floor_s: int = 1, cap_s: int = 60) -> int:
    """Whole seconds until the queued work ahead should have drained; capped so clients never wait forever."""
    if drain_mu_per_s <= 0:
        return cap_s if queued_mu > 0 else floor_s
    return int(min(cap_s, max(floor_s, math.ceil(queued_mu / drain_mu_per_s))))
