"""The OpenAPI schema validates with no warnings, and documents every API v1 resource."""

from pathlib import Path

import yaml
from django.core.management import call_command


def test_schema_validates_and_lists_every_resource(tmp_path: Path, db):
    out = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(out))
    schema = yaml.safe_load(out.read_text())
    paths = set(schema["paths"])
    for resource in (
        "tenants", "users", "api-keys", "reservations", "endpoints", "replicas", "hardware-profiles",
        "model-profiles", "slos", "usage", "audit", "me",
    ):  # fmt: skip
        assert f"/api/v1/{resource}/" in paths, resource
    assert "/api/v1/endpoints/{id}/scale/" in paths
    assert "/api/v1/api-keys/{id}/revoke/" in paths
    assert "apiKey" in schema["components"]["securitySchemes"]


def test_schema_and_docs_are_served(client, operator):
    client.force_login(operator)
    assert client.get("/api/schema/").status_code == 200
    assert client.get("/api/docs/").status_code == 200
