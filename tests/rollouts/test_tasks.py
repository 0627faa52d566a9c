"""The beat task ticks every active rollout; the autoscaler keeps its hands off a rollout's replicas."""

import pytest

from capacity.autoscaling import services as autoscaling
from capacity.autoscaling import ticks as autoscaling_ticks
from capacity.autoscaling.actuators import base
from endpoints.models import Endpoint, ReplicaState, RolloutState
from endpoints.rollouts import services, ticks
from tests.factories import ReplicaFactory
from workers.schedule import beat_schedule
from workers.tasks import rollouts as tasks

pytestmark = pytest.mark.django_db


class FakeActuator(base.Actuator):
    """Creates rows for the version it is asked to launch (as the real actuators do); no processes."""

    name = "fake"

    def __init__(self):
        self.launched = []

    def launch(self, endpoint, count, *, standby=False):
        self.launched.append((base.launch_version_id(endpoint), count))
        return [
            ReplicaFactory(
                endpoint=endpoint,
                state=ReplicaState.STARTING,
                actuator=self.name,
                version_id=base.launch_version_id(endpoint),
                is_standby=standby,
            )
            for _ in range(count)
        ]

    def terminate(self, replicas, *, reason):
        for replica in replicas:
            self.stop_row(replica, reason)

    def sync(self, endpoint):
        pass


@pytest.fixture
def fake(monkeypatch):
    actuator = FakeActuator()
    monkeypatch.setattr("capacity.autoscaling.actuators.get_actuator", lambda endpoint: actuator)
    monkeypatch.setattr(autoscaling, "get_actuator", lambda endpoint: actuator)
    return actuator


@pytest.fixture
def endpoint(tenant_a):
    endpoint = tenant_a.endpoint
    Endpoint.objects.filter(pk=endpoint.pk).update(launch_options={"actuator": "fake"}, desired_replicas=2)
    endpoint.refresh_from_db()
    v1 = services.ensure_current_version(endpoint)
    for _ in range(2):
        ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY, actuator="fake", version=v1)
    return endpoint


def test_beat_schedule_ticks_rollouts_every_few_seconds():
    entry = beat_schedule()["rollouts-tick"]
    assert entry["task"] == "rollouts.tick_all" and entry["schedule"] <= 5


def test_tick_all_launches_the_surge_of_the_new_version(clean_store, fake, endpoint):
    v2 = services.create_version(endpoint=endpoint, launch_options={"actuator": "fake", "speed": 2.0})
    rollout = services.start_rollout(endpoint=endpoint, to_version=v2, max_surge=1)
    assert tasks.tick_all() == 1  # eager in tests: the per-rollout tick runs in place
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.SURGING and rollout.started_at is not None
    assert fake.launched == [(v2.pk, 1)]
    # a repeated tick with nothing new observed launches nothing more (max_surge 1 is starting)
    tasks.tick_all()
    assert fake.launched == [(v2.pk, 1)]
    assert endpoint.replicas.filter(version=v2).count() == 1


def test_the_autoscaler_leaves_a_rollouts_replicas_alone_and_scales_only_the_serving_version(
    clean_store, fake, endpoint
):
    v2 = services.create_version(endpoint=endpoint, launch_options={"actuator": "fake", "speed": 2.0})
    rollout = services.start_rollout(endpoint=endpoint, to_version=v2)
    ticks.rollout_tick(rollout_id=rollout.pk)  # 2 surge replicas of v2 starting next to 2 ready v1
    assert endpoint.replicas.exclude(state=ReplicaState.STOPPED).count() == 4
    # desired 2 with 4 replicas: outside a rollout this would drain two; during it nothing is touched
    actions = autoscaling.reconcile(endpoint=endpoint)
    assert actions[-1].startswith("rollout in progress")
    assert endpoint.replicas.filter(state=ReplicaState.DRAINING).count() == 0
    # the autoscaler's inputs count the serving version only
    inputs = autoscaling_ticks.horizontal_inputs(endpoint, now=0.0)
    assert (inputs.ready, inputs.starting) == (2, 0)
    # after the rollout ended (rolled back here), scaling resumes on the serving version: v2 is not counted
    services.rollback_rollout(rollout=rollout)
    ticks.rollout_tick(rollout_id=rollout.pk)  # stops the new replicas
    ticks.rollout_tick(rollout_id=rollout.pk)  # sees them gone
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.ROLLED_BACK
    Endpoint.objects.filter(pk=endpoint.pk).update(desired_replicas=3)
    endpoint.refresh_from_db()
    fake.launched.clear()
    autoscaling.reconcile(endpoint=endpoint)
    assert fake.launched == [(endpoint.current_version_id, 1)]


