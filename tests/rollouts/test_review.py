"""Regression tests of rollouts found in review that need the rollout tick (the fake actuator of test_tasks)."""

import pytest

from endpoints.models import Replica, ReplicaState, RolloutState
from endpoints.rollouts import services, ticks
from tests.rollouts import test_tasks

pytestmark = pytest.mark.django_db
fake, endpoint = test_tasks.fake, test_tasks.endpoint  # the tick tests' fixtures: a fake actuator, 2 ready v1


def test_a_launch_failure_that_rolls_back_does_not_also_drain_the_old_version(
    clean_store, fake, endpoint, monkeypatch
):
    # A rolling batch can decide "shift to the warmed new replica, drain one old, launch the next new one" in one
    # tick. When that launch failed, the tick recorded a rollback (all traffic back to the old version) and then
    # still drained an old replica from the stale decision: the old version fell below its starting capacity.
    from capacity.autoscaling.actuators import ActuatorError

    monkeypatch.setattr(ticks, "warm_up_request", lambda url, **kwargs: (True, ""))
    v2 = services.create_version(endpoint=endpoint, launch_options={"actuator": "fake", "speed": 2.0})
    rollout = services.start_rollout(endpoint=endpoint, to_version=v2, max_surge=2)
    ticks.rollout_tick(rollout_id=rollout.pk)  # surging: 2 new replicas starting next to 2 ready old ones
    first, second = Replica.objects.filter(version=v2).order_by("id")
    Replica.objects.filter(pk=first.pk).update(state=ReplicaState.READY)
    Replica.objects.filter(pk=second.pk).update(state=ReplicaState.STOPPED)  # gone (no failure): launched again

    def refuse(endpoint, count, *, standby=False):
        raise ActuatorError("no capacity left for the next batch")

    monkeypatch.setattr(fake, "launch", refuse)
    ticks.rollout_tick(rollout_id=rollout.pk)
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.ROLLING_BACK and "no capacity" in rollout.reason
    old = Replica.objects.filter(endpoint=endpoint, version=rollout.from_version)
    assert old.filter(state=ReplicaState.READY).count() == 2
    assert not rollout.events.filter(kind="drain", data__version="old").exists()
