"""One policy over one day on the shared engine simulator, for ``bench autoscale`` (docs/algorithms.md#autoscaling-evaluation).

A run is a ``Spec`` (policy name and knobs) over a ``Day`` (``benchmarks.capacity.traces``): the day's requests go
through the proxy's admission (``ProxyAdmission``), least-request routing and ``llama-13b-a100`` replicas with
60-120 s cold starts; the policy acts through ``sim_adapter.EngineSimAutoscaler`` with the warm-pool option every
policy gets. Billed: every replica from launch (cold start included) to removal, plus the warm pool's stand-bys.
"""

import math
import time
from dataclasses import dataclass, field, replace

from benchmarks.capacity import baselines, oracle
from benchmarks.capacity.fleetsim import count_flaps
from benchmarks.capacity.two_axis import InfercapPolicy
from capacity.autoscaling.horizontal import HorizontalConfig, OnsetConfig
from capacity.units import MUCoefficients, estimate_request_mu
from gateway.admission import CRITICAL
from gateway.routing.baselines import LeastRequestRouter
from simulator import workloads
from simulator.admission import ProxyAdmission
from simulator.autoscaling import EngineSimAutoscaler, engine_seconds_per_request
from simulator.des import Simulation

PROFILE = "llama-13b-a100"
SLO = {"ttft_s": 2.0, "tpot_s": 0.1}  # endpoints.models.Endpoint defaults: ttft_slo_ms 2000, tpot_slo_ms 100
SLO_TARGET = 0.99
COLD_START_S = (60.0, 120.0)
WARM_START_S = 5.0  # a stand-by replica with its model loaded starts serving this fast
# The request shape the concurrency limit is set for: the synthetic days' mean prompt and output
# (traces.SYNTHETIC_CHAT; docs/algorithms.md#the-reference-request).
REFERENCE = (960, 715)
# The model profile's default MU coefficients (capacity.models.ModelProfile).
COEFFS = MUCoefficients(alpha=0.001, alpha_cached=0.0001, beta=0.01, gamma=0.05, mu_per_min=1000.0)
BASE_LIMIT = 64  # the baselines' fixed per-replica concurrency (and ours' starting limit)
PROXY_WAIT_S = 1.0  # a TTFT miss that waited this long at the proxy: no replica had a free concurrency slot


@dataclass(frozen=True)
class Spec:
    """A policy and its knobs; ``warm_pool`` is the option every policy has."""

    policy: str  # static | hpa | kpa | scheduled | infercap | infercap_reactive | oracle | spike_blind_reference
    knobs: tuple = ()  # sorted (name, value) pairs
    warm_pool: int = 0

    def knob(self, name: str, default=None):
        return dict(self.knobs).get(name, default)

    def with_knobs(self, **changes) -> "Spec":
        knobs = dict(self.knobs)
        warm = changes.pop("warm_pool", self.warm_pool)
        knobs.update(changes)
        return Spec(self.policy, tuple(sorted(knobs.items())), warm)

    def label(self) -> str:
        parts = [f"{k}={v}" for k, v in self.knobs] + ([f"warm_pool={self.warm_pool}"] if self.warm_pool else [])
        return f"{self.policy}({', '.join(parts)})"


@dataclass
class DayInput:
    """What a run needs of a day: its requests and, for the policies that learn, the history before it."""

    name: str
    period_s: float
    requests: list  # (arrival s, prompt tokens, output tokens)
    seed: int = 1  # the trace seed it was drawn with (also seeds the run's cold starts and routing)
    # The world's clocks at the day's time scale: a day compressed n× has its cold starts and warm starts n× shorter.
    cold_start_s: tuple[float, float] = COLD_START_S
    warm_start_s: float = WARM_START_S
    history: list = field(default_factory=list)  # (t < 0, prompt, output) of the history days, most recent last
    history_days: int = 0
    spikes: list = field(default_factory=list)  # (start s, end s) of each spike, plus a cold start after it
    base_share: list = field(default_factory=list)  # per second: the share of the rate the day without spikes has

    def share_at(self, t: float) -> float:
        i = int(t)
        return self.base_share[i] if 0 <= i < len(self.base_share) else 1.0


def request_mu(prompt: int) -> float:
    """What the proxy charges at admission: the clients set no max_tokens, so a typical output is assumed."""
    return estimate_request_mu(COEFFS, prompt_tokens=prompt)


