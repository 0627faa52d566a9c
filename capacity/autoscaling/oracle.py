"""The oracle bound: a replica schedule from the test day's own arrivals, provisioned just in time (pure: no Django).

It knows every request of the day (arrival, prompt and output tokens), so it knows how many are in flight at each
second when replicas hold ``concurrency`` sequences (each request in flight for its own prefill plus decode time,
``seconds_in_flight``). It asks for ``⌈in flight / (concurrency · utilization)⌉`` replicas, looking one cold start
(the longest) plus a decision interval ahead, so every replica it starts is ready when its load arrives, and lets
them go as soon as nothing ahead needs them. ``bench autoscale`` runs it over a grid of (concurrency, utilization)
on the test day itself and keeps the cheapest that meets the SLO target: the fewest GPU-hours a clairvoyant
autoscaler with the same cold starts needs (docs/algorithms.md#autoscaling-evaluation).
"""

import math
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
    ) -> None:
        if not 0 < utilization <= 1 or concurrency < 1:
            raise ValueError("need concurrency >= 1 and utilization in (0, 1]")
        self.concurrency_limit, self.interval_s, self.max_replicas = concurrency, interval_s, max_replicas
        per_replica = concurrency * utilization
        need = [max(1, math.ceil(n / per_replica)) for n in in_flight] or [1]
        # The largest need over [t, t + lookahead]: a sliding-window maximum, computed once.
        window = max(1, int(lookahead_s + interval_s))
        self.ahead = _sliding_max(need, window)

    def observe(self, sample: DemandSample) -> None:
        pass  # it needs no observation: it knows the day

    def desired(self, *, now: float, ready: int, starting: int) -> int:
        i = min(len(self.ahead) - 1, max(0, int(now)))
        return min(self.ahead[i], self.max_replicas)


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
