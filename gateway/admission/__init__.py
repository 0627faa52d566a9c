"""Endpoint admission (pure, no Django): priority classes, per-tenant fairness by model units,
queue-age shedding, a bounded queue that evicts sheddable work first, and Retry-After estimates.

The live proxy and the simulators drive the same code (``AdmissionController``) with their own clocks.
"""

from gateway.admission.classes import (
    CLASSES,
    CRITICAL,
    ENGINE_PRIORITY,
    SHEDDABLE,
    STANDARD,
    effective_priority,
    rank,
)
from gateway.admission.controller import (
    DEFAULT_MAX_AGE_S,
    DEFAULT_MAX_QUEUE,
    SHED_REASONS,
    AdmissionController,
    Enqueued,
    Refusal,
)
from gateway.admission.drain import DrainRateMeter, retry_after_s
from gateway.admission.queue import AdmissionQueue, OfferResult, QueuedItem

__all__ = [
    "CLASSES",
    "CRITICAL",
    "ENGINE_PRIORITY",
    "STANDARD",
    "SHEDDABLE",
    "rank",
    "effective_priority",
    "AdmissionQueue",
    "QueuedItem",
    "OfferResult",
    "DrainRateMeter",
    "retry_after_s",
    "AdmissionController",
    "Enqueued",
    "Refusal",
    "DEFAULT_MAX_QUEUE",
    "DEFAULT_MAX_AGE_S",
    "SHED_REASONS",
]
