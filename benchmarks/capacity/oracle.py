"""The oracle bound: a replica schedule from the test day's own arrivals, provisioned just in time (pure: no Django).

It knows every request of the day (arrival, prompt and output tokens), so it knows how many are in flight at each
second when replicas hold ``concurrency`` sequences (each request in flight for its own prefill plus decode time,
``seconds_in_flight``). It asks for ``⌈in flight / (concurrency · utilization)⌉`` replicas, looking one cold start
(the longest) plus a decision interval ahead, so every replica it starts is ready when its load arrives, and lets
them go as soon as nothing ahead needs them. ``bench autoscale`` runs it over a grid of (concurrency, utilization)
on the test day itself and keeps the cheapest that meets the SLO target: the fewest GPU-hours a clairvoyant
autoscaler with the same cold starts needs (docs/algorithms.md#autoscaling-evaluation).

The spike-blind reference (``present`` and ``spare``; ``bench autoscale``'s ``spike_blind_reference``) is a reference
policy, not a bound: it looks ahead only over the day without its spikes' excess (``spike_excess`` splits it off),
which is more than history could ever teach (the day's own noise included), sees every request of the present, and
holds headroom (``utilization`` below 1) or spare replicas for what it cannot see coming. Its grid is two families
of settings (uniform headroom, a fixed spare count, concurrency fixed) reacting to the in-flight count, which lags
the arrival rate by about a request's lifetime: a policy that reads the rate, or shapes its headroom otherwise, can
do better, so its cheapest setting meeting the SLO says what these settings cost, not what any causal policy must.
"""

import math
import random
from collections import deque
from collections.abc import Callable, Sequence

from capacity.autoscaling.demand import DemandSample


def in_flight_series(
    requests: Sequence[tuple[float, int, int]], *, seconds_in_flight: Callable[[int, int], float], end_s: float
) -> list[int]:
    """Requests in flight at each whole second of [0, end_s): (arrival, prompt tokens, output tokens) each."""
    seconds = max(1, math.ceil(end_s))
    delta = [0] * (seconds + 2)
    for arrival, prompt, output in requests:
        start = max(0, math.ceil(arrival))  # in flight at second s: arrival <= s < arrival + its time in flight
        if start >= seconds:
            continue
        stop = min(seconds + 1, max(start, math.ceil(arrival + seconds_in_flight(prompt, output))))
        delta[start] += 1
        delta[stop] -= 1
    out, running = [], 0
    for s in range(seconds):
        running += delta[s]
        out.append(running)
    return out


def spike_excess(
    requests: Sequence[tuple[float, int, int]], *, base_share: Callable[[float], float], seed: int | str
) -> tuple[list, list]:
    """Split a day's requests into (base, excess): each request at time t is the spikes' excess with probability
    ``1 − base_share(t)`` (the share of the rate at t that the day without spikes has). A seeded thinning, so the
    base part is a draw of the day without its spikes and the two parts add up to the day."""
    rng = random.Random(f"spike-excess-{seed}")
    base, excess = [], []
    for request in requests:
        (excess if rng.random() >= base_share(request[0]) else base).append(request)
    return base, excess


class OraclePolicy:
    name = "oracle"

    def __init__(
        self,
        *,
        in_flight: Sequence[int],
        concurrency: int,
        utilization: float,
        lookahead_s: float,
        max_replicas: int,
        interval_s: float = 5.0,
        present: Sequence[int] | None = None,
        spare: int = 0,
    ) -> None:
        """``in_flight``: what it foresees, looked ahead over; ``present`` (default: the same series): what it sees
        at each second without looking ahead; ``spare``: replicas held above the need."""
        if not 0 < utilization <= 1 or concurrency < 1 or spare < 0:
            raise ValueError("need concurrency >= 1, utilization in (0, 1] and spare >= 0")
        self.concurrency_limit, self.interval_s, self.max_replicas = concurrency, interval_s, max_replicas
        self.spare = spare
        per_replica = concurrency * utilization

        def need(series: Sequence[int]) -> list[int]:
            return [max(1, math.ceil(n / per_replica)) for n in series] or [1]

        # The largest need over [t, t + lookahead]: a sliding-window maximum, computed once.
        window = max(1, int(lookahead_s + interval_s))
        self.ahead = _sliding_max(need(in_flight), window)
        if present is not None:
            now_need = need(present)
            self.ahead = [max(a, now_need[i]) if i < len(now_need) else a for i, a in enumerate(self.ahead)]

    def observe(self, sample: DemandSample) -> None:
        pass  # it needs no observation: it knows the day

    def desired(self, *, now: float, ready: int, starting: int) -> int:
        i = min(len(self.ahead) - 1, max(0, int(now)))
        return min(self.ahead[i] + self.spare, self.max_replicas)


def _sliding_max(values: list[int], window: int) -> list[int]:
    """out[i] = max(values[i : i + window])."""
    out = [0] * len(values)
    q: deque[int] = deque()
    for i in range(len(values) - 1, -1, -1):
        while q and values[q[-1]] <= values[i]:
            q.pop()
        q.append(i)
        while q[0] >= i + window:
            q.popleft()
        out[i] = values[q[0]]
    return out