def seconds_per_request(profile, concurrency: float) -> float:
    return engine_seconds_per_request(profile, concurrency, in_tok=REFERENCE[0], out_tok=REFERENCE[1])


def build_policy(spec: Spec, day: DayInput, *, profile, max_replicas: int, context: dict):
    """The policy object for ``spec`` on ``day`` (``context``: the static size, the fitted schedule, the seed)."""
    knob = spec.knob
    if spec.policy == "static":
        return baselines.StaticPolicy(replicas=knob("replicas"), name="static")
    if spec.policy == "hpa":
        return _hpa(spec, max_replicas)
    if spec.policy == "kpa":
        return baselines.KpaLikePolicy(
            target_concurrency=BASE_LIMIT,
            target_utilization=knob("target_utilization", 0.7),
            stable_window_s=knob("stable_window_s", 60.0),
            panic_threshold=knob("panic_threshold", 2.0),
            metric=knob("metric", "requests"),
            min_replicas=1,
            max_replicas=max_replicas,
        )
    if spec.policy == "scheduled":
        reactive_knobs = knob("reactive")
        reactive = _hpa(Spec("hpa", tuple(reactive_knobs)), max_replicas) if reactive_knobs is not None else None
        return baselines.ScheduledPolicy(
            schedule=context["schedules"][day.seed][knob("statistic", "median")],
            period_s=day.period_s,
            lead_s=day.cold_start_s[1],
            reactive=reactive,
            max_replicas=max_replicas,
        )
    if spec.policy in ("oracle", "spike_blind_reference"):
        concurrency = knob("concurrency", BASE_LIMIT)

        def in_flight(requests: list) -> list[int]:
            return oracle.in_flight_series(
                requests,
                seconds_in_flight=lambda p, o: engine_seconds_per_request(profile, concurrency, in_tok=p, out_tok=o),
                end_s=day.period_s + 600.0,
            )

        present = None
        if spec.policy == "spike_blind_reference":  # foresees the day without its spikes, sees the present
            base, _ = oracle.spike_excess(day.requests, base_share=day.share_at, seed=day.name)
            foreseen, present = in_flight(base), in_flight(day.requests)
        else:
            foreseen = in_flight(day.requests)
        return oracle.OraclePolicy(
            in_flight=foreseen,
            present=present,
            spare=knob("spare", 0),
            concurrency=concurrency,
            utilization=knob("utilization", 1.0),
            lookahead_s=knob("lookahead_s", day.cold_start_s[1]),
            max_replicas=max_replicas,
        )
    horizontal_config = HorizontalConfig(
        target_utilization=knob("target_utilization", 0.7),
        max_scale_down_fraction=knob("scale_down_fraction", 0.2),
        onset=_onset_config(spec, day),
    )
    policy = InfercapPolicy(
        name=spec.policy,
        horizontal_config=horizontal_config,
        min_replicas=1,
        max_replicas=max_replicas,
        concurrency_limit=BASE_LIMIT,
        concurrency_min=8,
        concurrency_max=knob("concurrency_max", 256),
        ttft_slo_ms=SLO["ttft_s"] * 1000,
        tpot_slo_ms=SLO["tpot_s"] * 1000,
        predictive_period_s=None if spec.policy == "infercap_reactive" else day.period_s,
        predictive_lead_s=day.cold_start_s[1],
        seconds_per_request=lambda c: seconds_per_request(profile, c),
        reference_request_mu=estimate_request_mu(COEFFS, prompt_tokens=REFERENCE[0]),
        demand_signal=knob("demand_signal", "rate"),
        vertical_sample=knob("vertical_sample", 0),
    )
    for t, prompt, _ in day.history:
        policy.remember(t=t, mu=request_mu(prompt))
    return policy


def _onset_config(spec: Spec, day: DayInput) -> OnsetConfig | None:
    """Ours' spike-onset detection: on by default, ``onset=False`` turns it off, ``onset_max_growth`` and
    ``onset_ratio`` change its bound and threshold; its look-ahead is the day's longest cold start."""
    if not spec.knob("onset", True):
        return None
    default = OnsetConfig()
    return replace(
        default,
        lead_s=day.cold_start_s[1],
        max_growth=spec.knob("onset_max_growth", default.max_growth),
        ratio=spec.knob("onset_ratio", default.ratio),
    )


