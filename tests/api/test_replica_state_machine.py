"""The replica lifecycle: every legal move is recorded; every illegal one raises and changes nothing."""

import pytest

from capacity.lifecycle import IllegalTransition, replica_transition
from endpoints.models import REPLICA_TRANSITIONS, ReplicaState, ReplicaTransition
from tests.factories import ReplicaFactory

STATES = [state.value for state in ReplicaState]
LEGAL = [(src, dst) for src in STATES for dst in STATES if dst in REPLICA_TRANSITIONS[src]]
ILLEGAL = [(src, dst) for src in STATES for dst in STATES if dst not in REPLICA_TRANSITIONS[src]]


def test_the_lifecycle_is_the_documented_one():
    assert ("pending", "starting") in LEGAL and ("starting", "ready") in LEGAL
    assert ("ready", "draining") in LEGAL and ("draining", "stopped") in LEGAL
    assert all((state, "failed") in LEGAL for state in ("pending", "starting", "ready", "draining"))
    assert ("ready", "stopped") in ILLEGAL  # must drain first
    assert ("stopped", "ready") in ILLEGAL and ("failed", "ready") in ILLEGAL
    assert not REPLICA_TRANSITIONS["stopped"]


@pytest.mark.django_db
@pytest.mark.parametrize(("src", "dst"), LEGAL)
def test_legal_transition_is_applied_and_recorded(src, dst):
    replica = ReplicaFactory(state=src)
    replica_transition(replica=replica, to_state=dst, reason="test")
    replica.refresh_from_db()
    assert replica.state == dst
    log = ReplicaTransition.objects.get(replica=replica)
    assert (log.from_state, log.to_state, log.reason) == (src, dst, "test")
    if dst == "failed":
        assert replica.failure_reason == "test"


@pytest.mark.django_db
@pytest.mark.parametrize(("src", "dst"), ILLEGAL)
def test_illegal_transition_raises_and_changes_nothing(src, dst):
    replica = ReplicaFactory(state=src)
    with pytest.raises(IllegalTransition):
        replica_transition(replica=replica, to_state=dst)
    replica.refresh_from_db()
    assert replica.state == src
    assert not ReplicaTransition.objects.filter(replica=replica).exists()


@pytest.mark.django_db
def test_full_life_reads_back_in_order():
    replica = ReplicaFactory(state="pending")
    path = ["starting", "ready", "draining", "stopped"]
    for state in path:
        replica_transition(replica=replica, to_state=state)
    history = list(ReplicaTransition.objects.filter(replica=replica).values_list("to_state", flat=True))
    assert history == path


@pytest.mark.django_db
def test_stale_in_memory_state_cannot_sneak_an_illegal_move():
    """The row is re-read under lock: a caller holding an old copy is judged on the current state."""
    replica = ReplicaFactory(state="ready")
    stale = type(replica).objects.get(pk=replica.pk)
    replica_transition(replica=replica, to_state="draining")
    replica_transition(replica=replica, to_state="stopped")
    with pytest.raises(IllegalTransition):
        replica_transition(replica=stale, to_state="failed")  # ready → failed would be legal for the stale copy
