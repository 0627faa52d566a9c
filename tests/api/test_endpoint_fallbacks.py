"""/api/v1/endpoints/ fallback and degradation fields: a fallback chain with a loop, past the depth bound, or
reaching an endpoint some caller may not call is a field error, as are unknown classes and a zero max_tokens cap;
a valid one is stored and reaches the proxy's snapshot."""

import pytest
from django.forms import modelform_factory
from django.urls import reverse

from endpoints.admin.core import EndpointAdminForm
from endpoints.models import Endpoint
from gateway.proxy.snapshot_loader import read_snapshot
from tests.factories import EndpointFactory

pytestmark = pytest.mark.django_db


def patch(client, endpoint, **fields):
    return client.patch(reverse("endpoint-detail", args=[endpoint.pk]), fields, format="json")


def test_a_valid_fallback_is_stored_and_reaches_the_snapshot(world):
    small = EndpointFactory(name="small-1b")
    big = EndpointFactory(name="big-70b")
    response = patch(
        world.client("operator"), big, fallback=small.pk, fallback_classes=["sheddable"], degrade_max_tokens=64
    )
    assert response.status_code == 200, response.content
    assert (response.json()["fallback"], response.json()["degrade_max_tokens"]) == (small.pk, 64)
    info = read_snapshot().endpoints_by_name["big-70b"]
    assert (info.fallback_name, info.fallback_classes, info.degrade_max_tokens) == ("small-1b", {"sheddable"}, 64)


def test_loops_depth_and_bad_values_are_field_errors(world):
    client = world.client("operator")
    a, b, c, d = (EndpointFactory(name=f"chain-{n}") for n in "abcd")
    assert patch(client, a, fallback=a.pk).json() == {"fallback": ["an endpoint cannot be its own fallback"]}
    assert patch(client, a, fallback=b.pk).status_code == 200
    loop = patch(client, b, fallback=a.pk)
    assert loop.status_code == 400 and "loop" in loop.json()["fallback"][0]
    assert patch(client, b, fallback=c.pk).status_code == 200  # a → b → c: two steps
    deep = patch(client, c, fallback=d.pk)  # a → b → c → d: three
    assert deep.status_code == 400 and "longer than 2" in deep.json()["fallback"][0]
    classes = patch(client, a, fallback_classes=["urgent"])
    assert classes.status_code == 400 and "fallback_classes" in classes.json()
    assert patch(client, a, degrade_max_tokens=0).status_code == 400


def test_a_tenant_cannot_name_another_tenants_endpoint_as_its_fallback(world):
    theirs = world.b.endpoint
    response = patch(world.client("a_admin"), world.a.endpoint, fallback=theirs.pk)
    assert response.status_code == 400 and "fallback" in response.json()
    assert str(theirs.name) not in response.content.decode()
    # nor may an operator point a shared endpoint at a tenant's own one: other tenants call the shared one
    shared = EndpointFactory(name="shared-8b")
    refused = patch(world.client("operator"), shared, fallback=theirs.pk)
    assert refused.status_code == 400 and refused.json()["fallback"] == [
        "the fallback must be a shared endpoint or one of the same owner's"
    ]


def test_the_admin_form_refuses_the_same_loops():
    a, b = EndpointFactory(name="adm-a"), EndpointFactory(name="adm-b")
    Endpoint.objects.filter(pk=b.pk).update(fallback=a)
    form_class = modelform_factory(Endpoint, form=EndpointAdminForm, fields=["fallback", "fallback_classes"])
    form = form_class(data={"fallback": b.pk, "fallback_classes": '["sheddable"]'}, instance=a)
    assert not form.is_valid() and "loop" in form.errors["fallback"][0]
    fine = form_class(data={"fallback": "", "fallback_classes": '["sheddable"]'}, instance=a)
    assert fine.is_valid(), fine.errors


def test_a_slot_share_outside_zero_to_one_is_a_field_error_and_a_valid_one_reaches_the_snapshot(world):
    client = world.client("operator")
    ep = EndpointFactory(name="shared-70b")
    for bad in (1.5, -0.1, "half", "nan"):
        response = patch(client, ep, degrade_slot_share=bad)
        assert response.status_code == 400 and list(response.json()) == ["degrade_slot_share"], response.content
    response = patch(client, ep, degrade_slot_share=0.5)
    assert response.status_code == 200 and response.json()["degrade_slot_share"] == 0.5
    assert read_snapshot().endpoints_by_name["shared-70b"].degrade_slot_share == 0.5
    assert patch(client, ep, degrade_slot_share=None).json()["degrade_slot_share"] is None
    form = modelform_factory(Endpoint, form=EndpointAdminForm, fields=["degrade_slot_share"])
    assert "degrade_slot_share" in form(data={"degrade_slot_share": "2"}, instance=ep).errors


def test_the_admin_form_refuses_a_placement_option_the_launch_would_refuse():
    ep = EndpointFactory(name="adm-placed")
    form_class = modelform_factory(
        Endpoint, form=EndpointAdminForm, fields=["launch_options", "prefill_launch_options"]
    )
    bad = form_class(
        data={
            "launch_options": '{"tolerations": [{"key": "k", "operator": "In"}]}',
            "prefill_launch_options": '{"node_selector": ["not", "a", "mapping"]}',
        },
        instance=ep,
    )
    assert not bad.is_valid()
    assert "tolerations" in bad.errors["launch_options"][0]
    assert "node_selector" in bad.errors["prefill_launch_options"][0]
    good = form_class(
        data={"launch_options": '{"node_selector": {"pool": "a100"}}', "prefill_launch_options": "{}"}, instance=ep
    )
    assert good.is_valid(), good.errors
