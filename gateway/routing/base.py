"""The routing contract shared by the live proxy and the discrete-event simulator (pure: no Django).

A router sees a snapshot of every replica of one endpoint (``ReplicaView``) and one request
(``RouteRequest``), filters, scores and picks a replica id, or None when no replica can take it now.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class ReplicaView:
    replica_id: str
    healthy: bool = True
    draining: bool = False
    metrics_age_s: float = 0.0  # now − time of the last successful /metrics scrape
    num_running: int = 0  # vllm:num_requests_running
    num_waiting: int = 0  # vllm:num_requests_waiting
    kv_usage: float = 0.0  # vllm:kv_cache_usage_perc, 0–1
    in_flight: int = 0  # requests this router has sent and not seen finish
    in_flight_mu: float = 0.0  # their cost in model units
    mu_capacity: float = 1.0  # in-flight MU the replica sustains at its SLO-compliant maximum
    concurrency_limit: int = 64
    block_size: int = 16  # from vllm:cache_config_info
    num_gpu_blocks: int = 0  # from vllm:cache_config_info; sizes the router's prefix index
    # LoRA (docs/lora.md): the adapters loaded on the replica (its engine's /v1/models children, plus the loads the
    # proxy made since) and its adapter slots (vLLM --max-loras; 0: it serves no adapters).
    adapters: frozenset = frozenset()
    max_loras: int = 0
    # The adapters of its requests running or waiting, from vllm:lora_requests_info (running_lora_adapters ∪
    # waiting_lora_adapters): what the Gateway API inference extension's LoRA filter reads (lora_affinity.py).
    active_adapters: frozenset = frozenset()
    # The hardware profile it runs on (a mixed fleet: cost_aware.py reads it); empty where nobody said.
    profile: str = ""


@dataclass
class RouteRequest:
    request_id: str
    prompt_text: str
    mu: float = 1.0
    session_id: str | None = None
    adapter: str | None = None  # the LoRA adapter the request names as its model; None: the base model
    extra: dict = field(default_factory=dict)


class Router(Protocol):
    name: str

    def pick(self, request: RouteRequest, replicas: Sequence[ReplicaView], now: float) -> str | None: ...

    def on_routed(self, request: RouteRequest, replica_id: str, now: float) -> None: ...

    def on_finished(self, request: RouteRequest, replica_id: str, now: float) -> None: ...

    # Optional: the request's first token arrived (the proxy's first streamed bytes, the simulator's end of prefill).
    # Callers look it up with getattr; RouterBase has a no-op.
    def on_first_token(self, request: RouteRequest, replica_id: str, now: float) -> None: ...
