"""Versions and rollout operator actions against the database (no replica processes)."""

import pytest
from django.core.exceptions import ValidationError

from endpoints.models import Endpoint, EndpointVersion, ReplicaState, Rollout, RolloutState
from endpoints.rollouts import services
from endpoints.services import endpoint_create, endpoint_update
from tenants.models import AuditEntry
from tests.factories import EndpointFactory, ModelProfileFactory, ReplicaFactory

pytestmark = pytest.mark.django_db


def test_new_endpoints_start_at_version_1_and_a_change_creates_version_2(operator):
    endpoint = endpoint_create(
        actor=operator,
        name="ver-model",
        model_profile=ModelProfileFactory(),
        hardware_profile=EndpointFactory().hardware_profile,
    )
    assert endpoint.current_version.number == 1
    v2 = services.create_version(endpoint=endpoint, user=operator, launch_options={"speed": 2.0}, note="faster")
    assert v2.number == 2 and v2.launch_options == {"speed": 2.0} and v2.created_by == operator
    assert v2.model_profile_id == endpoint.model_profile_id  # unchanged fields carried over
    endpoint.refresh_from_db()
    assert endpoint.current_version.number == 1  # creating a version does not switch traffic
    assert AuditEntry.objects.filter(action="endpoint.version.create", object_id=str(endpoint.pk)).exists()


def test_a_version_equal_to_the_current_one_or_with_unknown_fields_is_refused():
    endpoint = EndpointFactory()
    with pytest.raises(ValidationError, match="nothing changed"):
        services.create_version(endpoint=endpoint, runtime=endpoint.runtime)
    with pytest.raises(ValidationError) as err:
        services.create_version(endpoint=endpoint, min_replicas=3)
    assert "min_replicas" in err.value.message_dict
    with pytest.raises(ValidationError) as err:
        services.create_version(endpoint=endpoint, runtime="nope")
    assert "runtime" in err.value.message_dict


def test_updating_a_versioned_field_without_replicas_to_replace_switches_at_once(operator):
    endpoint = EndpointFactory()
    ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY)  # hand-registered: nothing to replace
    other = ModelProfileFactory(name="llama-8b")
    endpoint_update(endpoint=endpoint, actor=operator, model_profile=other, ttft_slo_ms=900)
    endpoint.refresh_from_db()
    assert endpoint.model_profile == other and endpoint.ttft_slo_ms == 900
    assert endpoint.current_version.number == 2 and endpoint.current_version.model_profile == other
    assert not Rollout.objects.filter(endpoint=endpoint).exists()
    # a change of a live setting only creates no version
    endpoint_update(endpoint=endpoint, actor=operator, concurrency_limit=8)
    assert EndpointVersion.objects.filter(endpoint=endpoint).count() == 2


def test_updating_a_versioned_field_with_local_replicas_starts_a_rollout(operator):
    endpoint = EndpointFactory(launch_options={"actuator": "local"})
    ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY, actuator="local")
    endpoint_update(endpoint=endpoint, actor=operator, launch_options={"actuator": "local", "speed": 3.0})
    endpoint.refresh_from_db()
    rollout = Rollout.objects.get(endpoint=endpoint)
    assert rollout.state == RolloutState.PENDING and rollout.baseline_ready == 1
    assert (rollout.from_version.number, rollout.to_version.number) == (1, 2)
    assert endpoint.launch_options == {"actuator": "local"}  # the endpoint follows only when the rollout promotes
    # a second change while it runs is refused
    with pytest.raises(ValidationError, match="in progress"):
        endpoint_update(endpoint=endpoint, actor=operator, launch_options={"actuator": "local", "speed": 4.0})


def test_start_rollout_validates_its_settings():
    endpoint = EndpointFactory()
    v2 = services.create_version(endpoint=endpoint, launch_options={"speed": 2.0})
    with pytest.raises(ValidationError) as err:
        services.start_rollout(
            endpoint=endpoint,
            to_version=v2,
            strategy="yolo",
            canary_steps=[50, 10],
            max_surge=0,
            error_rate_margin=2,
        )
    assert set(err.value.message_dict) == {"strategy", "canary_steps", "max_surge", "error_rate_margin"}
    with pytest.raises(ValidationError) as err:
        services.start_rollout(endpoint=endpoint, to_version=endpoint.current_version)
    assert "to_version" in err.value.message_dict
    foreign = services.create_version(endpoint=EndpointFactory(), runtime="vllm")
    with pytest.raises(ValidationError) as err:
        services.start_rollout(endpoint=endpoint, to_version=foreign)
    assert "to_version" in err.value.message_dict


