"""Falling back to another hardware profile (docs/placement.md, "Falling back to another hardware profile"): a
scale-up whose TP group the local actuator cannot place whole starts nothing on the endpoint's hardware, and, where
the endpoint names a ``fallback_hardware_profile``, starts the rest on that profile's own group size, within the
owner's GPU quota counted in the fallback's GPUs; the decision's record says both; without a fallback nothing starts."""

import time

import pytest

from capacity.autoscaling import services, ticks
from capacity.autoscaling.actuators import ActuatorError
from capacity.autoscaling.actuators.local import LocalActuator
from capacity.autoscaling.actuators.local_gpus import NoWholeGroup
from endpoints.models import Endpoint
from tenants.quotas import live_usage
from tests.factories import HardwareProfileFactory


def tp4_endpoint(tenant_a, *, fallback: bool, tensor_parallel_size: int | None = None) -> Endpoint:
    """Tenant A's endpoint on 4-GPU replicas, with a 2-GPU fallback profile or none."""
    primary = HardwareProfileFactory(name="a100-tp4", gpus_per_replica=4)
    spare = HardwareProfileFactory(name="a100-tp2", gpus_per_replica=2) if fallback else None
    options = {"actuator": "local", "profile": "tiny"}
    if tensor_parallel_size:
        options["tensor_parallel_size"] = tensor_parallel_size
    Endpoint.objects.filter(pk=tenant_a.endpoint.pk).update(
        hardware_profile=primary, fallback_hardware_profile=spare, launch_options=options
    )
    return Endpoint.objects.get(pk=tenant_a.endpoint.pk)


@pytest.mark.parametrize("tensor_parallel_size", [None, 4])
def test_a_group_that_does_not_fit_starts_on_the_fallback_profile(
    db, tenant_a, host_gpus, child_envs, reap_local_replicas, clean_store, tensor_parallel_size
):
    host_gpus("3")  # three GPUs: no TP-4 group, ever; a TP-2 one fits once
    endpoint = tp4_endpoint(tenant_a, fallback=True, tensor_parallel_size=tensor_parallel_size)
    (action,) = services.launch_capped(endpoint=endpoint, actuator=LocalActuator(), wanted=2)
    assert "capped at 0 of 2: no interconnect domain on this host holds a TP-4 group" in action
    (replica,) = endpoint.replicas.all()
    assert "fell back to a100-tp2: launch failed: capped at 1 of 2: no whole TP-2 group free" in action
    assert replica.hardware_profile.name == "a100-tp2"
    assert [e["CUDA_VISIBLE_DEVICES"] for e in child_envs] == ["0,1"]  # the fallback's own group size
    # Its GPUs count for the quota at the fallback's size, not the endpoint's
    assert live_usage(tenant_a.tenant.pk).gpus == 2


def test_the_fallback_says_what_it_launched(db, tenant_a, host_gpus, child_envs, reap_local_replicas, clean_store):
    host_gpus("8/2")  # NVLink pairs: no island holds a TP-4 group
    endpoint = tp4_endpoint(tenant_a, fallback=True)
    (action,) = services.launch_capped(endpoint=endpoint, actuator=LocalActuator(), wanted=2)
    names = sorted(endpoint.replicas.values_list("name", flat=True))
    assert action.startswith("launch failed: capped at 0 of 2: no interconnect domain on this host holds a TP-4")
    assert action.split("; fell back to a100-tp2: ")[1].startswith("launched 2: ")
    assert sorted(action.rsplit(": ", 1)[1].split(", ")) == names
    assert sorted(e["CUDA_VISIBLE_DEVICES"] for e in child_envs) == ["0,1", "2,3"]


def test_without_a_fallback_nothing_starts(db, tenant_a, host_gpus, child_envs, reap_local_replicas, clean_store):
    host_gpus("3")
    endpoint = tp4_endpoint(tenant_a, fallback=False)
    (action,) = services.launch_capped(endpoint=endpoint, actuator=LocalActuator(), wanted=1)
    assert "capped at 0 of 1" in action and "fell back" not in action
    assert not endpoint.replicas.exists() and not child_envs


class Refusing:
    """An actuator whose every launch on the endpoint's hardware finds no whole group; it records the fallback's."""

    name = "stub"

    def __init__(self):
        self.launched: list[tuple[int | None, int]] = []

    def launch(self, endpoint, count, *, standby=False):
        profile = getattr(endpoint, "launch_hardware_profile_id", None)
        if profile is None:
            try:
                raise NoWholeGroup("no whole TP-4 group free in one domain (3 GPUs free)")
            except NoWholeGroup as exc:
                raise ActuatorError(f"capped at 0 of {count}: {exc}") from exc
        self.launched.append((profile, count))
        return []


def test_the_fallback_keeps_the_gpu_quota_in_its_own_gpus(db, tenant_a, clean_store):
    endpoint = tp4_endpoint(tenant_a, fallback=True)
    tenant_a.tenant.quota_max_gpus = 5  # the endpoint's size allows one replica, the fallback's two
    tenant_a.tenant.save(update_fields=["quota_max_gpus"])
    actuator = Refusing()
    actions = services.launch_capped(endpoint=endpoint, actuator=actuator, wanted=3)
    assert actions[0] == "launch capped at 1 of 3: tenant GPU quota allows 1"
    assert actuator.launched == [(endpoint.fallback_hardware_profile_id, 1)]
    # A bare fallback call: the quota in the fallback's GPUs (5 // 2), not the per-tick caps already counted
    actuator.launched.clear()
    said = services.fall_back(endpoint=endpoint, actuator=actuator, wanted=3, standby=False, role="mixed")
    assert said == "; fell back to a100-tp2: launched 0 of 3 (tenant GPU quota allows 2)"
    assert actuator.launched == [(endpoint.fallback_hardware_profile_id, 2)]


