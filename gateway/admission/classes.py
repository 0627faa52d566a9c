"""Priority classes (Gateway API InferenceModel criticality) and how a request's class is decided."""

CRITICAL = "critical"
STANDARD = "standard"
SHEDDABLE = "sheddable"
CLASSES: tuple[str, ...] = (CRITICAL, STANDARD, SHEDDABLE)  # served in this order
_RANK = {name: i for i, name in enumerate(CLASSES)}
# The ``priority`` the proxy sends the engine for each class (vLLM serves lower values first under
# --scheduling-policy priority). The client's own ``priority`` never reaches the engine: it would let sheddable
# traffic outrank critical traffic on the replica. All are above the health probe's (endpoints.health.PROBE_PRIORITY,
# far below zero), so probes still jump every queue.
ENGINE_PRIORITY: dict[str, int] = {CRITICAL: 0, STANDARD: 1, SHEDDABLE: 2}


def rank(priority: str) -> int:
    """Lower rank is served first; an unknown name raises ValueError (callers validate input first)."""
    try:
        return _RANK[priority]
    except KeyError:
        raise ValueError(f"unknown priority class {priority!r}; expected one of {', '.join(CLASSES)}") from None


def effective_priority(*, key_max: str, reservation: str | None, requested: str | None = None) -> str:
    """The class a request runs at.

    The reservation sets the default (no reservation = best effort = sheddable), the key caps it,
    and a per-request header may only lower it: a client can volunteer to be shed, never jump the queue.
    """
    base = reservation if reservation is not None else SHEDDABLE
    if rank(base) < rank(key_max):
        base = key_max
    if requested is not None and rank(requested) > rank(base):
        return requested
    return base
