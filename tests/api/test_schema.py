"""The OpenAPI schema is valid OpenAPI 3, documents every API v1 resource, and this API's views raise no
drf-spectacular warning. (``make schema`` runs ``spectacular --validate --fail-on-warn`` for the whole project.)"""

from django.urls import get_resolver
from drf_spectacular.drainage import GENERATOR_STATS
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.validation import validate_schema

# The views and URL prefixes of the tenants/endpoints/profiles/SLO/usage API (tests/api's subject).
OUR_FILES = [
    "tenants/api/base.py", "tenants/api/", "endpoints/api/endpoints.py", "endpoints/api/replicas.py",
    "capacity/api/profiles.py", "billing/api/slos.py", "billing/api/usage.py",
]  # fmt: skip
OUR_RESOURCES = [
    "tenants", "users", "api-keys", "reservations", "endpoints", "replicas", "hardware-profiles", "model-profiles",
    "slos", "usage", "audit", "me",
]  # fmt: skip


def _generate() -> tuple[dict, list[str]]:
    GENERATOR_STATS.reset()  # messages are de-duplicated per process: start from a clean slate
    GENERATOR_STATS.enable_trace_lineno()
    get_resolver().url_patterns  # noqa: B018 - import every URL module before generating
    schema = SchemaGenerator().get_schema(request=None, public=True)
    messages = [*GENERATOR_STATS._warn_cache, *GENERATOR_STATS._error_cache]
    GENERATOR_STATS.reset()
    return schema, messages


def test_schema_is_valid_openapi_and_lists_every_resource(db):
    schema, _ = _generate()
    validate_schema(schema)
    paths = set(schema["paths"])
    for resource in OUR_RESOURCES:
        assert f"/api/v1/{resource}/" in paths, resource
    assert "/api/v1/endpoints/{id}/scale/" in paths
    assert "/api/v1/api-keys/{id}/revoke/" in paths
    assert "apiKey" in schema["components"]["securitySchemes"]


def test_our_views_raise_no_schema_warning(db):
    _, messages = _generate()
    ours = [
        message
        for message in messages
        if any(name in message for name in OUR_FILES) or any(f"/api/v1/{r}/" in message for r in OUR_RESOURCES)
    ]
    assert not ours, "\n".join(ours)


def test_schema_and_docs_are_served(client, operator):
    client.force_login(operator)
    assert client.get("/api/schema/").status_code == 200
    assert client.get("/api/docs/").status_code == 200


def test_each_resource_has_its_own_tag_in_the_docs(db):
    schema, _ = _generate()
    tags = {
        tag for path in schema["paths"].values() for operation in path.values() for tag in operation.get("tags", [])
    }
    assert "v1" not in tags and "api" not in tags
    assert {"endpoints", "replicas", "usage", "capacity", "api-keys", "statements"} <= tags, sorted(tags)
    assert schema["paths"]["/api/v1/endpoints/"]["get"]["tags"] == ["endpoints"]