def test_a_version_that_cannot_be_launched_is_rolled_back(clean_store, fake, endpoint, monkeypatch):
    from capacity.autoscaling.actuators import ActuatorError

    def refuse(endpoint, count, *, standby=False):
        raise ActuatorError("bad launch options for a-model: unknown profile 'huge'")

    monkeypatch.setattr(fake, "launch", refuse)
    v2 = services.create_version(endpoint=endpoint, launch_options={"actuator": "fake", "profile": "huge"})
    rollout = services.start_rollout(endpoint=endpoint, to_version=v2)
    ticks.rollout_tick(rollout_id=rollout.pk)
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.ROLLING_BACK
    assert "could not start: bad launch options" in rollout.reason
    ticks.rollout_tick(rollout_id=rollout.pk)
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.ROLLED_BACK and "unknown profile" in rollout.reason
    assert list(rollout.events.values_list("kind", flat=True)) == ["created", "surge", "rollback", "rolled_back"]
    # the old version never stopped serving
    assert endpoint.replicas.filter(state=ReplicaState.READY, version=endpoint.current_version).count() == 2


def test_version_stats_count_outcomes_per_version_through_the_replica(clean_store, fake, endpoint):
    from datetime import timedelta

    from django.utils import timezone

    from billing.models import UsageStatus
    from endpoints.rollouts.selectors import version_stats
    from tests.factories import UsageRecordFactory

    v1 = endpoint.current_version
    v2 = services.create_version(endpoint=endpoint, launch_options={"actuator": "fake", "speed": 2.0})
    old = endpoint.replicas.filter(version=v1).first()
    new = ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY, version=v2)
    unversioned = ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY, version=None)
    since = timezone.now()

    def record(replica, status=UsageStatus.OK, slo_met=True, at=None):
        UsageRecordFactory(
            endpoint=endpoint,
            tenant=endpoint.owner_tenant,
            replica=replica,
            status=status,
            slo_met=slo_met,
            finished_at=at or timezone.now(),
        )

    record(old)
    record(unversioned, slo_met=False)  # counts as the serving version
    record(old, status=UsageStatus.SHED)  # not the replica's fault: left out
    record(old, at=since - timedelta(minutes=5))  # before the window
    record(new, status=UsageStatus.UPSTREAM_ERROR, slo_met=False)
    record(new, status=UsageStatus.TIMEOUT, slo_met=False)
    record(new, slo_met=False)
    record(new)
    stats = version_stats(endpoint=endpoint, since=since)
    assert (stats[v1.pk].requests, stats[v1.pk].errors, stats[v1.pk].slo_misses) == (2, 0, 1)
    assert (stats[v2.pk].requests, stats[v2.pk].errors, stats[v2.pk].slo_misses) == (4, 2, 1)
    assert stats[v2.pk].error_rate == 0.5 and stats[v2.pk].latency_burn == 0.5

    # Attempts that failed before the first byte and were retried elsewhere (reported by the proxy in Redis, the
    # usage record naming only the replica that answered): one more request and error each for their version
    from endpoints.rollouts.keys import FAILED_ATTEMPTS_KEY

    key = FAILED_ATTEMPTS_KEY.format(endpoint_id=endpoint.pk)
    now = timezone.now().timestamp()
    clean_store.zadd(key, {f"{new.pk}:r1": now, f"{new.pk}:r2": now, f"{old.pk}:r3": now})
    clean_store.zadd(key, {f"{new.pk}:r0": since.timestamp() - 60})  # before the window
    stats = version_stats(endpoint=endpoint, since=since)
    assert (stats[v1.pk].requests, stats[v1.pk].errors) == (3, 1)
    assert (stats[v2.pk].requests, stats[v2.pk].errors, stats[v2.pk].slo_misses) == (6, 4, 1)


def test_a_serving_version_changed_behind_the_rollouts_back_fails_it(clean_store, fake, endpoint):
    v2 = services.create_version(endpoint=endpoint, launch_options={"actuator": "fake", "speed": 2.0})
    v3 = services.create_version(endpoint=endpoint, launch_options={"actuator": "fake", "speed": 3.0})
    rollout = services.start_rollout(endpoint=endpoint, to_version=v2)
    ticks.rollout_tick(rollout_id=rollout.pk)
    Endpoint.objects.filter(pk=endpoint.pk).update(current_version=v3)  # e.g. an edit in the database
    ticks.rollout_tick(rollout_id=rollout.pk)
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.FAILED and rollout.finished_at is not None
    assert "changed outside the rollout" in rollout.reason
    # nothing else happens to a failed rollout
    launched = list(fake.launched)
    ticks.rollout_tick(rollout_id=rollout.pk)
    assert fake.launched == launched


