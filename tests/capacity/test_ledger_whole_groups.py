"""The capacity ledger in whole TP groups: how many more replicas of each endpoint's TP size the free GPUs hold
(a node with 3 free GPUs has no room for a TP-4 replica), in the ledger, its API and the console."""

import json
import time

import pytest
from django.urls import reverse

from capacity.ledger import capacity_ledger, replica_gpus
from endpoints.models import Endpoint
from placement.cluster import Cluster, Gpu, Node
from tests.conftest import client_for
from tests.factories import EndpointFactory, HardwareProfileFactory

LEDGER_URL = "/api/v1/capacity/ledger"


@pytest.fixture
def tp4_and_tp1(tenant_a):
    """Tenant A's endpoint on a TP-4 hardware profile, and one whose launch options run one GPU a replica."""
    tp4 = HardwareProfileFactory(name="h100-tp4", gpus_per_replica=4)
    Endpoint.objects.filter(pk=tenant_a.endpoint.pk).update(hardware_profile=tp4)
    single = EndpointFactory(name="tp1-model", owner_tenant=tenant_a.tenant, hardware_profile=tp4,
                             launch_options={"tensor_parallel_size": 1})  # fmt: skip
    return tenant_a.endpoint, single


def test_three_free_gpus_hold_no_tp4_replica_and_three_tp1_replicas(tp4_and_tp1):
    tp4, tp1 = tp4_and_tp1
    cluster = Cluster([Node("hgx", 8)])
    cluster.take("running", [Gpu("hgx", i) for i in range(5)])
    ledger = capacity_ledger(endpoints=Endpoint.objects.filter(pk__in=[tp4.pk, tp1.pk]), free_gpus=cluster)
    rows = {row.endpoint_id: row for row in ledger.endpoints}
    assert (rows[tp4.pk].replica_gpus, rows[tp4.pk].whole_replicas_free) == (4, 0)
    assert (rows[tp1.pk].replica_gpus, rows[tp1.pk].whole_replicas_free) == (1, 3)
    assert ledger.total["free_gpus"] == 3
    # The count is a what-if: the cluster's holdings are as they were.
    assert cluster.free_count() == 3 and set(cluster.held) == {"running"}
    # Islands of 2: 4 free GPUs, one in each of four pairs, hold no TP-2 group.
    pairs = Cluster([Node("pcie", 8, island=2)])
    pairs.take("odd", [Gpu("pcie", i) for i in (1, 3, 5, 7)])
    tp1.launch_options = {"tensor_parallel_size": 2}
    tp1.save(update_fields=["launch_options"])
    row = capacity_ledger(endpoints=Endpoint.objects.filter(pk=tp1.pk), free_gpus=pairs).endpoints[0]
    assert (row.replica_gpus, row.whole_replicas_free) == (2, 0)


def test_without_known_gpus_the_room_is_unknown(tp4_and_tp1):
    tp4, _ = tp4_and_tp1
    ledger = capacity_ledger(endpoints=Endpoint.objects.filter(pk=tp4.pk))
    assert ledger.endpoints[0].whole_replicas_free is None and ledger.total["free_gpus"] is None
    assert replica_gpus(Endpoint(launch_options={"tensor_parallel_size": "x"})) == 1


@pytest.fixture
def local_gpus(settings, tmp_path, monkeypatch):
    """This host has 8 GPUs in one NVLink domain, 5 of them held by a replica that is starting."""
    monkeypatch.setitem(settings.INFERCAP, "LOCAL_GPUS", "8")
    settings.VAR_DIR = tmp_path
    holding = {"starting-1": {"gpus": [0, 1, 2, 3, 4], "pid": None, "port": 8123, "at": time.time()}}
    (tmp_path / "local-gpus.json").write_text(json.dumps(holding))