def _hpa(spec: Spec, max_replicas: int):
    knob = spec.knob
    return baselines.HpaLikePolicy(
        target_per_replica=BASE_LIMIT * knob("target", 0.7),
        stabilization_s=knob("stabilization_s", 300.0),
        scale_down_percent=knob("scale_down_percent", 100.0),
        scale_down_period_s=knob("scale_down_period_s", 15.0),
        metric=knob("metric", "requests"),
        min_replicas=1,
        max_replicas=max_replicas,
    )


class _IndependentRequest(workloads.SimRequest):
    """A request with its own prompt (no shared prefix): prefix caching has nothing to hit, so it carries no block
    hashes and the engine skips the cache's bookkeeping (a third of the run time)."""

    def block_hashes(self) -> list[int]:
        return []


def sim_requests(requests: list):
    for i, (t, prompt, output) in enumerate(requests):
        yield _IndependentRequest(
            request_id=f"as-{i}",
            arrival_s=t,
            prompt_parts=("x" * (4 * prompt),),
            output_tokens=output,
            priority_class=CRITICAL,
        )


def run_day(
    spec: Spec, day: DayInput, *, profile, max_replicas: int, context: dict, progress=None, detail: bool = False
) -> dict:
    """One run: the figures of ``spec`` over ``day``'s scored period [0, period). ``progress(t)`` is called every
    simulated hour; ``detail`` adds ``misses_by_hour``."""
    started = time.perf_counter()
    seed = day.seed
    policy = build_policy(spec, day, profile=profile, max_replicas=max_replicas, context=context)
    scaler = (_ReportingAutoscaler if progress else EngineSimAutoscaler)(
        policy, cold_start_s=day.cold_start_s, seed=seed, warm_pool=spec.warm_pool, warm_start_s=day.warm_start_s
    )
    if progress:
        scaler.progress = progress
    initial = spec.knob("replicas", 1) if spec.policy == "static" else 1
    sim = Simulation(
        router=LeastRequestRouter(seed=seed),
        replicas=initial,
        profile=profile,
        admission=ProxyAdmission(replica_mu_per_s=COEFFS.mu_per_min / 60.0),
        autoscaler=scaler,
        cost_fn=lambda request, prompt_tokens: request_mu(prompt_tokens),
        concurrency_limit=getattr(policy, "concurrency_limit", BASE_LIMIT),
        cold_start_s=sum(day.cold_start_s) / 2,
        seed=seed,
    )
    result = sim.run(sim_requests(day.requests), until_s=day.period_s + 600.0)
    period = day.period_s
    scored = [r for r in result.requests if r.arrival_s < period]
    gpu_s = sum(
        max(0.0, min(rep.removed_s if rep.removed_s is not None else result.end_s, period) - max(rep.added_s, 0.0))
        * rep.gpus
        for rep in result.replicas
    )
    gpu_s += scaler.standby_gpu_s(start=0.0, end=period)
    decisions = getattr(policy, "decisions", [])
    row = {
        "spec": spec.label(),
        "day": day.name,
        "gpu_hours": gpu_s / 3600.0,
        "requests": len(scored),
        "good": sum(r.meets(**SLO) for r in scored),
        "rejected": sum(r.status == "rejected" for r in scored),
        "requests_calm": len(calm := [r for r in scored if not any(a <= r.arrival_s < b for a, b in day.spikes)]),
        "good_calm": sum(r.meets(**SLO) for r in calm),
        "flaps": count_flaps(scaler.scale_events()),
        "peak_replicas": max((s["ready"] + s["starting"] + s["draining"] for s in result.timeline), default=0),
        "reasons": _reason_counts(decisions),
        "wall_s": round(time.perf_counter() - started, 2),
    }
    if detail:
        row["misses_by_hour"] = misses_by_hour(scored, period)
    return row


class _ReportingAutoscaler(EngineSimAutoscaler):
    """The adapter, calling ``progress(t)`` once every simulated hour (a real-length day runs for minutes)."""

    progress = None
    next_report_s = 3600.0

    def tick(self, fleet, actions, now: float) -> None:
        super().tick(fleet, actions, now)
        if now >= self.next_report_s:
            self.next_report_s += 3600.0
            self.progress(now)


