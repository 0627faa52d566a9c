"""Django admin: every model has a working change list for operators; tenant users never get in; keys show prefix only."""

import pytest
from django.contrib import admin
from django.urls import reverse

from tenants.models import ApiKey
from tests.factories import ReplicaFactory, SLOFactory, UsageRecordFactory


@pytest.fixture
def operator_client(client, operator):
    client.force_login(operator)
    return client


def test_every_model_is_registered(django_user_model):
    from django.apps import apps

    ours = [m for m in apps.get_models() if m._meta.app_label in {"tenants", "endpoints", "capacity", "billing"}]
    missing = [m.__name__ for m in ours if not admin.site.is_registered(m)]
    assert not missing, f"models without an admin: {missing}"


def test_operator_opens_every_changelist_and_search(operator_client, world):
    ReplicaFactory(endpoint=world.a.endpoint)
    SLOFactory(endpoint=world.a.endpoint)
    UsageRecordFactory(tenant=world.a.tenant, endpoint=world.a.endpoint)
    for model, model_admin in admin.site._registry.items():
        url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
        response = operator_client.get(url)
        assert response.status_code == 200, url
        if model_admin.search_fields:
            assert operator_client.get(url, {"q": "a"}).status_code == 200, url


def test_tenant_admin_is_kept_out_even_if_flagged_staff(client, world):
    world.a.admin.is_staff = True
    world.a.admin.save()
    client.force_login(world.a.admin)
    response = client.get(reverse("admin:index"))
    assert response.status_code == 302 and "/login/" in response["Location"]
    assert client.get(reverse("admin:tenants_apikey_changelist")).status_code == 302


def test_api_key_pages_show_the_prefix_never_the_hash(operator_client, world):
    key = world.a.key
    listing = operator_client.get(reverse("admin:tenants_apikey_changelist")).content.decode()
    change = operator_client.get(reverse("admin:tenants_apikey_change", args=[key.pk])).content.decode()
    for page in (listing, change):
        assert key.prefix in page
        assert key.key_hash not in page
        assert world.a.raw_key not in page


def test_api_key_added_in_admin_is_hashed_and_shown_once(operator_client, world):
    response = operator_client.post(
        reverse("admin:tenants_apikey_add"),
        {"tenant": world.a.tenant.pk, "name": "from-admin", "scopes": '["inference"]', "max_priority": "standard"},
        follow=True,
    )
    assert response.status_code == 200
    key = ApiKey.objects.get(name="from-admin")
    messages = [str(m) for m in response.context["messages"]]
    shown = [m for m in messages if "copy it now" in m]
    assert len(shown) == 1
    raw = shown[0].rsplit(" ", 1)[-1]
    from tenants.keys import authenticate_api_key

    assert authenticate_api_key(raw).pk == key.pk
    assert raw not in operator_client.get(reverse("admin:tenants_apikey_change", args=[key.pk])).content.decode()


def test_revoke_action(operator_client, world):
    operator_client.post(
        reverse("admin:tenants_apikey_changelist"),
        {"action": "revoke_keys", admin.helpers.ACTION_CHECKBOX_NAME: [world.a.key.pk]},
    )
    world.a.key.refresh_from_db()
    assert world.a.key.revoked_at is not None


def test_operator_opens_every_add_and_change_page(operator_client, world):
    from django.test import RequestFactory

    ReplicaFactory(endpoint=world.a.endpoint)
    SLOFactory(endpoint=world.a.endpoint)
    UsageRecordFactory(tenant=world.a.tenant, endpoint=world.a.endpoint)
    request = RequestFactory().get("/")
    request.user = world.operator
    for model, model_admin in admin.site._registry.items():
        info = f"{model._meta.app_label}_{model._meta.model_name}"
        if model_admin.has_add_permission(request):
            assert operator_client.get(reverse(f"admin:{info}_add")).status_code == 200, info
        obj = model.objects.first()
        if obj is not None:
            assert operator_client.get(reverse(f"admin:{info}_change", args=[obj.pk])).status_code == 200, info
