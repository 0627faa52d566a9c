"""MIG slices on the local actuator's host (INFERCAP_LOCAL_MIG, docs/placement.md "MIG slices"): a replica of a MIG
profile gets one free slice of that profile as its CUDA_VISIBLE_DEVICES (the slice's UUID), a launch that finds none
is capped and says why, the slices of one profile are never lent to another or to a whole-GPU replica, and the
ledger counts room in free slices."""

import os

import pytest
from django.urls import reverse

from capacity.autoscaling import services
from capacity.autoscaling.actuators import ActuatorError
from capacity.autoscaling.actuators.local import LocalActuator
from capacity.autoscaling.actuators.local_gpus import HOST, GpuLedger
from endpoints.models import Endpoint
from placement.cluster import Node
from tests.conftest import client_for
from tests.factories import EndpointFactory, HardwareProfileFactory

UUIDS = [f"MIG-{i}f8a1c2e-0b7d-5e3a-9c61-2d4b8e7f0a1{i}" for i in range(3)]


@pytest.fixture
def host_slices(settings, tmp_path):
    """This host's whole GPUs and MIG slices (``INFERCAP_LOCAL_GPUS``, ``INFERCAP_LOCAL_MIG``)."""

    def use(gpus: str, slices: str) -> None:
        settings.INFERCAP = {**settings.INFERCAP, "LOCAL_GPUS": gpus, "LOCAL_MIG": slices}
        settings.VAR_DIR = tmp_path

    return use


@pytest.fixture
def sliced(tenant_a):
    """Tenant A's endpoint on a 1g.10gb MIG profile, on simulated replicas started by the local actuator."""
    piece = HardwareProfileFactory(name="a100-1g", gpu_memory_gb=10, mig_profile="1g.10gb")
    Endpoint.objects.filter(pk=tenant_a.endpoint.pk).update(
        hardware_profile=piece, launch_options={"actuator": "local", "profile": "tiny"}
    )
    return Endpoint.objects.get(pk=tenant_a.endpoint.pk)


def test_each_replica_gets_one_slice_of_its_profile_by_uuid(
    db, sliced, host_slices, child_envs, reap_local_replicas, clean_store
):
    host_slices("1", f"1g.10gb={UUIDS[0]},{UUIDS[1]};3g.40gb={UUIDS[2]}")
    actuator = LocalActuator()
    first, second = actuator.launch(sliced, 2)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in child_envs] == UUIDS[:2]
    # No third 1g.10gb slice: the 3g.40gb slice and the whole GPU are not lent to it.
    actions = services.launch_capped(endpoint=sliced, actuator=actuator, wanted=1)
    assert "capped at 0 of 1: no MIG slice of this profile free (2 on this host, all held)" in actions[-1]
    assert sliced.replicas.count() == 2 and len(child_envs) == 2
    # A stopped replica's slice is free again, and the next replica gets that very slice.
    actuator.terminate([first], reason="scale-in")
    actuator.launch(sliced, 1)
    assert child_envs[-1]["CUDA_VISIBLE_DEVICES"] == UUIDS[0]
    # A whole-GPU endpoint on the same host gets the whole GPU, never a slice.
    whole = EndpointFactory(name="whole", owner_tenant=sliced.owner_tenant, launch_options=sliced.launch_options)
    actuator.launch(whole, 1)
    assert child_envs[-1]["CUDA_VISIBLE_DEVICES"] == "0"


def test_a_host_without_the_profiles_slices_or_with_bad_uuids_refuses_the_launch(
    db, sliced, host_slices, child_envs, reap_local_replicas
):
    host_slices("8", f"3g.40gb={UUIDS[2]}")
    with pytest.raises(ActuatorError, match=r"no MIG 1g.10gb slice \(INFERCAP_LOCAL_MIG\)"):
        LocalActuator().launch(sliced, 1)
    host_slices("", f"3g.40gb={UUIDS[2]}")
    whole = EndpointFactory(name="whole", owner_tenant=sliced.owner_tenant, launch_options=sliced.launch_options)
    with pytest.raises(ActuatorError, match="lists only MIG slices"):
        LocalActuator().launch(whole, 1)
    host_slices("", "1g.10gb=MIG-abcdefgh,1")
    with pytest.raises(ActuatorError, match="INFERCAP_LOCAL_MIG .*'1' is not a MIG device's UUID"):
        LocalActuator().launch(sliced, 1)
    assert not child_envs and sliced.replicas.count() == 0
    # A host with neither GPUs nor slices runs the replica as it always did (simulated, on the CPU).
    host_slices("", "")
    LocalActuator().launch(sliced, 1)
    assert child_envs[-1].get("CUDA_VISIBLE_DEVICES") == os.environ.get("CUDA_VISIBLE_DEVICES")


def test_the_ledger_counts_room_in_free_slices_of_the_rows_profile(
    db, sliced, host_slices, child_envs, reap_local_replicas, operator, client
):
    host_slices("2", f"1g.10gb={UUIDS[0]},{UUIDS[1]};3g.40gb={UUIDS[2]}")
    LocalActuator().launch(sliced, 1)
    body = client_for(operator).get("/api/v1/capacity/ledger").json()
    row = next(r for r in body["endpoints"] if r["endpoint_id"] == sliced.pk)
    assert (row["mig_slice"], row["replica_gpus"], row["whole_replicas_free"]) == ("1g.10gb", 1, 1)
    assert body["total"]["free_gpus"] == 2 and body["total"]["free_mig_slices"] == {"1g.10gb": 1, "3g.40gb": 1}
    client.force_login(operator)
    table = client.get(reverse("console:fleet"), {"view": "table"}).content.decode()
    assert f'data-room="{sliced.pk}">1 × MIG 1g.10gb slice<' in table
    assert 'data-total="gpus">0 <small data-total="mig-slices">and 1 MIG slice<' in table, "a slice is not a GPU"
    detail = client.get(reverse("console:endpoint", args=[sliced.pk])).content.decode()
    assert "1 more whole MIG 1g.10gb replica in the free slices" in detail


def test_a_slice_stays_held_by_its_uuid_when_the_list_of_slices_is_edited(tmp_path):
    """Holdings name their slices by UUID: an operator who adds a slice ahead of a held one, or drops one, while
    replicas run does not get one slice lent twice, nor a slice nobody holds counted as held."""
    a, b, c = UUIDS

    def ledger(devices):
        nodes = [Node(HOST, len(devices), island=1)]
        return GpuLedger(nodes, tmp_path, alive=lambda pid, port: True, name="local-mig-1g.10gb", devices=devices)

    assert ledger([a, b]).allot("r1", 1, port=1) == a
    edited = ledger([c, a, b])
    assert edited.allot("r2", 1, port=2) != a
    assert edited.held()["r1"] == [1]  # a, at its new place in the list
    shrunk = ledger([b])
    assert "r1" not in shrunk.held(), "a is no longer this host's: nobody here holds it"