def misses_by_hour(scored: list, period_s: float) -> list[dict]:
    """Per hour of the day (a 24th of the period, at any time scale): requests, misses, which SLO each broke,
    whether a TTFT miss waited at the proxy, rejections."""
    hours, length = 24, period_s / 24
    out = [
        {"hour": h, "requests": 0, "miss": 0, "ttft": 0, "tpot": 0, "proxy_wait": 0, "rejected": 0}
        for h in range(hours)
    ]
    for r in scored:
        h = out[min(hours - 1, max(0, int(r.arrival_s // length)))]
        h["requests"] += 1
        if r.status != "ok":
            h["miss"] += 1
            h["rejected"] += r.status == "rejected"
            continue
        ttft, tpot = r.ttft_s > SLO["ttft_s"], (r.tpot_s or 0.0) > SLO["tpot_s"]
        if ttft or tpot:
            h["miss"] += 1
            h["ttft"] += ttft
            h["tpot"] += tpot
            h["proxy_wait"] += ttft and r.dispatch_s is not None and r.dispatch_s - r.arrival_s >= PROXY_WAIT_S
    return out


def _reason_counts(decisions: list) -> dict:
    """How often each kind of reason moved the replica count (the decision record, summarised)."""
    counts: dict[str, int] = {}
    for d in decisions:
        if d.delta:
            key = d.reason.split(":")[0].split(" (")[0]
            if "predictive floor" in d.reason:
                key += " (predictive floor)"
            elif "spike_onset" in d.reason:
                key += " (spike onset)"
            counts[key] = counts.get(key, 0) + 1
    return counts


def static_replicas(days: list, *, profile) -> int:
    """Static peak: enough replicas at the baselines' target (64 × 0.7 in flight) for the highest rate of any day."""
    per_replica = BASE_LIMIT * 0.7
    peak = max(d.peak_rate() for d in days)
    return math.ceil(peak * seconds_per_request(profile, per_replica) / per_replica)


EQUAL_ATTAINMENT_METHOD = (
    "each policy's own frontier (its settings' summed GPU-hours and pooled SLO attainment on the same days) reduced to "
    "its lower convex hull (a mix of two settings over the days reaches any point between them), GPU-hours "
    "interpolated linearly to infercap's attainment between the two hull points that bracket it; a frontier whose "
    "best point is below it does not reach it (no extrapolation: reached=false); one whose cheapest point is already "
    "above it is taken at that point (cheapest_point_above=true)"
)


def frontier_hull(points: list[dict]) -> list[dict]:
    """The lower convex hull of (GPU-hours, attainment) points: cheapest first, attainment rising, concave."""
    pareto: list[dict] = []
    for p in sorted(points, key=lambda p: (p["gpu_hours"], -p["slo_attainment"])):
        if not pareto or p["slo_attainment"] > pareto[-1]["slo_attainment"]:
            pareto.append(p)
    hull: list[dict] = []
    for p in pareto:
        while len(hull) >= 2 and _under_chord(hull[-2], hull[-1], p):
            hull.pop()
        hull.append(p)
    return hull


def _under_chord(a: dict, b: dict, c: dict) -> bool:
    """Whether ``b`` attains no more than the chord from ``a`` to ``c`` at b's GPU-hours (a mix of a and c beats it)."""
    da, dc = b["slo_attainment"] - a["slo_attainment"], c["slo_attainment"] - a["slo_attainment"]
    return da * (c["gpu_hours"] - a["gpu_hours"]) <= dc * (b["gpu_hours"] - a["gpu_hours"])


def cost_at_attainment(points: list[dict], attainment: float) -> dict:
    """GPU-hours a policy's frontier needs for ``attainment`` (``EQUAL_ATTAINMENT_METHOD``)."""
    hull = frontier_hull(points)
    if not hull or hull[-1]["slo_attainment"] < attainment:
        best = hull[-1] if hull else None
        return {"reached": False, "gpu_hours": None, "best_point": best}
    if hull[0]["slo_attainment"] >= attainment:
        return {"reached": True, "gpu_hours": hull[0]["gpu_hours"], "cheapest_point_above": True, "between": [hull[0]]}
    for lo, hi in zip(hull, hull[1:], strict=False):
        if lo["slo_attainment"] < attainment <= hi["slo_attainment"]:
            share = (attainment - lo["slo_attainment"]) / (hi["slo_attainment"] - lo["slo_attainment"])
            gpu_hours = lo["gpu_hours"] + share * (hi["gpu_hours"] - lo["gpu_hours"])
            return {
                "reached": True,
                "gpu_hours": round(gpu_hours, 3),
                "cheapest_point_above": False,
                "between": [lo, hi],
            }
    raise AssertionError("a hull that reaches the attainment brackets it")
