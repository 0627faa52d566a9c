"""Endpoint admission (pure, no Django): priority classes, per-tenant fairness by model units,
queue-age shedding, a bounded queue that evicts sheddable work first, and Retry-After estimates.

The live proxy and the discrete-event simulator drive the same code with their own clocks.
"""

from endpoints.admission.classes import (
    CLASSES,
    CRITICAL,
    ENGINE_PRIORITY,
    SHEDDABLE,
    STANDARD,
    effective_priority,
    rank,
)
from endpoints.admission.drain import DrainRateMeter, retry_after_s
from endpoints.admission.queue import AdmissionQueue, OfferResult, QueuedItem

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
]
