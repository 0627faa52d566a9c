"""Manual scaling as a pin: an operator's replica count that the autoscaler holds until it expires, each step in
its decision log (docs/algorithms.md#manual-scaling-pins). The horizontal tick reads the pin; this module keeps it."""

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from django.db import transaction
from django.utils import timezone

from capacity.autoscaling import horizontal
from capacity.models import AutoscalerDecision, ScalePin
from endpoints.models import Endpoint
from tenants.services import audit_log

DEFAULT_PIN_MINUTES = 60
MAX_PIN_MINUTES = 7 * 24 * 60  # a week: a pin always runs out, so a forgotten one cannot hold a fleet forever
HORIZONTAL = AutoscalerDecision.Axis.HORIZONTAL


def autoscaled(endpoint: Endpoint) -> bool:
    """Whether the autoscaler moves this endpoint's count (``launch_options.autoscale``, on unless set false)."""
    return bool((endpoint.launch_options or {}).get("autoscale", True))


def _who(actor) -> str:
    return getattr(actor, "username", "") or "system"


def pin_record(pin: ScalePin) -> dict:
    return {
        "replicas": pin.replicas,
        "until": pin.until.isoformat(),
        "set_by": pin.set_by_label,
        "reason": pin.reason,
    }


def pin_set(
    *, endpoint: Endpoint, replicas: int, previous: int, minutes: int, actor=None, reason: str = ""
) -> tuple[ScalePin | None, AutoscalerDecision]:
    """Record an operator's scale, in the caller's transaction (which holds the endpoint's row): a pin for
    ``minutes`` when the autoscaler runs the endpoint (none when autoscaling is off: nothing moves the count then),
    and a decision in the log either way."""
    now = timezone.now()
    pin = None
    if autoscaled(endpoint):
        until = now + timedelta(minutes=minutes)
        pin, _ = ScalePin.objects.update_or_create(
            endpoint=endpoint,
            defaults={
                "replicas": replicas,
                "until": until,
                "reason": reason[:200],
                "set_by": actor if getattr(actor, "role", None) else None,
                "set_by_label": _who(actor)[:120],
                "set_at": now,
            },
        )
        why = f"operator scale by {pin.set_by_label}: pinned at {replicas} until {until:%Y-%m-%d %H:%M} UTC"
        inputs = {"pin": pin_record(pin)}
    else:
        why = f"operator scale by {_who(actor)} (autoscaling off: the count stays until changed)"
        inputs = {"manual": {"set_by": _who(actor), "reason": reason}}
    if reason:
        why = f"{why}: {reason}"
    decision = AutoscalerDecision.objects.create(
        endpoint=endpoint,
        axis=HORIZONTAL,
        tick=f"manual-{endpoint.pk}-{now.timestamp():.6f}",
        current=previous,
        desired=replicas,
        reason=why[:255],
        inputs=inputs,
        applied=True,
        at=now,
    )
    return pin, decision


def pin_release(*, endpoint: Endpoint, actor=None) -> bool:
    """End the pin now: the next tick decides on demand again (its decision says so). False when there was none."""
    with transaction.atomic():
        pin = ScalePin.objects.select_for_update().filter(endpoint=endpoint).first()
        if pin is None:
            return False
        record = pin_record(pin)
        pin.delete()
        audit_log(actor=actor, action="endpoint.unpin", obj=endpoint, detail={"pin": record})
        now = timezone.now()
        AutoscalerDecision.objects.create(
            endpoint=endpoint,
            axis=HORIZONTAL,
            tick=f"unpin-{endpoint.pk}-{now.timestamp():.6f}",
            current=endpoint.desired_replicas,
            desired=endpoint.desired_replicas,
            reason=f"pin at {record['replicas']} released by {_who(actor)}: the autoscaler decides again"[:255],
            inputs={"pin_released": record},
            applied=False,
            at=now,
        )
    return True


@dataclass(frozen=True)
class PinState:
    """What a tick finds: the pin in force, or the one that ran out since the last tick (now deleted)."""

    pin: ScalePin | None = None
    expired: ScalePin | None = None

    @property
    def stamp(self) -> tuple | None:
        return None if self.pin is None else (self.pin.pk, self.pin.set_at)


def pin_state(endpoint: Endpoint, *, now: float) -> PinState:
    pin = ScalePin.objects.filter(endpoint=endpoint).first()
    if pin is None:
        return PinState()
    if pin.until.timestamp() > now:
        return PinState(pin=pin)
    with transaction.atomic():
        # Only the pin read above: a scale that replaced it meanwhile is a new pin, not an expired one.
        deleted, _ = ScalePin.objects.filter(pk=pin.pk, set_at=pin.set_at).delete()
        if deleted:
            audit_log(action="endpoint.pin_expired", obj=endpoint, detail={"pin": pin_record(pin)})
    return PinState(expired=pin) if deleted else pin_state(endpoint, now=now)


def pin_stamp(endpoint_id: int) -> tuple | None:
    """The pin in force now, as (id, set at), to tell whether an operator scaled while a tick was deciding."""
    return ScalePin.objects.filter(endpoint_id=endpoint_id).values_list("pk", "set_at").first()


def pinned_decision(
    decision: horizontal.HorizontalDecision, state: PinState, *, min_replicas: int, max_replicas: int
) -> horizontal.HorizontalDecision:
    """The policy's decision with the pin applied (its count within the bounds in force now: a quota or new bounds
    may have lowered them), or with the expiry said; the policy's own count and reason stay in the record."""
    if state.pin is not None:
        pin = state.pin
        held = max(min(pin.replicas, max_replicas), min(min_replicas, max_replicas))
        note = "" if held == pin.replicas else f", held at {held} by the bounds in force"
        reason = (
            f"pinned at {pin.replicas} by {pin.set_by_label} until {_utc(pin.until)}{note} "
            f"(the policy: {decision.desired}, {decision.reason})"
        )
        inputs = {**decision.inputs, "pin": pin_record(pin), "policy_desired": decision.desired}
        return replace(decision, desired=held, reason=reason, inputs=inputs)
    if state.expired is not None:
        pin = state.expired
        reason = f"pin at {pin.replicas} by {pin.set_by_label} expired at {_utc(pin.until)}; {decision.reason}"
        return replace(decision, reason=reason, inputs={**decision.inputs, "pin_expired": pin_record(pin)})
    return decision


def _utc(at: datetime) -> str:
    return f"{at.astimezone(UTC):%H:%M} UTC"
