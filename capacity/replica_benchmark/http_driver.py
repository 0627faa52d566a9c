"""The benchmark's load driver for a live replica over HTTP (vLLM's OpenAI-compatible ``/v1/completions``).

Closed loop: ``concurrency`` workers each send a request, wait for it to finish, send the next. Most requests are
not streamed (the client must not be the bottleneck at 100+ concurrent streams); every k-th one is, and gives
TTFT and the per-stream decode rate. Token counts come from the replica's ``usage`` (cached tokens from
``prompt_tokens_details``), never from the client's guess. Times are scaled by ``time_scale`` (a simulated
replica's speed factor) so that the figures are replica seconds.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
from collections.abc import Callable

import httpx

from capacity.replica_benchmark.sweep import BenchmarkError, Sample, Shape, output_lengths, prompt_text
from capacity.runtimes.vllm import server_problems

STREAMED_PER_LEVEL = 12  # about this many streamed probes per run, whatever the concurrency


class HttpReplicaDriver:
    name = "http"

    def __init__(
        self,
        url: str,
        *,
        model: str | None = None,
        time_scale: float = 1.0,
        request_timeout_s: float = 300.0,
        api_key: str | None = None,
    ):
        if time_scale <= 0:
            raise ValueError("time_scale must be positive")
        self.url = url.rstrip("/")
        self.time_scale = time_scale
        self.request_timeout_s = request_timeout_s
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        if not api_key:  # a replica itself (not a proxy in front of it): it must show to be a vLLM server first
            if problems := server_problems(self.url, served_model_name=model):
                raise BenchmarkError(f"{self.url} is not a vLLM server to benchmark: {'; '.join(problems)}")
        self.model = model or self._served_model()

    def for_model(self, model: str) -> HttpReplicaDriver:
        """The same replica with every request naming ``model`` (a LoRA adapter it holds: the benchmark's LoRA
        pass); no second check of the server."""
        other = copy.copy(self)
        other.model = model
        return other

    def load_adapter(self, name: str, path: str) -> None:
        """Load adapter ``name`` from ``path`` on the replica (vLLM's runtime API); one already loaded is fine."""
        try:
            response = httpx.post(
                f"{self.url}/v1/load_lora_adapter",
                json={"lora_name": name, "lora_path": path},
                headers=self.headers,
                timeout=self.request_timeout_s,
            )
        except httpx.HTTPError as exc:
            raise BenchmarkError(f"cannot load adapter {name} on {self.url}: {exc}") from exc
        if response.status_code == 400 and "already been loaded" in response.text:
            return
        if response.status_code != 200:
            raise BenchmarkError(f"loading adapter {name} answered HTTP {response.status_code}: {response.text[:200]}")

    def _served_model(self) -> str:
        try:
            response = httpx.get(f"{self.url}/v1/models", headers=self.headers, timeout=10.0)
            response.raise_for_status()
            models = response.json().get("data") or []
        except (httpx.HTTPError, ValueError) as exc:
            raise BenchmarkError(f"cannot list the models of {self.url}: {exc}") from exc
        if not models:
            raise BenchmarkError(f"{self.url} serves no model")
        return models[0]["id"]

    def run(self, shape: Shape, concurrency: int, requests: int, run_id: str) -> list[Sample]:
        stream_every = max(1, requests // STREAMED_PER_LEVEL)

        def prompt(index: int) -> str:
            return prompt_text(
                shape.input_tokens, prefix_tokens=shape.shared_prefix_tokens, run_id=run_id, index=index
            )

        return asyncio.run(
            self.closed_loop(
                concurrency=concurrency,
                outputs=output_lengths(shape, requests, run_id),
                prompt=prompt,
                streamed=lambda index: index % stream_every == 0,
            )
        )

    async def closed_loop(
        self,
        *,
        concurrency: int,
        outputs: list[int],
        prompt: Callable[[int], str | list[int]],
        streamed: Callable[[int], bool],
    ) -> list[Sample]:
        """``concurrency`` workers send requests 0, 1, … ``len(outputs) - 1`` in turn, each waiting for its request to
        finish before it takes the next: request ``i`` is ``prompt(i)`` (text or token ids) for ``outputs[i]``
        tokens, streamed when ``streamed(i)``."""
        requests = len(outputs)
        limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
        timeout = httpx.Timeout(self.request_timeout_s, connect=10.0)
        samples: list[Sample] = []
        next_index = 0
        t0 = time.perf_counter()

        def clock() -> float:
            return (time.perf_counter() - t0) * self.time_scale

        async with httpx.AsyncClient(limits=limits, timeout=timeout, headers=self.headers) as client:

            async def worker() -> None:
                nonlocal next_index
                while next_index < requests:
                    index = next_index
                    next_index += 1
                    samples.append(await self._one(client, prompt(index), outputs[index], streamed(index), clock))

            await asyncio.gather(*(worker() for _ in range(min(concurrency, requests))))
        return samples

    async def _one(
        self, client: httpx.AsyncClient, prompt: str | list[int], max_tokens: int, stream: bool, clock
    ) -> Sample:
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "ignore_eos": True,  # vLLM: generate exactly max_tokens, so shapes are what was asked for
            "temperature": 0.0,
            "stream": stream,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        start = clock()
        try:
            if stream:
                accepted, first, usage = await self._streamed(client, body, clock)
            else:
                response = await client.post(f"{self.url}/v1/completions", json=body)
                if response.status_code != 200:
                    return _failed(start, clock(), f"HTTP {response.status_code}: {response.text[:200]}")
                accepted, first, usage = None, None, response.json().get("usage") or {}
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            return _failed(start, clock(), f"{type(exc).__name__}: {exc}")
        end = clock()
        if not usage:
            return _failed(start, end, "the replica sent no usage")
        details = usage.get("prompt_tokens_details") or {}
        return Sample(
            start_s=start,
            end_s=end,
            first_token_s=first,
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            cached_tokens=int(details.get("cached_tokens") or 0),
            output_tokens=int(usage.get("completion_tokens", 0)),
            accepted_s=accepted,
        )

    async def _streamed(self, client: httpx.AsyncClient, body: dict, clock) -> tuple[float, float | None, dict]:
        """(when the headers came, when the first token came, the usage).

        Lean on purpose: on a small host the client shares a core with the replica's API server, and every
        microsecond it spends per streamed token is one the server waits for. So events are split from the raw
        bytes, and after the first token only the last event is kept, to be parsed once the stream ends: it is the
        usage (``stream_options.include_usage``) or an error event."""
        first: float | None = None
        async with client.stream("POST", f"{self.url}/v1/completions", json=body) as response:
            accepted = clock()
            if response.status_code != 200:
                await response.aread()
                raise ValueError(f"HTTP {response.status_code}: {response.text[:200]}")
            buffer, last = b"", b""
            async for raw in response.aiter_bytes():  # content-decoded (none from vLLM), not re-chunked
                buffer += raw
                *events, buffer = buffer.split(b"\n\n")
                for event in events:
                    data = event.removeprefix(b"data:").strip()
                    if not data or data == b"[DONE]":
                        continue
                    last = data
                    if first is None and any(choice.get("text") for choice in _event(data).get("choices") or []):
                        first = clock()
        chunk = _event(last) if last else {}
        return accepted, first, chunk.get("usage") or {}


def _event(data: bytes) -> dict:
    chunk = json.loads(data)
    if not isinstance(chunk, dict):
        raise ValueError(f"not an event: {data[:200]!r}")
    if "error" in chunk:
        raise ValueError(f"error event: {chunk['error']}")
    return chunk


def _failed(start: float, end: float, error: str) -> Sample:
    return Sample(start, end, None, 0, 0, 0, ok=False, error=error)
