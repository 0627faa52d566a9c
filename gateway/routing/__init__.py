"""Routing: filter → score → pick, shared by the live proxy and the discrete-event simulator (pure: no Django).

Use ``make_router(endpoint.routing_policy, seed=…)`` once per endpoint and process, then per request
``pick(request, views, now)``; call ``on_routed`` when the request is sent and ``on_finished`` when it ends.
"""

from gateway.routing.base import ReplicaView, Router, RouteRequest
from gateway.routing.registry import POLICIES, UnknownPolicy, make_router
from gateway.routing.session import prompt_text_of, session_id_of

__all__ = [
    "POLICIES",
    "ReplicaView",
    "RouteRequest",
    "Router",
    "UnknownPolicy",
    "make_router",
    "prompt_text_of",
    "session_id_of",
]
