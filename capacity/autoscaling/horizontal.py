"""The horizontal policy: how many replicas an endpoint should run (pure: no Django, clock injected).

``desired = ceil(demand / (target_concurrency · target_utilization))``, after Databricks' APA, with demand and capacity
in model units when the replica's MU capacity is known (docs/algorithms.md#horizontal: in-flight + queued MU against
``target_concurrency`` converted to MU, see ``mu_capacity_per_replica``), so a few long prompts weigh what they cost;
in requests otherwise (no coefficients, or proxies that report no MU). Requests are always recorded. Scale up on the
last 20 s with a bounded step, counting starting replicas as capacity; scale down on the maximum of the last 5 min, one
bounded step at a time and never within the scale-down delay of a scale-up; floors from min replicas, provisioned
concurrency, the predictive floor and the spike-onset floor (``onset``: a rate rising fast orders replicas for the
rate it projects one cold start ahead, docs/algorithms.md#spike-onset); a ceiling at max replicas; optional scale to
zero.
"""

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from capacity.autoscaling.demand import DemandSample, window, window_max, window_mean


@dataclass(frozen=True)
class OnsetConfig:
    """Spike-onset detection in the arrival rate (docs/algorithms.md#spike-onset)."""

    short_window_s: float = 20.0  # the recent rate, read as two halves (the earlier and the later)
    long_window_s: float = 300.0  # the rate the recent one is compared with
    ratio: float = 1.5  # an onset: the recent rate at least this × the long window's,
    # ... more arrivals than the long rate explains by at least this many standard deviations (Poisson: the
    # square root of the expected count), so a quiet hour's noise is not read as one,
    min_z: float = 4.0
    rise: float = 1.2  # ... and still rising: the later half at least this × the earlier half
    lead_s: float = 120.0  # the rate is projected this far ahead (a cold start)
    max_growth: float = 2.0  # the projection at most this × the later half's rate

    def __post_init__(self) -> None:
        if not 0 < self.short_window_s < self.long_window_s:
            raise ValueError("need 0 < short_window_s < long_window_s")
        if self.ratio <= 1 or self.min_z < 0 or self.rise < 1 or self.max_growth < 1 or self.lead_s < 0:
            raise ValueError("need ratio > 1, min_z >= 0, rise >= 1, max_growth >= 1 and lead_s >= 0")


@dataclass(frozen=True)
class Onset:
    """A spike's onset as read from the arrivals: the rates seen and the one projected one lead time ahead."""

    long_rate: float
    earlier_rate: float
    later_rate: float
    projected_rate: float

    @property
    def growth(self) -> float:
        """The projected rate over the long window's: what the long window's demand is multiplied by."""
        return self.projected_rate / self.long_rate


def onset(samples: Sequence[DemandSample], *, now: float, cfg: OnsetConfig) -> Onset | None:
    """The onset of a spike in ``samples``' arrivals at ``now``, or None (docs/algorithms.md#spike-onset).

    An onset is the recent rate (``short_window_s``) at least ``ratio`` × the long window's and ``min_z`` Poisson
    standard deviations above it, with its later half at least ``rise`` × its earlier half (still climbing, not a
    plateau). The
    projection extends the halves' slope by ``lead_s``, bounded to ``max_growth`` × the later half's rate. Needs the
    long window covered by samples (no onset read from a cold start of the policy itself)."""
    long = window(samples, now=now, seconds=cfg.long_window_s)
    if not long or now - min(s.t for s in long) < cfg.long_window_s * 0.9:
        return None
    half = cfg.short_window_s / 2
    later = sum(s.arrivals for s in window(long, now=now, seconds=half))
    recent = sum(s.arrivals for s in window(long, now=now, seconds=cfg.short_window_s))
    earlier = recent - later
    long_rate = sum(s.arrivals for s in long) / cfg.long_window_s
    recent_rate = recent / cfg.short_window_s
    expected = long_rate * cfg.short_window_s
    if expected <= 0 or recent_rate < cfg.ratio * long_rate or recent - expected < cfg.min_z * math.sqrt(expected):
        return None
    if later < cfg.rise * earlier:
        return None
    earlier_rate, later_rate = earlier / half, later / half
    slope = (later_rate - earlier_rate) / half
    projected = min(later_rate + slope * cfg.lead_s, cfg.max_growth * later_rate)
    return Onset(long_rate=long_rate, earlier_rate=earlier_rate, later_rate=later_rate, projected_rate=projected)


