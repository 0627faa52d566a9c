"""Every API route in the project, found from the routers (not a hand-kept list): lists refuse anonymous callers
and serve every role; create endpoints answer empty or malformed payloads with 400 and field errors. A new
resource from any app is checked the day it is registered."""

import importlib

import pytest
from django.urls import reverse

APPS = ["tenants", "endpoints", "capacity", "billing"]


def _list_routes() -> list[str]:
    routes = []
    for app in APPS:
        for _, viewset, basename in importlib.import_module(f"{app}.api.urls").router.registry:
            if hasattr(viewset, "list"):
                routes.append(basename)
    return sorted(routes)


def _create_routes() -> list[tuple[str, str]]:
    routes = []
    for app in APPS:
        urls = importlib.import_module(f"{app}.api.urls")
        for prefix, viewset, basename in urls.router.registry:
            if hasattr(viewset, "create"):
                routes.append((basename, prefix))
    return sorted(routes)


def _post_views() -> list[str]:
    """Plain POST views (not router resources) without URL parameters, e.g. the capacity planner."""
    names = []
    for app in APPS:
        for pattern in importlib.import_module(f"{app}.api.urls").extra_urlpatterns:
            view = getattr(pattern.callback, "cls", None) or getattr(pattern.callback, "view_class", None)
            if view is not None and hasattr(view, "post") and not pattern.pattern.converters and pattern.name:
                names.append(pattern.name)
    return sorted(names)


CREATE_ROUTES = _create_routes()
LIST_ROUTES = _list_routes()
POST_VIEWS = _post_views()


def test_the_routers_were_found():
    names = {basename for basename, _ in CREATE_ROUTES}
    assert {"endpoint", "api-key", "reservation", "slo", "user", "tenant"} <= names


@pytest.mark.parametrize(("basename", "prefix"), CREATE_ROUTES)
def test_empty_payload_is_400_with_field_errors(world, basename, prefix):
    response = world.client("operator").post(reverse(f"{basename}-list"), {}, format="json")
    assert response.status_code == 400, response.content[:300]
    body = response.json()
    assert isinstance(body, dict) and body, body
    for field, messages in body.items():
        assert isinstance(field, str) and messages, (field, messages)


@pytest.mark.parametrize(("basename", "prefix"), CREATE_ROUTES)
def test_wrongly_typed_payload_is_400(world, basename, prefix):
    client = world.client("operator")
    url = reverse(f"{basename}-list")
    fields = list(client.options(url).json().get("actions", {}).get("POST", {}))
    for value in ({"nested": {"deep": [1, 2]}}, -(10**30), "\u0000"):
        response = client.post(url, {field: value for field in fields}, format="json")
        assert response.status_code == 400, (value, response.content[:300])
    assert client.generic("POST", url, b"{broken", content_type="application/json").status_code == 400


@pytest.mark.parametrize("name", POST_VIEWS)
def test_plain_post_views_refuse_garbage_with_400(world, name):
    client = world.client("operator")
    url = reverse(name)
    for body in ({}, {"x": {"deep": [1]}}, [1, 2]):
        response = client.post(url, body, format="json")
        assert response.status_code == 400, (body, response.content[:300])
    assert client.generic("POST", url, b"{broken", content_type="application/json").status_code == 400


@pytest.mark.parametrize("basename", LIST_ROUTES)
def test_every_list_refuses_anonymous_and_serves_each_role(world, basename):
    url = reverse(f"{basename}-list")
    assert world.client("anonymous").get(url).status_code == 401
    for who in ("operator", "a_admin", "a_member", "a_read_key"):
        response = world.client(who).get(url)
        assert response.status_code == 200, (who, response.content[:300])


def test_api_root_links_every_resource(world):
    body = world.client("anonymous").get("/api/v1/").json()
    for _, prefix in CREATE_ROUTES:
        assert body[prefix].endswith(f"/api/v1/{prefix}/"), prefix
    assert {"usage", "replicas", "audit", "me", "schema", "docs"} <= set(body)


def _other_form(url: str) -> str:
    return url[:-1] if url.endswith("/") else url + "/"


@pytest.mark.parametrize("basename", LIST_ROUTES)
def test_every_list_answers_with_and_without_its_trailing_slash(world, basename):
    client = world.client("a_admin")
    url = reverse(f"{basename}-list")
    canonical = client.get(url)
    other = client.get(_other_form(url))
    assert other.status_code == canonical.status_code == 200, other.content[:200]
    assert other.json() == canonical.json()


@pytest.mark.parametrize("name", [*POST_VIEWS, "capacity-ledger", "me", "statement"])
def test_every_plain_view_answers_in_both_forms_and_a_post_keeps_its_body(world, name):
    client = world.client("operator")
    url = reverse(name)
    for path in (url, _other_form(url)):
        response = client.post(path, {"x": {"deep": [1]}}, format="json")
        # The body arrived (a validation error on it, or a method the view does not take), never a 404 or redirect.
        assert response.status_code in (400, 405), (path, response.status_code, response.content[:200])
        assert response["Content-Type"].startswith("application/json")


def test_a_path_that_names_nothing_is_a_json_404(world):
    for path in ("/api/v1/nothing-here/", "/api/v1/nothing-here", "/api/v1/endpoints/999999/nope"):
        response = world.client("a_admin").get(path)
        assert response.status_code == 404 and response["Content-Type"].startswith("application/json"), path
        assert "/api/v1/" in response.json()["detail"]
    detail = world.client("a_admin").get(reverse("endpoint-detail", args=[world.a.endpoint.pk]).rstrip("/"))
    assert detail.status_code == 200 and detail.json()["id"] == world.a.endpoint.pk