def test_a_rollback_after_old_replicas_drained_starts_the_old_version_again(clean_store, fake, endpoint, monkeypatch):
    monkeypatch.setattr(ticks, "warm_up_request", lambda url, model: (True, ""))
    v1 = endpoint.current_version
    v2 = services.create_version(endpoint=endpoint, launch_options={"actuator": "fake", "speed": 2.0})
    rollout = services.start_rollout(
        endpoint=endpoint, to_version=v2, strategy="canary", canary_steps=[50, 100], step_duration_s=600, max_surge=1
    )
    ticks.rollout_tick(rollout_id=rollout.pk)  # one v2 replica starting (2 old + 1 = B + S)
    assert fake.launched == [(v2.pk, 1)]
    endpoint.replicas.filter(version=v2).update(state=ReplicaState.READY)
    ticks.rollout_tick(rollout_id=rollout.pk)  # warmed: 50 % on v2, one v1 replica drains
    rollout.refresh_from_db()
    assert (rollout.state, rollout.traffic_percent) == (RolloutState.SHIFTING, 50)
    drained = endpoint.replicas.get(version=v1, state=ReplicaState.DRAINING)
    fake.stop_row(drained, "drained")
    services.rollback_rollout(rollout=rollout, reason="bad answers")
    fake.launched.clear()
    ticks.rollout_tick(rollout_id=rollout.pk)
    # v2 drains and v1 is started again to its starting count, within B + S alive
    assert fake.launched == [(v1.pk, 1)]
    assert endpoint.replicas.filter(version=v2, state=ReplicaState.DRAINING).count() == 1
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.ROLLING_BACK
    endpoint.replicas.filter(version=v1, state=ReplicaState.STARTING).update(state=ReplicaState.READY)
    fake.stop_row(endpoint.replicas.get(version=v2, state=ReplicaState.DRAINING), "drained")
    ticks.rollout_tick(rollout_id=rollout.pk)
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.ROLLED_BACK and rollout.reason == "bad answers"
    assert endpoint.replicas.filter(version=v1, state=ReplicaState.READY).count() == 2
    assert "started 1 old-version replica(s) again" in rollout.events.values_list("message", flat=True)


def test_a_horizontal_tick_during_a_rollout_is_recorded_but_not_applied(clean_store, fake, endpoint):
    """The rollout owns the replicas: a tick records what demand asked for, changes nothing, and stays out of the
    cooldowns (which read applied decisions only)."""
    v2 = services.create_version(endpoint=endpoint, launch_options={"actuator": "fake", "speed": 2.0})
    rollout = services.start_rollout(endpoint=endpoint, to_version=v2, max_surge=1)
    ticks.rollout_tick(rollout_id=rollout.pk)
    launched = list(fake.launched)
    Endpoint.objects.filter(pk=endpoint.pk).update(min_replicas=3)  # the floor alone asks for one more replica
    row = autoscaling_ticks.horizontal_tick(endpoint_id=endpoint.pk, tick="t-rollout", now=1_000.0)
    assert row is not None and row.desired == 3 and row.current == 2
    assert row.applied is False
    assert row.inputs["actions"][-1] == "rollout in progress: not applied"
    endpoint.refresh_from_db()
    assert endpoint.desired_replicas == 2
    assert fake.launched == launched
    # once the rollout has ended the same floor is applied
    services.rollback_rollout(rollout=rollout)
    ticks.rollout_tick(rollout_id=rollout.pk)
    ticks.rollout_tick(rollout_id=rollout.pk)
    row = autoscaling_ticks.horizontal_tick(endpoint_id=endpoint.pk, tick="t-after", now=1_005.0)
    assert row.applied is True and row.desired == 3
    endpoint.refresh_from_db()
    assert endpoint.desired_replicas == 3


def test_each_batch_starts_only_what_the_quota_has_left_now(clean_store, fake, endpoint, tenant_a):
    """The surge fitted when the rollout began; a sibling endpoint's replicas took the room since. The tick starts
    what fits, says why the rest waits, and starts the rest once the sibling's replicas are gone."""
    tenant = tenant_a.tenant
    tenant.quota_max_replicas = 4
    tenant.save()
    v2 = services.create_version(endpoint=endpoint, launch_options={"actuator": "fake", "speed": 2.0})
    rollout = services.start_rollout(endpoint=endpoint, to_version=v2, max_surge=2)
    assert rollout.max_surge == 2  # 2 ready + 2 surge = 4: fits at the start
    sibling = ReplicaFactory(endpoint__owner_tenant=tenant, state=ReplicaState.READY, actuator="fake")
    ticks.rollout_tick(rollout_id=rollout.pk)
    assert fake.launched == [(v2.pk, 1)]  # 2 wanted, 1 left under the quota of 4
    capped = rollout.events.get(kind="launch_capped")
    assert capped.data == {"wanted": 2, "allowed": 1}
    assert "started 1 of 2 new-version replica(s): tenant replica quota allows 1" in capped.message
    ticks.rollout_tick(rollout_id=rollout.pk)  # still full: nothing started, nothing over the quota
    ticks.rollout_tick(rollout_id=rollout.pk)
    assert fake.launched == [(v2.pk, 1)]
    capped = list(rollout.events.filter(kind="launch_capped").values_list("data", flat=True))
    # said once per change: 1 of 2, then 0 of 1 (however many ticks it waits)
    assert capped == [{"wanted": 2, "allowed": 1}, {"wanted": 1, "allowed": 0}]
    base.Actuator.stop_row(sibling, "test: the sibling scaled down")
    ticks.rollout_tick(rollout_id=rollout.pk)
    assert fake.launched == [(v2.pk, 1), (v2.pk, 1)]
    rollout.refresh_from_db()
    assert rollout.state in (RolloutState.SURGING, RolloutState.SHIFTING)