@dataclass(frozen=True)
class HorizontalConfig:
    target_utilization: float = 0.7
    scale_up_window_s: float = 20.0
    scale_down_window_s: float = 300.0
    # A scale-up adds at most max(current·factor − current, step) replicas per decision.
    max_scale_up_factor: float = 2.0
    max_scale_up_step: int = 4
    # A scale-down removes at most max(1, floor(current·fraction)) replicas per decision.
    max_scale_down_fraction: float = 0.2
    # No scale-down this soon after a scale-up: a steady load never flaps.
    scale_down_delay_s: float = 300.0
    # Between two scale-downs: batches on the remaining replicas grow and lengthen requests, so in-flight demand
    # rises after each step; the next step must see that before it removes more.
    scale_down_cooldown_s: float = 30.0
    # A scale-down leaves this share of headroom over the 5-min peak's need: on fewer replicas each runs a larger
    # batch, a request stays in flight longer, and the demand in flight rises by about as much (10-20 % a step on
    # the A100 profile), so a fleet shrunk to ceil(need) was back over the tolerance band, and ordering a replica,
    # minutes later (docs/experiments/autoscaling.md, 2026-12-06).
    scale_down_margin: float = 0.15
    # Ignore demand/capacity ratios within ±tolerance of 1 (AIBrix APA uses 0.1 both ways).
    tolerance: float = 0.1
    # Spike-onset detection in the samples' arrivals (None: off); its need is a floor, taken in one step.
    onset: OnsetConfig | None = field(default_factory=OnsetConfig)

    def __post_init__(self) -> None:
        if not 0 < self.target_utilization <= 1:
            raise ValueError("target_utilization must be in (0, 1]")
        if self.max_scale_up_factor < 1 or self.max_scale_up_step < 1:
            raise ValueError("scale steps must be at least 1")
        if not 0 <= self.max_scale_down_fraction < 1:
            raise ValueError("max_scale_down_fraction must be in [0, 1)")
        if not 0 <= self.scale_down_margin < 1:
            raise ValueError("scale_down_margin must be in [0, 1)")
        if not 0 <= self.tolerance < 1:
            raise ValueError("tolerance must be in [0, 1)")


@dataclass(frozen=True)
class HorizontalInputs:
    now: float
    samples: Sequence[DemandSample]
    ready: int  # replicas serving traffic
    starting: int  # pending or starting replicas: capacity on its way (the pending guard)
    min_replicas: int = 1
    max_replicas: int = 4
    target_concurrency: float = 64.0  # requests per replica, from the vertical policy
    # In-flight MU one replica holds at target_concurrency (``mu_capacity_per_replica()``); None = scale on requests.
    mu_capacity_per_replica: float | None = None
    provisioned_concurrency: int = 0
    scale_to_zero: bool = False
    predicted_floor: int = 0
    last_scale_up_at: float | None = None
    last_scale_down_at: float | None = None
    # False when no proxy report was fresh at this tick and no proxy is alive: the demand is unknown (proxies down,
    # or cut off from Redis), not zero, so nothing is removed on it (HPA and KPA also hold on missing metrics).
    demand_reported: bool = True


@dataclass(frozen=True)
class HorizontalDecision:
    current: int
    desired: int
    reason: str
    inputs: dict = field(default_factory=dict)

    @property
    def delta(self) -> int:
        return self.desired - self.current


