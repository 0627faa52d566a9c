"""Hostile or malformed input anywhere in the API is a 4xx with a JSON body, never a 500 or a hang."""

import pytest
from django.urls import reverse

WRITABLE = ["tenant", "user", "api-key", "reservation", "endpoint", "hardware-profile", "model-profile", "slo"]
NASTY_VALUES = [None, "x" * 5000, -1, 10**30, 1.5e308, [], {"$gt": ""}, "\u0000"]


def _all_fields(world, basename):
    body = world.client("operator").options(reverse(f"{basename}-list")).json()
    return list(body.get("actions", {}).get("POST", {}))


@pytest.mark.parametrize("basename", WRITABLE)
def test_every_field_with_nasty_values_never_500s(world, basename):
    client = world.client("operator")
    fields = _all_fields(world, basename)
    assert fields, "OPTIONS should describe the POST fields"
    for field in fields:
        for value in NASTY_VALUES:
            response = client.post(reverse(f"{basename}-list"), {field: value}, format="json")
            assert response.status_code < 500, (field, value, response.content[:300])
            assert response.headers["Content-Type"].startswith("application/json")


@pytest.mark.parametrize("basename", WRITABLE)
def test_malformed_bodies_are_400(world, basename):
    client = world.client("operator")
    url = reverse(f"{basename}-list")
    for raw, content_type in (("{not json", "application/json"), ("[1, 2]", "application/json"), ('"str"', "application/json"),
                              ('{"a": NaN}', "application/json"), ("\xff\xfe", "application/json")):  # fmt: skip
        response = client.generic("POST", url, raw.encode("latin-1"), content_type=content_type)
        assert response.status_code == 400, (raw, response.content[:300])
    assert client.generic("POST", url, b"a=b", content_type="text/plain").status_code == 415


def test_nasty_patches_on_an_endpoint_never_500(world):
    client = world.client("operator")
    url = reverse("endpoint-detail", args=[world.a.endpoint.pk])
    for field in _all_fields(world, "endpoint"):
        for value in (None, -1, 10**30, [], "\u0000"):
            response = client.patch(url, {field: value}, format="json")
            assert response.status_code < 500, (field, value, response.content[:300])


def test_bad_ids_in_urls_are_404(world):
    client = world.client("operator")
    for bad in ("abc", "-1", "99999999999999999999", "1.5"):
        response = client.get(f"/api/v1/endpoints/{bad}/")
        assert response.status_code == 404, bad
