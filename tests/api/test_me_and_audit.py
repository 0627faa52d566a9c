"""/api/v1/me/ describes the caller; /api/v1/audit/ shows each tenant only its own trail."""

from django.urls import reverse


def test_me_for_each_kind_of_principal(world):
    me = {
        who: world.client(who).get(reverse("me")).json() for who in ("operator", "a_admin", "a_member", "a_read_key")
    }
    assert me["operator"]["is_operator"] and me["operator"]["tenant"] is None and me["operator"]["can_write"]
    assert me["a_admin"]["tenant"]["id"] == world.a.tenant.pk and me["a_admin"]["can_write"]
    assert me["a_member"]["role"] == "tenant_member" and not me["a_member"]["can_write"]
    assert me["a_read_key"]["role"] == "api_key" and me["a_read_key"]["scopes"] == ["read"]
    assert not me["a_read_key"]["can_write"]
    assert world.client("anonymous").get(reverse("me")).status_code in (401, 403)


def test_audit_trail_is_tenant_scoped_and_filterable(world):
    world.client("a_admin").post(
        reverse("endpoint-scale", args=[world.a.endpoint.pk]), {"desired_replicas": 1}, format="json"
    )
    world.client("b_admin").post(
        reverse("endpoint-scale", args=[world.b.endpoint.pk]), {"desired_replicas": 1}, format="json"
    )
    a_rows = world.client("a_member").get(reverse("audit-entry-list"), {"action": "endpoint.scale"}).json()["results"]
    assert [(row["object_id"], row["actor_label"]) for row in a_rows] == [(str(world.a.endpoint.pk), "a-admin")]
    every = world.client("operator").get(reverse("audit-entry-list"), {"action": "endpoint.scale"}).json()["results"]
    assert len(every) == 2
    assert world.client("a_member").get(reverse("audit-entry-list"), {"since": "soon"}).status_code == 400