def replicas_for(demand_requests: float, demand_mu: float, inputs: HorizontalInputs, cfg: HorizontalConfig) -> float:
    """Fractional replicas the demand needs at the target utilization: in MU when the replica's MU capacity is known
    and the demand carries MU, else in requests."""
    return _needs(demand_requests, demand_mu, inputs, cfg)[0]


def _needs(
    demand_requests: float, demand_mu: float, inputs: HorizontalInputs, cfg: HorizontalConfig
) -> tuple[float, float, float | None, str]:
    """(need, need in requests, need in MU or None, signal used)."""
    by_requests = demand_requests / (inputs.target_concurrency * cfg.target_utilization)
    by_mu = None
    capacity = usable_mu_capacity(inputs)
    if capacity is not None:
        by_mu = demand_mu / (capacity * cfg.target_utilization)
    # MU decides whenever it is there; requests without any MU (a proxy that reports none) fall back to requests.
    if by_mu is not None and (demand_mu > 0 or demand_requests <= 0):
        return by_mu, by_requests, by_mu, "mu"
    return by_requests, by_requests, by_mu, "requests"


def usable_mu_capacity(inputs: HorizontalInputs) -> float | None:
    """The replica's MU capacity, or None when it is missing, 0, NaN or infinite (then the policy scales on requests:
    dividing by 0 or NaN would crash, and an infinite capacity would read any demand as none)."""
    capacity = inputs.mu_capacity_per_replica
    return capacity if capacity is not None and 0 < capacity < math.inf else None


def mu_capacity_per_replica(target_concurrency: float, reference_request_mu: float) -> float:
    """``target_concurrency`` converted to MU: the in-flight MU of that many reference requests (the chat shape the
    concurrency limit is set for, priced with the endpoint's coefficients; Little's law makes this the replica's
    C MU/min times the reference request's in-flight time)."""
    if not (0 < target_concurrency < math.inf and 0 < reference_request_mu < math.inf):  # also rejects NaN
        raise ValueError("target_concurrency and reference_request_mu must be positive and finite")
    return target_concurrency * reference_request_mu


def onset_need(inputs: HorizontalInputs, cfg: HorizontalConfig) -> tuple[float, Onset | None]:
    """Fractional replicas a spike's onset projects one lead time ahead (0 without one): the long window's mean
    demand scaled by the projected rate over the long window's rate (Little's law: in flight = rate × time in
    flight, the time in flight as the long window measured it)."""
    if cfg.onset is None:
        return 0.0, None
    seen = onset(inputs.samples, now=inputs.now, cfg=cfg.onset)
    if seen is None:
        return 0.0, None
    long = window(inputs.samples, now=inputs.now, seconds=cfg.onset.long_window_s)
    need, _, _, _ = _needs(window_mean(long) * seen.growth, window_mean(long, attr="mu") * seen.growth, inputs, cfg)
    return need, seen


def floor_for(inputs: HorizontalInputs, *, recent_demand: bool, onset_floor: int = 0) -> tuple[int, str]:
    floors = {
        "min_replicas": inputs.min_replicas,
        "provisioned_concurrency": math.ceil(inputs.provisioned_concurrency / inputs.target_concurrency),
        "predictive_floor": inputs.predicted_floor,
        "spike_onset": onset_floor,
    }
    name, value = max(floors.items(), key=lambda kv: kv[1])
    # Without scale-to-zero an endpoint always keeps a replica; with it, only while there is demand.
    if value < 1 and (not inputs.scale_to_zero or recent_demand):
        return 1, "keep one replica" if not inputs.scale_to_zero else "demand present"
    return value, name


