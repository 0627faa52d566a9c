"""Profiles and endpoints by name as well as id: names in request bodies wherever an id is taken, ``?name=`` on the
lists; another tenant's endpoint name reads exactly like a missing one."""

import pytest
from django.urls import reverse

from tests.factories import EndpointFactory, HardwareProfileFactory, ModelProfileFactory

pytestmark = pytest.mark.django_db


def test_an_endpoint_is_created_with_profile_names_and_answers_ids(world):
    model, hardware = ModelProfileFactory(name="llama-3-8b"), HardwareProfileFactory(name="l4-x1")
    payload = {"name": "chat", "model_profile": "llama-3-8b", "hardware_profile": "l4-x1", "runtime": "sim"}
    created = world.client("operator").post(reverse("endpoint-list"), payload, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["model_profile"] == model.pk and created.json()["hardware_profile"] == hardware.pk
    # Ids still work, as numbers and as strings of digits.
    moved = world.client("operator").patch(
        reverse("endpoint-detail", args=[created.json()["id"]]), {"hardware_profile": str(hardware.pk)}, format="json"
    )
    assert moved.status_code == 200, moved.content
    missing = world.client("operator").post(
        reverse("endpoint-list"), {**payload, "name": "chat-2", "model_profile": "no-such-model"}, format="json"
    )
    assert missing.status_code == 400 and missing.json()["model_profile"] == ['No object named "no-such-model".']


def test_name_filters_on_the_lists(world):
    HardwareProfileFactory(name="l4-x1")
    ModelProfileFactory(name="llama-3-8b")
    client = world.client("operator")
    for route, name in (
        ("hardware-profile-list", "l4-x1"),
        ("model-profile-list", "llama-3-8b"),
        ("endpoint-list", world.a.endpoint.name),
    ):
        rows = client.get(reverse(route), {"name": name}).json()["results"]
        assert [row["name"] for row in rows] == [name], route
    # Scoped like every list: B's endpoint by name is no row for A.
    assert world.client("a_admin").get(reverse("endpoint-list"), {"name": world.b.endpoint.name}).json()["count"] == 0


def test_another_tenants_endpoint_name_reads_like_a_missing_one(world):
    client = world.client("a_admin")
    answers = {}
    for label, name in (("other tenant", world.b.endpoint.name), ("missing", "nope"), ("own", world.a.endpoint.name)):
        body = {"name": "avail", "endpoint": name, "sli": "availability", "objective": 0.99}
        response = client.post(reverse("slo-list"), body, format="json")
        answers[label] = (response.status_code, response.json().get("endpoint"))
    assert answers["other tenant"] == (400, [f'No object named "{world.b.endpoint.name}".'])
    assert answers["missing"] == (400, ['No object named "nope".'])
    assert answers["own"][0] == 201 and answers["own"][1] == world.a.endpoint.pk
    # Operators see every endpoint: a shared one by name takes a reservation.
    shared = EndpointFactory(name="shared-chat")
    sold = world.client("operator").post(
        reverse("reservation-list"),
        {"tenant": world.a.tenant.pk, "endpoint": shared.name, "mu_per_min": 10},
        format="json",
    )
    assert sold.status_code == 201, sold.content
    assert sold.json()["endpoint"] == shared.pk
