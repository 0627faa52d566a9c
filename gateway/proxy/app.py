"""The proxy's ASGI application: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/embeddings``,
``GET /v1/models``, ``GET /metrics`` and vLLM's probes (``GET /health``, ``GET|POST /ping``, ``GET /version``).

This module only dispatches. A completion is ``pipeline.completion``: the stages of ``stages.py`` in order,
authenticate (the key against the in-process snapshot) → parse (body, endpoint) → price (class, MU estimate) →
limit (the tenant's token buckets) → admit (a slot on a routed replica now, or the endpoint's priority queue) →
relay (the upstream stream, one retry before the first byte) → meter (``metering.py``: one usage record, written
off the path).
"""

from __future__ import annotations

import hmac
import importlib.metadata
import json
import logging
import time

from gateway.proxy import metrics as m
from gateway.proxy.config import load_config
from gateway.proxy.errors import ProxyError, error_body, send_error, send_json
from gateway.proxy.flight import new_request_id
from gateway.proxy.pipeline import completion
from gateway.proxy.stages import authenticate
from gateway.proxy.state import get_state

log = logging.getLogger(__name__)

_ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "completions", "/v1/embeddings": "embeddings"}


async def application(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    path = scope["path"]
    method = scope["method"]
    probe = _PROBES.get(path)
    if probe is not None and method in probe[0]:
        await probe[1](send)
        return
    if path != "/metrics" and not await _state_loaded(send):
        return
    kind = _ROUTES.get(path)
    if kind is not None:
        if method != "POST":
            await _plain_error(send, 405, f"{method} is not allowed on {path}; use POST.", "method_not_allowed")
            return
        await completion(scope, receive, send, kind)
    elif path == "/v1/models" and method == "GET":
        await _models(scope, send)
    elif path == "/metrics" and method == "GET":
        await _metrics(scope, send)
    else:
        await _plain_error(send, 404, f"Unknown path {path}. {SERVED}", "not_found")


# What an OpenAI client that calls another endpoint (/v1/responses, /v1/embeddings) is told is here.
SERVED = "This proxy serves POST /v1/chat/completions, POST /v1/completions, POST /v1/embeddings and GET /v1/models."


async def _state_loaded(send) -> bool:
    """Whether this process has its configuration; if not, answer 503 with Retry-After (and say False)."""
    try:
        await get_state()
    except Exception:  # noqa: BLE001 - e.g. the database is down when this process starts
        log.exception("proxy could not load its configuration")
        rid = [(b"x-request-id", new_request_id().encode()), (b"retry-after", b"1")]
        body = error_body(
            "The proxy is starting and cannot read its configuration yet.",
            type="server_error",
            code="proxy_unavailable",
        )
        await send_json(send, 503, body, rid)
        return False
    return True


async def _health(send) -> None:
    """vLLM's ``GET /health`` (and SageMaker's ``/ping``): 200 with an empty body once this process holds its
    configuration, 503 (empty) while it cannot: what clients of vLLM's ecosystem probe before they send load."""
    try:
        await get_state()
        status = 200
    except Exception:  # noqa: BLE001 - not ready: the probe says so, the log says why
        log.exception("proxy could not load its configuration")
        status = 503
    headers = [(b"content-length", b"0"), (b"x-request-id", new_request_id().encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


async def _version(send) -> None:
    """vLLM's ``GET /version``: ``{"version": ...}``, here infercap's."""
    await send_json(send, 200, _VERSION_BODY, [(b"x-request-id", new_request_id().encode())])


def _package_version() -> str:
    try:
        return importlib.metadata.version("infercap")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


_VERSION_BODY = json.dumps({"version": _package_version()}).encode()
# Unauthenticated, like vLLM's: (methods, handler) by path. The platform's own liveness is /healthz (Django).
_PROBES = {
    "/health": (("GET",), _health),
    "/ping": (("GET", "POST"), _health),
    "/version": (("GET",), _version),
}


async def _metrics(scope, send) -> None:
    if not _metrics_allowed(_headers(scope)):
        # Not 401: an unauthenticated caller learns nothing, not even that metrics are served here.
        await _plain_error(send, 404, f"Unknown path {scope['path']}.", "not_found")
        return
    body, content_type = m.exposition()
    headers = [(b"content-type", content_type.encode()), (b"x-request-id", new_request_id().encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


_metrics_token: bytes | None = None


def _metrics_allowed(headers: dict[bytes, bytes]) -> bool:
    """``Authorization: Bearer <INFERCAP_METRICS_TOKEN>``; with no token configured nobody may scrape (fail
    closed). Read once per process; compared in constant time."""
    global _metrics_token
    if _metrics_token is None:
        _metrics_token = load_config().metrics_token.encode()
    if not _metrics_token:
        return False
    scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), _metrics_token)


async def _plain_error(send, status: int, message: str, code: str) -> None:
    rid = [(b"x-request-id", new_request_id().encode())]
    await send_json(send, status, error_body(message, type="invalid_request_error", code=code), rid)


def _headers(scope) -> dict[bytes, bytes]:
    return dict(scope["headers"])


async def _models(scope, send) -> None:
    rid_header = [(b"x-request-id", new_request_id().encode())]
    try:
        state = await get_state()
        key = authenticate(state.snapshot, _headers(scope), now=time.time())
    except ProxyError as err:
        await send_error(send, err, rid_header)
        return
    snapshot, tenant_id = state.snapshot, key.tenant_id
    data = [
        {
            "id": e.name,
            "object": "model",
            "created": e.created,
            "owned_by": "infercap",
            "root": e.model or e.name,
            "parent": None,
            "max_model_len": e.max_model_len,
        }
        for e in sorted(snapshot.endpoints_for(tenant_id), key=lambda e: e.name)
    ]
    # LoRA adapters the tenant may use, as vLLM lists them: ``parent`` names the base (here its endpoint); the
    # artifact's path, vLLM's ``root``, is the operators' and not shown.
    data += [
        {
            "id": a.name,
            "object": "model",
            "created": a.created,
            "owned_by": "infercap",
            "root": a.name,
            "parent": e.name,
            "max_model_len": e.max_model_len,
        }
        for a, e in sorted(snapshot.adapters_for(tenant_id), key=lambda found: found[0].name)
    ]
    await send_json(send, 200, json.dumps({"object": "list", "data": data}).encode(), rid_header)