def decide(inputs: HorizontalInputs, cfg: HorizontalConfig = HorizontalConfig()) -> HorizontalDecision:
    if inputs.target_concurrency <= 0:
        raise ValueError("target_concurrency must be positive")
    current = inputs.ready + inputs.starting
    up_window = window(inputs.samples, now=inputs.now, seconds=cfg.scale_up_window_s)
    down_window = window(inputs.samples, now=inputs.now, seconds=cfg.scale_down_window_s)
    up_need, up_need_requests, up_need_mu, signal = _needs(
        window_max(up_window), window_max(up_window, attr="mu"), inputs, cfg
    )
    down_need, down_need_requests, down_need_mu, _ = _needs(
        window_max(down_window), window_max(down_window, attr="mu"), inputs, cfg
    )
    recent_demand = down_need > 0
    spike_need, spike = onset_need(inputs, cfg)
    floor, floor_reason = floor_for(inputs, recent_demand=recent_demand, onset_floor=math.ceil(spike_need))
    ceiling = max(inputs.max_replicas, 0)
    record = {
        "ready": inputs.ready,
        "starting": inputs.starting,
        "up_need": round(up_need, 3),
        "down_need": round(down_need, 3),
        "signal": signal,
        "up_need_requests": round(up_need_requests, 3),
        "down_need_requests": round(down_need_requests, 3),
        "up_need_mu": None if up_need_mu is None else round(up_need_mu, 3),
        "down_need_mu": None if down_need_mu is None else round(down_need_mu, 3),
        "demand_requests_20s": window_max(up_window),
        "demand_mu_20s": round(window_max(up_window, attr="mu"), 3),
        "target_concurrency": inputs.target_concurrency,
        "mu_capacity_per_replica": usable_mu_capacity(inputs),
        "floor": floor,
        "floor_reason": floor_reason,
        "onset": None if spike is None else {**asdict(spike), "need": round(spike_need, 3)},
        "max_replicas": ceiling,
        "samples_up": len(up_window),
        "samples_down": len(down_window),
        "demand_reported": inputs.demand_reported,
        "config": asdict(cfg),
    }

    def result(desired: int, reason: str) -> HorizontalDecision:
        return HorizontalDecision(current=current, desired=desired, reason=reason, inputs=record)

    if current < floor:
        return result(min(floor, ceiling), f"below floor ({floor_reason})")
    if current > ceiling:
        return result(ceiling, "above max replicas")

    # Scale up: needed replicas beyond the tolerance band around what is ready or already starting.
    if up_need > current * (1 + cfg.tolerance) or (current == 0 and up_need > 0):
        wanted = min(math.ceil(up_need), ceiling)
        step_limit = max(math.ceil(current * cfg.max_scale_up_factor) - current, cfg.max_scale_up_step)
        desired = min(wanted, current + step_limit)
        if desired > current:
            bounded = " (step bounded)" if desired < wanted else ""
            return result(desired, f"scale up: demand needs {up_need:.2f} replicas{bounded}")
        if current >= ceiling:
            return result(current, f"hold: at max replicas (demand needs {up_need:.2f})")
    if inputs.starting and up_need > inputs.ready * (1 + cfg.tolerance):
        # The pending guard: ready replicas alone are short, but what is booting covers it; adding more now would
        # cascade (each tick would see the same unmet demand until the first replica is up).
        return result(current, "hold: starting replicas cover the demand")

    # Scale down: only on the 5-minute maximum, only after the delay, one bounded step at a time.
    target_down = max(math.ceil(down_need * (1 + cfg.scale_down_margin)), floor)
    if target_down < current and down_need < current * (1 - cfg.tolerance):
        if not inputs.demand_reported:
            return result(current, "hold: no fresh demand report (proxies silent or Redis unreachable)")
        if inputs.last_scale_up_at is not None and inputs.now - inputs.last_scale_up_at < cfg.scale_down_delay_s:
            return result(current, "hold: scale-down delay after a scale-up")
        if (
            inputs.last_scale_down_at is not None
            and inputs.now - inputs.last_scale_down_at < cfg.scale_down_cooldown_s
        ):
            return result(current, "hold: cooling down after a scale-down")
        step = max(1, math.floor(current * cfg.max_scale_down_fraction))
        desired = max(target_down, current - step)
        return result(desired, f"scale down: 5-min peak needs {down_need:.2f} replicas")
    return result(current, "hold: within tolerance" if up_need > 0 else "hold: no change needed")
