"""The multi-turn workload's stage figures in sessions: how many chat sessions a second the fleet sustains within
the SLO (docs/algorithms.md, "Multi-turn chat: sessions per second at the SLO").

Sessions arrive open-loop (Poisson starts at the stage's rate); each then runs its turns closed-loop, a turn an
exponential think time after the previous answer. A stage's figure counts the sessions that *started* in it, and a
session meets the SLO when every one of its turns met TTFT and TPOT, wherever those turns fell in time. The number
of sessions offered is set by the arrivals, not by the service, so a slow policy cannot pass a stage by slowing the
turns down: counting the turns that arrived in a window (``turns_slo_rps``, kept as the closed-loop figure) let a
stage pass at 100 % with fewer turns arriving than at the stage below, because slower answers delay the next turns.

The workload's SLO-meeting throughput is ``sustained_rate``: the session arrival rate at which ``SESSION_TARGET``
(90 %) of the sessions arriving met the SLO on every turn, read between the last stage that met it and the first that
did not (linearly in the share). Not the best stage's good sessions per second, as for independent requests: a stage
holds a few dozen sessions in quick mode, and the stage whose Poisson arrivals happened to run high won for every
policy alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from capacity.percentiles import percentile
from simulator.results import RequestResult, SimResult

SESSION_TARGET = 0.9  # the share of a stage's sessions that must meet the SLO on every turn (DistServe's 90 %)


@dataclass(frozen=True)
class Session:
    start_s: float  # its first turn's arrival
    turns: tuple[RequestResult, ...]


def sessions_of(result: SimResult) -> list[Session]:
    """The result's requests grouped by chat session, in order of their first turn's arrival."""
    by_id: dict[str, list[RequestResult]] = {}
    for r in result.requests:
        if r.session_id is not None:
            by_id.setdefault(r.session_id, []).append(r)
    sessions = [Session(min(t.arrival_s for t in turns), tuple(turns)) for turns in by_id.values()]
    return sorted(sessions, key=lambda s: s.start_s)


def session_stage_figures(
    result: SimResult, sessions: list[Session], window: tuple[float, float], *, qps: float, slo: tuple[float, float]
) -> dict:
    """One stage of a session workload: ``qps`` is its nominal session rate, ``slo`` (TTFT s, TPOT s)."""
    lo, hi = window
    stage_s = hi - lo
    ttft_s, tpot_s = slo
    started = [s for s in sessions if lo <= s.start_s < hi]
    good = sum(all(t.meets(ttft_s=ttft_s, tpot_s=tpot_s) for t in s.turns) for s in started)
    turns = [t for s in started for t in s.turns]
    ttfts = [t.ttft_s if t.ttft_s is not None else math.inf for t in turns]
    # The closed-loop figures the stage reported before: turns that arrived in the window, and those within the SLO.
    arrived = [r for r in result.requests if lo <= r.arrival_s < hi]
    return {
        "qps": qps,
        "offered_rps": len(started) / stage_s,
        "requests": len(started),
        "slo_rps": good / stage_s,
        "slo_attainment": good / len(started) if started else 0.0,
        "ttft_p90_s": percentile(ttfts, 90),
        "turns": len(turns),
        "turns_offered_rps": len(arrived) / stage_s,
        "turns_slo_rps": sum(r.meets(ttft_s=ttft_s, tpot_s=tpot_s) for r in arrived) / stage_s,
    }


def sustained_rate(stages: list[dict], target: float = SESSION_TARGET) -> float:
    """The nominal session rate at which ``target`` of a stage's sessions met the SLO: interpolated between the last
    stage at or above the target and the first below it (from a rate of 0, where every session would, if the first
    stage is already below); the last stage's rate if none fell below."""
    low_rate, low_share = 0.0, 1.0
    for stage in stages:
        rate, share = stage["qps"], stage["slo_attainment"]
        if share < target:
            return round(low_rate + (rate - low_rate) * (low_share - target) / (low_share - share), 3)
        low_rate, low_share = rate, share
    return round(low_rate, 3)