def test_operator_actions_record_events_and_audit_entries(operator):
    endpoint = EndpointFactory()
    v2 = services.create_version(endpoint=endpoint, launch_options={"speed": 2.0})
    rollout = services.start_rollout(endpoint=endpoint, to_version=v2, user=operator, strategy="canary")
    rollout = services.pause_rollout(rollout=rollout, user=operator)
    assert (rollout.state, rollout.paused_from) == (RolloutState.PAUSED, RolloutState.PENDING)
    with pytest.raises(ValidationError):
        services.pause_rollout(rollout=rollout, user=operator)
    rollout = services.promote_rollout(rollout=rollout, user=operator)  # before traffic moves: skip the canary
    assert rollout.strategy == "all_at_once" and rollout.state == RolloutState.PENDING
    rollout = services.rollback_rollout(rollout=rollout, user=operator, reason="changed my mind")
    assert rollout.state == RolloutState.ROLLING_BACK and rollout.reason == "changed my mind"
    kinds = list(rollout.events.values_list("kind", flat=True))
    assert kinds == ["created", "pause", "promote", "rollback"]
    actions = set(AuditEntry.objects.filter(object_id=str(endpoint.pk)).values_list("action", flat=True))
    assert {"rollout.start", "rollout.pause", "rollout.promote", "rollout.rollback"} <= actions
    with pytest.raises(ValidationError):
        services.resume_rollout(rollout=rollout, user=operator)


def test_traffic_weights_reach_the_proxy_snapshot():
    from gateway.proxy.snapshot_loader import read_snapshot

    endpoint = EndpointFactory()
    old = ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY)
    v2 = services.create_version(endpoint=endpoint, launch_options={"speed": 2.0})
    new = ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY, version=v2)
    info = read_snapshot().endpoints_by_name[endpoint.name]
    assert info.version_weights == ()  # no rollout: every ready replica is routed
    rollout = services.start_rollout(endpoint=endpoint, to_version=v2, strategy="canary")
    Rollout.objects.filter(pk=rollout.pk).update(state=RolloutState.SHIFTING, traffic_percent=10)
    info = read_snapshot().endpoints_by_name[endpoint.name]
    v1 = endpoint.current_version_id
    assert dict(info.version_weights) == {v1: 90, v2.pk: 10}
    assert {r.id: r.version_id for r in info.replicas} == {old.pk: v1, new.pk: v2.pk}


def test_a_kubernetes_rollout_needs_a_prepared_template_for_a_new_model_and_no_warm_pool(settings):
    settings.INFERCAP = {**settings.INFERCAP, "KUBERNETES_API_URL": "http://127.0.0.1:9"}  # never called
    endpoint = EndpointFactory(launch_options={"actuator": "kubernetes"})
    other = ModelProfileFactory(name="llama-70b")
    # a copy of the serving template would run the old model
    v2 = services.create_version(endpoint=endpoint, model_profile=other)
    with pytest.raises(ValidationError) as err:
        services.start_rollout(endpoint=endpoint, to_version=v2)
    assert "changes model_profile but names the same template Deployment" in str(err.value.message_dict)
    v3 = services.create_version(
        endpoint=endpoint, model_profile=other, launch_options={"actuator": "kubernetes", "deployment": "llama-70b"}
    )
    # the warm pool's standby Deployment runs the serving template: no rollout while there is one
    Endpoint.objects.filter(pk=endpoint.pk).update(warm_pool_size=1)
    endpoint.refresh_from_db()
    with pytest.raises(ValidationError, match="warm pool"):
        services.start_rollout(endpoint=endpoint, to_version=v3)
    Endpoint.objects.filter(pk=endpoint.pk).update(warm_pool_size=0)
    endpoint.refresh_from_db()
    assert services.start_rollout(endpoint=endpoint, to_version=v3).state == RolloutState.PENDING
