"""Small helpers shared by the proxy's end-to-end tests."""

import json
import time

import httpx

from billing.models import UsageRecord
from tests.waiting import wait_for  # also imported from here by the end-to-end tests

# The proxy's /metrics takes a bearer token (config/settings/test.py); without it the path answers 404.
METRICS_AUTH = {"Authorization": "Bearer test-metrics-token"}


def wait_usage(count: int, timeout: float = 10.0, **filters) -> list[UsageRecord]:
    """Usage records arrive in batches off the request path; wait until ``count`` of them exist."""
    wait_for(lambda: UsageRecord.objects.filter(**filters).count() >= count, timeout)
    time.sleep(0.3)  # on purpose: a window in which an extra (duplicate) record would show up
    return list(UsageRecord.objects.filter(**filters).order_by("started_at"))


def chat_body(model: str, *, max_tokens: int = 8, stream: bool = True, content: str = "hello there", **extra) -> dict:
    """A chat request that runs to ``max_tokens`` (vLLM's ``ignore_eos``; a replica otherwise stops at EOS), so
    usage is exact and a long stream holds its slot as long as the test means it to."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": stream,
        **extra,
    }


def sse_events(raw: str) -> list:
    """Parse an SSE body into JSON objects (and the string "[DONE]")."""
    out = []
    for block in raw.split("\n\n"):
        block = block.strip()
        if not block.startswith("data: "):
            continue
        payload = block[6:]
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def post(
    base: str,
    key: str | None,
    body,
    *,
    headers: dict | None = None,
    timeout: float = 30.0,
    path: str = "/v1/chat/completions",
) -> httpx.Response:
    h = dict(headers or {})
    if key is not None:
        h["Authorization"] = f"Bearer {key}"
    if isinstance(body, (dict, list)):
        return httpx.post(base + path, json=body, headers=h, timeout=timeout)
    return httpx.post(base + path, content=body, headers={**h, "content-type": "application/json"}, timeout=timeout)


def assert_openai_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, (response.status_code, response.text)
    err = response.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert response.headers.get("x-request-id")
    return err


class Held:
    """A stream the test keeps open (holding a replica slot) until ``release``, which disconnects it."""

    def __init__(self, base, key, body):
        self.client = httpx.Client(timeout=60)
        self.cm = self.client.stream(
            "POST", base + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        )
        response = self.cm.__enter__()
        assert response.status_code == 200
        self.chunks = response.iter_raw()  # keep a reference: a collected generator closes the response
        next(self.chunks)

    def release(self):
        self.cm.__exit__(None, None, None)
        self.client.close()
