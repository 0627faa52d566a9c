"""Reservations sold over the API go through the capacity app's overcommit check, on create and on resize."""

from django.conf import settings
from django.test import override_settings
from django.urls import reverse

from tests.factories import EndpointFactory, ModelProfileFactory, ReplicaFactory


def _endpoint_with_capacity(mu_per_replica: float, ready: int):
    endpoint = EndpointFactory(
        model_profile=ModelProfileFactory(name=f"m-{mu_per_replica}", mu_per_min=mu_per_replica)
    )
    ReplicaFactory.create_batch(ready, endpoint=endpoint, state="ready")
    return endpoint


@override_settings(INFERCAP={**settings.INFERCAP, "OVERCOMMIT_LIMIT": 1.5})
def test_sale_beyond_overcommit_is_400_and_resize_too(world):
    endpoint = _endpoint_with_capacity(1000.0, ready=2)  # 2,000 MU/min, sellable up to 3,000
    client = world.client("operator")
    sell = {"tenant": world.a.tenant.pk, "endpoint": endpoint.pk, "mu_per_min": 2500}
    created = client.post(reverse("reservation-list"), sell, format="json")
    assert created.status_code == 201, created.content

    too_much = client.post(
        reverse("reservation-list"), {**sell, "tenant": world.b.tenant.pk, "mu_per_min": 600}, format="json"
    )
    assert too_much.status_code == 400
    assert "mu_per_min" in too_much.json()
    assert (
        client.post(
            reverse("reservation-list"), {**sell, "tenant": world.b.tenant.pk, "mu_per_min": 500}, format="json"
        ).status_code
        == 201
    )

    url = reverse("reservation-detail", args=[created.json()["id"]])
    assert client.patch(url, {"mu_per_min": 2600}, format="json").status_code == 400
    shrunk = client.patch(url, {"mu_per_min": 1000, "priority": "critical"}, format="json")
    assert shrunk.status_code == 200, shrunk.content
    assert (shrunk.json()["mu_per_min"], shrunk.json()["priority"]) == (1000, "critical")


def test_tenant_cannot_sell_itself_capacity(world):
    endpoint = _endpoint_with_capacity(1000.0, ready=1)
    for who in ("a_admin", "a_write_key"):
        response = world.client(who).post(
            reverse("reservation-list"),
            {"tenant": world.a.tenant.pk, "endpoint": endpoint.pk, "mu_per_min": 1},
            format="json",
        )
        assert response.status_code == 403, who