def test_an_error_that_is_not_a_missing_group_does_not_fall_back(db, tenant_a, clean_store):
    endpoint = tp4_endpoint(tenant_a, fallback=True)

    class Broken(Refusing):
        def launch(self, endpoint, count, *, standby=False):
            raise ActuatorError("bad launch options")

    (action,) = services.launch_capped(endpoint=endpoint, actuator=Broken(), wanted=1)
    assert action == "launch failed: bad launch options"


@pytest.mark.django_db(transaction=True)
def test_the_horizontal_decision_records_the_fallback(
    tenant_a, host_gpus, child_envs, reap_local_replicas, clean_store, monkeypatch
):
    host_gpus("3")
    monkeypatch.setattr(services, "get_actuator", lambda endpoint: LocalActuator())
    endpoint = tp4_endpoint(tenant_a, fallback=True)
    Endpoint.objects.filter(pk=endpoint.pk).update(min_replicas=1, max_replicas=2, desired_replicas=1)
    decision = ticks.horizontal_tick(endpoint_id=endpoint.pk, tick="h-fallback", now=time.time())
    assert "capped at 0 of 1: no interconnect domain on this host holds a TP-4 group" in decision.reason
    assert "fell back to a100-tp2: launched 1" in decision.reason
    (replica,) = endpoint.replicas.all()
    assert replica.hardware_profile.name == "a100-tp2" and child_envs[0]["CUDA_VISIBLE_DEVICES"] == "0,1"


class Recording:
    """An actuator that starts nothing and records each launch's pool profile and count."""

    name = "stub"

    def __init__(self):
        self.launched: list[tuple[int | None, int]] = []

    def launch(self, endpoint, count, *, standby=False):
        self.launched.append((getattr(endpoint, "launch_hardware_profile_id", None), count))
        return []


@pytest.mark.parametrize("pool", ["spot", "prefill"])
def test_a_pool_on_a_larger_profile_is_held_to_the_gpu_quota_in_its_own_gpus(db, tenant_a, clean_store, pool):
    # The endpoint's own replicas take one GPU, its spot or prefill pool's eight: a launch of that pool counts eight a
    # replica, or a tenant could name a small profile for the endpoint and start 8-GPU replicas quota-free.
    small = HardwareProfileFactory(name="l4-one", gpus_per_replica=1)
    big = HardwareProfileFactory(name="h100-tp8", gpus_per_replica=8)
    fields = {"hardware_profile": small, "launch_options": {"actuator": "local", "profile": "tiny"}}
    if pool == "spot":
        fields["spot_hardware_profile"] = big
    else:
        fields |= {"serving_mode": "disaggregated", "prefill_hardware_profile": big}
    Endpoint.objects.filter(pk=tenant_a.endpoint.pk).update(**fields)
    endpoint = Endpoint.objects.get(pk=tenant_a.endpoint.pk)
    tenant_a.tenant.quota_max_gpus = 16
    tenant_a.tenant.save(update_fields=["quota_max_gpus"])
    actuator = Recording()
    options = {"hardware_profile": big} if pool == "spot" else {"role": "prefill"}
    actions = services.launch_capped(endpoint=endpoint, actuator=actuator, wanted=3, **options)
    assert actions[0] == f"{pool}: launch capped at 2 of 3: tenant GPU quota allows 2"
    assert actuator.launched == [(big.pk, 2)]
    # The endpoint's own pool still counts its own size: one GPU a replica, all three fit
    own = Recording()
    actions = services.launch_capped(endpoint=endpoint, actuator=own, wanted=3)
    assert not any("capped" in action for action in actions)
    assert own.launched == [(None, 3)]


def test_a_replica_without_a_recorded_profile_counts_its_pools_or_versions_gpus(db, tenant_a, clean_store):
    # The Kubernetes actuator records no profile on a prefill pod, the local one none on a version's replica: the
    # quota counts the prefill pool's profile and the version's, not the endpoint's one GPU.
    from endpoints.models import EndpointVersion
    from tests.factories import ReplicaFactory

    small = HardwareProfileFactory(name="l4-one", gpus_per_replica=1)
    big = HardwareProfileFactory(name="h100-tp8", gpus_per_replica=8)
    four = HardwareProfileFactory(name="h100-tp4", gpus_per_replica=4)
    Endpoint.objects.filter(pk=tenant_a.endpoint.pk).update(
        hardware_profile=small, serving_mode="disaggregated", prefill_hardware_profile=big
    )
    endpoint = Endpoint.objects.get(pk=tenant_a.endpoint.pk)
    tenant_a.tenant.quota_max_gpus = 20
    tenant_a.tenant.save(update_fields=["quota_max_gpus"])
    version = EndpointVersion.objects.create(
        endpoint=endpoint, number=7, model_profile=endpoint.model_profile, hardware_profile=four
    )
    ReplicaFactory(endpoint=endpoint, role="prefill")  # 8
    ReplicaFactory(endpoint=endpoint, role="decode")  # 1
    ReplicaFactory(endpoint=endpoint, role="decode", version=version)  # 4
    ReplicaFactory(endpoint=endpoint, role="prefill", hardware_profile=small)  # recorded: 1
    assert live_usage(tenant_a.tenant.pk).gpus == 8 + 1 + 4 + 1
    left = services.quota_left(endpoint, exclude_own_serving=False)
    assert left.gpus == 20 - 14