def test_api_and_console_show_room_in_whole_groups_of_this_hosts_gpus(tp4_and_tp1, local_gpus, operator, client):
    tp4, tp1 = tp4_and_tp1
    body = client_for(operator).get(LEDGER_URL).json()
    rows = {row["endpoint_id"]: row for row in body["endpoints"]}
    assert (rows[tp4.pk]["whole_replicas_free"], rows[tp1.pk]["whole_replicas_free"]) == (0, 3)
    assert body["total"]["free_gpus"] == 3
    client.force_login(operator)
    table = client.get(reverse("console:fleet"), {"view": "table", "sort": "room"}).content.decode()
    assert "Room (whole replicas)" in table
    assert f'data-room="{tp4.pk}">0 × TP-4<' in table and f'data-room="{tp1.pk}">3 × TP-1<' in table
    detail = client.get(reverse("console:endpoint", args=[tp4.pk])).content.decode()
    assert "0 more whole TP-4 replicas in the free GPUs" in detail


def test_prefill_and_fallback_pools_count_in_their_own_group_sizes_on_this_host(
    tp4_and_tp1, local_gpus, operator, client
):
    """On this host (3 GPUs free): a prefill pool whose launch options run 2 ranks has room for one TP-2 replica; a
    fallback profile of 2 GPUs a replica counts 2 whatever the endpoint's ``tensor_parallel_size`` (the fallback
    launch replaces it with the profile's), so one; an aggregated endpoint without other profiles has no pools."""
    tp4, tp1 = tp4_and_tp1
    tp2 = HardwareProfileFactory(name="a100-tp2", gpus_per_replica=2)
    Endpoint.objects.filter(pk=tp4.pk).update(
        serving_mode="disaggregated",
        kv_connector="nixl",
        prefill_launch_options={"tensor_parallel_size": 2},
        fallback_hardware_profile=tp2,
        launch_options={"tensor_parallel_size": 4},
    )
    body = client_for(operator).get(LEDGER_URL).json()
    rows = {row["endpoint_id"]: row for row in body["endpoints"]}
    assert (rows[tp4.pk]["replica_gpus"], rows[tp4.pk]["whole_replicas_free"]) == (4, 0)
    assert rows[tp4.pk]["pools"] == [
        {
            "pool": "prefill",
            "hardware_profile": "h100-tp4",
            "replica_gpus": 2,
            "whole_replicas_free": 1,
            "mig_slice": "",
        },
        {
            "pool": "fallback",
            "hardware_profile": "a100-tp2",
            "replica_gpus": 2,
            "whole_replicas_free": 1,
            "mig_slice": "",
        },
    ]
    assert rows[tp1.pk]["pools"] == []
    client.force_login(operator)
    cards = client.get(reverse("console:fleet")).content.decode()
    assert f'data-pool-room="{tp4.pk}-fallback">1 × TP-2 on a100-tp2<' in cards


def test_a_bad_local_gpus_setting_leaves_the_room_unknown_not_an_error(tp4_and_tp1, settings, monkeypatch, operator):
    monkeypatch.setitem(settings.INFERCAP, "LOCAL_GPUS", "eight")
    response = client_for(operator).get(LEDGER_URL)
    assert response.status_code == 200
    assert {row["whole_replicas_free"] for row in response.json()["endpoints"]} == {None}
    assert response.json()["total"]["free_gpus"] is None


@pytest.mark.parametrize("tp", [None, 1, 2, "8", "x", 0])
@pytest.mark.parametrize("profile_size", [None, 1, 4])
@pytest.mark.parametrize("actuator", ["local", "kubernetes"])
def test_the_ledger_counts_a_replica_as_its_actuator_launches_it(db, tp, profile_size, actuator):
    from capacity.autoscaling.actuators.replica_shape import engine_gpus, profile_gpus

    hardware = HardwareProfileFactory(gpus_per_replica=profile_size) if profile_size else None
    options = {"actuator": actuator, **({"tensor_parallel_size": tp} if tp is not None else {})}
    endpoint = Endpoint(
        hardware_profile=hardware, launch_options=options
    )  # unsaved: an endpoint needs no profile here
    launched = engine_gpus(endpoint, hardware) if actuator == "local" else profile_gpus(hardware)
    assert replica_gpus(endpoint) == launched
    expected = profile_size or 1 if actuator == "kubernetes" or tp is None else {"8": 8, "x": 1, 0: 1}.get(tp, tp)
    assert launched == expected
