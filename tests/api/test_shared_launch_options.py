"""/api/v1/endpoints/: a tenant that only reserves on a shared endpoint reads the allowlisted tuning of its launch
options, never the operators' placement (actuator, Deployment, namespace, cpuset); operators and the owning tenant
see every option."""

import pytest
from django.urls import reverse

from tests.factories import EndpointFactory, ReservationFactory

pytestmark = pytest.mark.django_db

PLACEMENT = {
    "actuator": "kubernetes",
    "deployment": "infercap-prod-70b-east",
    "namespace": "gpu-pool-7",
    "cpuset": "cpus 41,43,47",
}
TUNING = {"max_model_len": 8192, "enable_prefix_caching": True}


@pytest.fixture
def shared(world):
    endpoint = EndpointFactory(name="shared-70b", launch_options={**PLACEMENT, **TUNING})  # no owner: the operators'
    ReservationFactory(tenant=world.a.tenant, endpoint=endpoint)
    return endpoint


@pytest.mark.parametrize("who", ["a_member", "a_admin", "a_read_key"])
def test_a_reserving_tenant_sees_the_tuning_not_the_placement(world, shared, who):
    client = world.client(who)
    listed = client.get(reverse("endpoint-list"))
    detail = client.get(reverse("endpoint-detail", args=[shared.pk]))
    assert listed.status_code == 200 and detail.status_code == 200, (listed.content, detail.content)
    rows = [row for row in listed.json()["results"] if row["id"] == shared.pk]
    assert len(rows) == 1
    for row in (rows[0], detail.json()):
        assert row["launch_options"] == TUNING
    for value in PLACEMENT.values():
        assert value not in listed.content.decode() and value not in detail.content.decode()


def test_operators_and_the_owner_see_every_option(world, shared):
    detail = world.client("operator").get(reverse("endpoint-detail", args=[shared.pk]))
    assert detail.json()["launch_options"] == {**PLACEMENT, **TUNING}
    # An operator placed tenant A's own endpoint: A sees it (and must, to resend those values unchanged on a PUT).
    mine = world.a.endpoint
    type(mine).objects.filter(pk=mine.pk).update(launch_options={"cpuset": "0-3", "max_num_seqs": 64})
    own = world.client("a_member").get(reverse("endpoint-detail", args=[mine.pk]))
    assert own.json()["launch_options"] == {"cpuset": "0-3", "max_num_seqs": 64}


def test_the_owner_still_round_trips_operator_set_options(world):
    mine = world.a.endpoint
    type(mine).objects.filter(pk=mine.pk).update(launch_options={"cpuset": "0-3"})
    client = world.client("a_admin")
    shown = client.get(reverse("endpoint-detail", args=[mine.pk])).json()["launch_options"]
    patched = client.patch(
        reverse("endpoint-detail", args=[mine.pk]), {"launch_options": {**shown, "max_num_seqs": 32}}, format="json"
    )
    assert patched.status_code == 200, patched.content
    assert patched.json()["launch_options"] == {"cpuset": "0-3", "max_num_seqs": 32}
