"""Render platform/kubernetes (kustomize base and overlays) and validate every object it produces.

Rendering is ``kubectl kustomize`` (kustomize is built into kubectl; no cluster needed). Built-in kinds are
validated against the Kubernetes API's OpenAPI schemas shipped by ``kubernetes-validate`` (strict: unknown fields
fail); the Prometheus Operator's kinds against the part of their CRD schemas these manifests use.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parents[1]
KUSTOMIZE_DIR = ROOT / "platform" / "kubernetes"
OVERLAYS = ("base", "overlays/dev", "overlays/prod")
KUBERNETES_VERSION = "1.32"

_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
_METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {"name": {"type": "string"}, "namespace": {"type": "string"}, "labels": _LABELS},
}
_SELECTOR = {"type": "object", "required": ["matchLabels"], "properties": {"matchLabels": _LABELS}}
_SECRET_KEY = {
    "type": "object",
    "required": ["name", "key"],
    "properties": {"name": {"type": "string"}, "key": {"type": "string"}},
    "additionalProperties": False,
}
_SCRAPE = {
    "type": "object",
    "required": ["port"],
    "additionalProperties": False,
    "properties": {
        "port": {"type": "string"},
        "path": {"type": "string", "pattern": "^/"},
        "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
        "bearerTokenSecret": _SECRET_KEY,
    },
}
_RULE = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "record": {"type": "string"},
        "alert": {"type": "string"},
        "expr": {"type": "string"},
        "for": {"type": "string"},
        "labels": _LABELS,
        "annotations": _LABELS,
    },
    "required": ["expr"],
    "oneOf": [{"required": ["record"]}, {"required": ["alert"]}],
}


def _crd(spec: dict) -> dict:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {"apiVersion": {"const": "monitoring.coreos.com/v1"}, "metadata": _METADATA, "spec": spec},
    }


# The Prometheus Operator's CRDs (monitoring.coreos.com/v1), the fields used here, as their schemas define them.
CRD_SCHEMAS = {
    "ServiceMonitor": _crd(
        {
            "type": "object",
            "required": ["selector", "endpoints"],
            "properties": {"selector": _SELECTOR, "endpoints": {"type": "array", "minItems": 1, "items": _SCRAPE}},
        }
    ),
    "PodMonitor": _crd(
        {
            "type": "object",
            "required": ["selector", "podMetricsEndpoints"],
            "properties": {
                "selector": _SELECTOR,
                "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": _SCRAPE},
            },
        }
    ),
    "PrometheusRule": _crd(
        {
            "type": "object",
            "required": ["groups"],
            "properties": {
                "groups": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name", "rules"],
                        "properties": {
                            "name": {"type": "string"},
                            "interval": {"type": "string"},
                            "rules": {"type": "array", "items": _RULE},
                        },
                    },
                }
            },
        }
    ),
}


@dataclass
class Validation:
    objects: list[dict] = field(default_factory=list)
    invalid: list[str] = field(default_factory=list)  # "overlay kind/name: why"


def kubectl() -> str | None:
    return shutil.which("kubectl")


def render(overlay: str) -> list[dict]:
    binary = kubectl()
    if binary is None:
        raise RuntimeError("kubectl (with its built-in kustomize) is not installed")
    out = subprocess.run(
        [binary, "kustomize", str(KUSTOMIZE_DIR / overlay)], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def validate(obj: dict) -> str | None:
    """Why ``obj`` is invalid, or None."""
    schema = CRD_SCHEMAS.get(obj.get("kind"))
    try:
        if schema is not None:
            jsonschema.validate(obj, schema)
        else:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except (jsonschema.ValidationError, kubernetes_validate.ValidationError) as exc:
        return f"{exc.message[:300]} at {'/'.join(map(str, exc.path))}"
    except kubernetes_validate.SchemaNotFoundError:
        return f"no schema for {obj.get('apiVersion')} {obj.get('kind')}"
    return None


def validate_all() -> dict[str, Validation]:
    results = {}
    for overlay in OVERLAYS:
        result = Validation(objects=render(overlay))
        for obj in result.objects:
            problem = validate(obj)
            if problem:
                result.invalid.append(f"{overlay} {obj.get('kind')}/{obj['metadata'].get('name')}: {problem}")
        results[overlay] = result
    return results
