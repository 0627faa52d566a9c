"""An engine that serves the endpoint under another model name: requests must name the engine's model (vLLM answers
404 to any other), and what the client reads must name the endpoint, not the engine's model."""

from __future__ import annotations

import json


class ModelRename:
    """The rewrite for one replica whose served model name differs from its endpoint's name. Responses are
    rewritten with byte replaces of the ``"model":"<name>"`` member: inside a JSON string a quote is escaped, so
    that sequence can only be the member itself, never generated text."""

    __slots__ = ("engine", "endpoint", "_pairs")

    def __init__(self, *, engine: str, endpoint: str) -> None:
        self.engine = engine
        self.endpoint = endpoint
        pairs = {}
        # vLLM (pydantic, Starlette) writes compact JSON with raw UTF-8; the simulator's SSE escapes non-ASCII.
        for ascii_only in (False, True):
            old, new = (json.dumps(name, ensure_ascii=ascii_only).encode() for name in (engine, endpoint))
            for separator in (b":", b": "):
                pairs[b'"model"' + separator + old] = b'"model"' + separator + new
        self._pairs = tuple(pairs.items())

    def to_client(self, data: bytes) -> bytes:
        """``data`` (whole JSON documents or SSE events) with the engine's model name replaced by the endpoint's."""
        for old, new in self._pairs:
            if old in data:
                data = data.replace(old, new)
        return data


def model_rename(*, served_model_name: str, endpoint_name: str) -> ModelRename | None:
    """The rewrite a replica needs, or None when it serves the endpoint's own name (the usual case: the actuators
    launch replicas with ``--served-model-name <endpoint>``), so the request path does nothing more."""
    if not served_model_name or served_model_name == endpoint_name:
        return None
    return ModelRename(engine=served_model_name, endpoint=endpoint_name)
