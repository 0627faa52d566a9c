"""``make_router(policy_name, **params)``: build an endpoint's router by the name stored in ``Endpoint.routing_policy``."""

from collections.abc import Callable

from gateway.routing.base import Router
from gateway.routing.baselines import LeastRequestRouter, PowerOfTwoRouter, RoundRobinRouter
from gateway.routing.bounded_affinity import InfercapRouter
from gateway.routing.cost_aware import CostAwareRouter
from gateway.routing.llmd import LlmdRouter
from gateway.routing.lora_affinity import LoraAffinityRouter

POLICIES: dict[str, Callable[..., Router]] = {
    "round_robin": RoundRobinRouter,
    "least_request": LeastRequestRouter,
    "power_of_two": PowerOfTwoRouter,
    "llmd": LlmdRouter,
    "infercap": InfercapRouter,
    "lora_affinity": LoraAffinityRouter,
    "cost_aware": CostAwareRouter,  # needs the endpoint's routing plan (cost_aware.plan_figures)
}


class UnknownPolicy(ValueError):
    """The endpoint names a routing policy this build does not have."""


def make_router(policy_name: str, **params) -> Router:
    """A fresh router. ``params`` are the policy's keyword options (``seed``, weights, ``load_bound``…).

    Unknown names and unknown options raise ``UnknownPolicy``/``TypeError`` with the valid choices, so a
    typo in an endpoint's config fails at config load, not on the first request.
    """
    try:
        factory = POLICIES[policy_name]
    except KeyError:
        raise UnknownPolicy(f"unknown routing policy {policy_name!r}; choose one of {', '.join(POLICIES)}") from None
    try:
        return factory(**params)
    except TypeError as exc:
        raise TypeError(f"routing policy {policy_name!r}: {exc}") from exc


# The prefill pool of a disaggregated endpoint (docs/request-path.md, "Prefill/decode disaggregation") is routed by
# infercap's policy whatever the endpoint's own: its prefix affinity is the prefill replicas' cache, and its load is
# what a prefill pool has, in-flight MU at the prefill pool's coefficients plus the uncached prompt tokens sent and
# not yet answered (``prefill.PendingPrefill``).
PREFILL_POOL_POLICY = "infercap"


def make_prefill_router(**params) -> Router:
    """A fresh router for a disaggregated endpoint's prefill pool (``params`` as ``make_router``'s)."""
    return make_router(PREFILL_POOL_POLICY, **params)
