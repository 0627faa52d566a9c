"""Proxy knobs, read once per process from ``settings.INFERCAP["PROXY"]`` overridden by environment variables."""

import math
import os
from dataclasses import dataclass, field

from django.conf import settings

from gateway.metrics_scraper import BUDGET_PER_S as SCRAPE_BUDGET_PER_S
from gateway.metrics_scraper import IDLE_AFTER_S as SCRAPE_IDLE_AFTER_S
from gateway.routing.filters import METRICS_STALE_AFTER_S


def _f(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return float(raw) if raw not in (None, "") else default


@dataclass(frozen=True)
class ProxyConfig:
    max_body_bytes: int = 4 * 1024 * 1024
    body_timeout_s: float = 10.0  # the whole request body must arrive within this
    max_queue: int = 512  # per endpoint and process
    max_age_critical_s: float = 30.0
    max_age_standard_s: float = 10.0
    max_age_sheddable_s: float = 2.0
    ttft_timeout_s: float = 60.0
    idle_timeout_s: float = 30.0
    connect_timeout_s: float = 2.0
    # A replica whose metrics are older than this counts as saturated for routing (llm-d's saturation detector; the
    # scraper polls every INFERCAP_PROXY_SCRAPE_INTERVAL_S). Raise it where scrapes are slow, e.g. on busy CPU hosts.
    metrics_stale_s: float = METRICS_STALE_AFTER_S
    # The scraper's cost follows the traffic, not the fleet (docs/request-path.md, "The replica metrics scraper"): a
    # replica is scraped while requests were routed to it within scrape_idle_s, and at most scrape_budget_per_s
    # scrapes start a second in a process (over it each wanted replica's cadence stretches).
    scrape_idle_s: float = SCRAPE_IDLE_AFTER_S
    scrape_budget_per_s: float = SCRAPE_BUDGET_PER_S
    snapshot_poll_s: float = 0.5
    snapshot_fallback_reload_s: float = 5.0  # when Redis is down, reload from the database this often
    demand_interval_s: float = 1.0
    member_interval_s: float = 0.25  # membership heartbeat that splits replica slots between proxy processes
    member_ttl_s: float = 1.5  # a process silent this long is counted out (its share goes to the others)
    rate_limit_fail_mode: str = "open"
    usage_flush_s: float = 0.25
    usage_batch: int = 500
    # LoRA (docs/lora-serving.md): how long one adapter load on a replica may take before its requests get a 502, and how
    # often the adapters each LoRA replica holds are read from its engine's /v1/models.
    lora_load_timeout_s: float = 60.0
    lora_sync_s: float = 2.0
    # One tenant's private adapters hold at most max(1, floor(max_loras x this)) of a replica's adapter slots; 1.0 or
    # more: no quota. A load is charged to the request that caused it as the replica's MU capacity over the load's
    # time, at least this many seconds of it (docs/lora-serving.md).
    lora_tenant_slot_share: float = 0.5
    lora_load_min_s: float = 0.5
    max_n: int = 8  # completions per request (``n``, ``best_of``): each is charged, this bounds one request's work
    # A tenant's best-effort traffic (no reservation) per endpoint, shared by every proxy process; 0 = unlimited.
    # 1,000 MU/min is one GPU's worth: one tenant cannot take a whole fleet's spare capacity.
    best_effort_mu_per_min: float = 1000.0
    # Bearer token for GET /metrics (it names every tenant and private endpoint). Empty: /metrics answers 404.
    metrics_token: str = field(default="", repr=False)

    def tenant_adapter_slots(self, max_loras: int) -> int:
        """How many of a replica's ``max_loras`` slots one tenant's private adapters may hold (0: no quota)."""
        if max_loras <= 0 or self.lora_tenant_slot_share >= 1.0:
            return 0
        return max(1, int(max_loras * self.lora_tenant_slot_share))

    @property
    def max_age_s(self) -> dict[str, float]:
        return {
            "critical": self.max_age_critical_s,
            "standard": self.max_age_standard_s,
            "sheddable": self.max_age_sheddable_s,
        }


def load_config() -> ProxyConfig:
    knobs = getattr(settings, "INFERCAP", {})
    base = dict(knobs.get("PROXY", {}))
    base.setdefault("snapshot_poll_s", float(knobs.get("SNAPSHOT_POLL_S", 0.5)))
    base.setdefault("rate_limit_fail_mode", knobs.get("RATE_LIMIT_FAIL_MODE", "open"))
    base.setdefault("metrics_token", os.environ.get("INFERCAP_METRICS_TOKEN") or knobs.get("METRICS_TOKEN") or "")
    cfg = ProxyConfig(**base)
    overrides = {}
    for name, value in cfg.__dict__.items():
        env_name = "INFERCAP_PROXY_" + name.upper()
        if env_name in os.environ:
            overrides[name] = os.environ[env_name] if isinstance(value, str) else type(value)(_f(env_name, value))
    if overrides:
        cfg = ProxyConfig(**{**cfg.__dict__, **overrides})
    if cfg.metrics_stale_s <= 0:
        raise ValueError("metrics_stale_s must be positive")
    if not (0 < cfg.scrape_idle_s < math.inf and 0 < cfg.scrape_budget_per_s < math.inf):
        raise ValueError("scrape_idle_s and scrape_budget_per_s must be positive and finite")
    if not 0 < cfg.lora_tenant_slot_share:
        raise ValueError("lora_tenant_slot_share must be positive")
    if cfg.max_n < 1:
        raise ValueError("max_n must be at least 1")
    if cfg.rate_limit_fail_mode not in ("open", "closed"):
        raise ValueError("RATE_LIMIT_FAIL_MODE must be 'open' or 'closed'")
    return cfg
