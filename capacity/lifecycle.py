"""The replica lifecycle: the one function that moves a replica between states, recording each move.

Below the services that use it (actuators, health checks, endpoint services), so they depend on it and not on
each other.
"""

from django.db import transaction
from django.utils import timezone

from endpoints.models import REPLICA_TRANSITIONS, Replica, ReplicaState, ReplicaTransition


class IllegalTransition(Exception):
    """A replica was asked to move to a state its lifecycle does not allow from where it is."""


def replica_transition(*, replica: Replica, to_state: str, reason: str = "") -> Replica:
    """Move a replica along its lifecycle, recording the transition. Illegal moves raise.

    The row is locked so that a health check and an actuator racing on one replica cannot both win.
    """
    with transaction.atomic():
        locked = Replica.objects.select_for_update().get(pk=replica.pk)
        if to_state not in REPLICA_TRANSITIONS[locked.state]:
            raise IllegalTransition(f"replica {locked.pk}: {locked.state} → {to_state} is not allowed")
        now = timezone.now()
        ReplicaTransition.objects.create(
            replica=locked, from_state=locked.state, to_state=to_state, at=now, reason=reason
        )
        locked.state = to_state
        locked.state_changed_at = now
        update_fields = ["state", "state_changed_at"]
        if to_state == ReplicaState.FAILED:
            locked.failure_reason = reason[:255]
            update_fields.append("failure_reason")
        locked.save(update_fields=update_fields)
    replica.state, replica.state_changed_at = locked.state, locked.state_changed_at
    replica.failure_reason = locked.failure_reason
    return replica
