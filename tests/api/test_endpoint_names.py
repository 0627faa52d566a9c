"""Endpoint names stay one namespace (the proxy resolves ``model`` by name), but a taken name is refused with a
message that neither says it is another tenant's endpoint nor differs from the caller's own duplicate."""

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from endpoints.services import NAME_TAKEN, endpoint_update
from tests.factories import EndpointFactory, HardwareProfileFactory, ModelProfileFactory

pytestmark = pytest.mark.django_db


def _create(client, name: str):
    payload = {
        "name": name,
        "model_profile": ModelProfileFactory().pk,
        "hardware_profile": HardwareProfileFactory().pk,
        "runtime": "sim",
    }
    return client.post(reverse("endpoint-list"), payload, format="json")


def test_a_taken_name_answers_the_same_whoever_holds_it(world):
    shared = EndpointFactory(name="shared-secret-model")
    answers = {}
    for label, name in (
        ("other tenant", world.b.endpoint.name),
        ("shared", shared.name),
        ("own", world.a.endpoint.name),
    ):
        response = _create(world.client("a_admin"), name)
        assert response.status_code == 400, response.content
        answers[label] = response.json()["name"]
    assert answers["other tenant"] == answers["shared"] == answers["own"] == [NAME_TAKEN]
    assert "exists" not in NAME_TAKEN and "endpoint" not in NAME_TAKEN.lower()


def test_renaming_onto_a_taken_name_is_refused_the_same_way(world):
    own_name = world.a.endpoint.name
    response = world.client("a_admin").patch(
        reverse("endpoint-detail", args=[world.a.endpoint.pk]), {"name": world.b.endpoint.name}, format="json"
    )
    assert response.status_code == 400 and response.json()["name"] == [NAME_TAKEN]
    with pytest.raises(ValidationError) as refused:
        endpoint_update(endpoint=world.a.endpoint, name=world.b.endpoint.name)
    assert refused.value.message_dict["name"] == [NAME_TAKEN]
    # Keeping one's own name is no collision.
    same = world.client("a_admin").patch(
        reverse("endpoint-detail", args=[world.a.endpoint.pk]), {"name": own_name}, format="json"
    )
    assert same.status_code == 200, same.content
