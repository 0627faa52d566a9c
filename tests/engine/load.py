"""Keep a real engine busy: ``streams`` threads, each sending one long streamed completion after another."""

from __future__ import annotations

import threading
import uuid

import httpx


class StreamingLoad:
    """``with StreamingLoad(url, model, streams=4): ...`` — requests run until the block ends (each thread then
    finishes or abandons its current one); ``completed`` and ``errors`` count what came back."""

    def __init__(self, url: str, model: str, *, streams: int = 4, max_tokens: int = 256):
        self.url, self.model, self.max_tokens = url.rstrip("/"), model, max_tokens
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(streams)]
        self.stop = threading.Event()
        self.completed = 0
        self.errors: list[str] = []

    def _loop(self) -> None:
        body = {"model": self.model, "max_tokens": self.max_tokens, "ignore_eos": True, "stream": True}
        with httpx.Client(timeout=httpx.Timeout(300.0, connect=10.0)) as client:
            while not self.stop.is_set():
                prompt = f"{uuid.uuid4().hex} keep the engine busy"
                try:
                    with client.stream("POST", f"{self.url}/v1/completions", json={**body, "prompt": prompt}) as r:
                        for _ in r.iter_lines():
                            if self.stop.is_set():
                                break  # closing the stream aborts the request inside the engine
                        else:
                            self.completed += r.status_code == 200
                except httpx.HTTPError as exc:
                    if not self.stop.is_set():
                        self.errors.append(f"{type(exc).__name__}: {exc}")

    def __enter__(self) -> StreamingLoad:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)
