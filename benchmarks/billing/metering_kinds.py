"""The adversarial client kinds of ``bench metering``: each sends a few requests with one tenant's key through the
proxy and says what it sent; the bench reconciles the books over them. A kind that needs the replicas to misbehave
(slow, failing, resetting streams) sets the fleet's faults for its phase and clears them after: the simulator's
own, or on the real engine a relay's (``fault_relay``), where slowness is real work instead (long prompts, a prompt
that fills the context, a low concurrency limit) and ``Fleet.work`` shortens the long answers to what two loaded
cores decode in seconds.

Every request of a kind goes out concurrently from its own connection, so a client that leaves closes its socket
as a real one would: before the response head (queued, during prefill, a cancelled non-streaming request),
mid-stream, or a few tokens before the usage chunk.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
WORDS = (
    "ledger tenant replica token prefill decode meter bucket stream usage queue shed budget invoice adapter "
    "fallback resume retry prompt answer capacity model unit books audit record charge settle cache block"
).split()


@dataclass
class Sent:
    request_id: str | None  # the response's x-request-id; None when the client left before the head
    status: int | None
    left: str = ""  # how the client left early, if it did
    error: str = ""  # the start of an error answer's body


@dataclass
class Fleet:
    """What the kinds may touch: the proxy, the shared endpoint's name and replicas, the fallback's source."""

    proxy: str
    shared: str  # model name of the endpoint every tenant shares
    primary: str  # an endpoint whose replica always fails, with the shared one as its fallback
    adapter: str  # a LoRA adapter served on the shared endpoint
    shared_replicas: list[str]  # base URLs
    scale: int = 1  # requests per kind multiplier (full mode)
    prompt_seed: str = ""
    work: float = 1.0  # multiplier of the long answers' tokens (the real engine decodes ~30 tokens/s per stream)
    context_words: int = 0  # words of a prompt that leaves only a few hundred tokens of context (0: a short one)

    def tokens(self, n: int) -> int:
        return max(1, round(n * self.work))

    def set_faults(self, urls: list[str], **settings) -> None:
        for url in urls:
            httpx.post(f"{url}/admin/faults", json=settings, timeout=10).raise_for_status()

    def clear_faults(self) -> None:
        self.set_faults(self.shared_replicas, slow_factor=1.0, error_rate=0.0, reset_after_tokens=None)


@dataclass
class Client:
    fleet: Fleet
    key: str
    tag: str  # tenant and kind, so prompts never share a prefix across phases
    rng: random.Random = field(default_factory=random.Random)
    counter: int = 0

    def text(self, words: int) -> str:
        self.counter += 1
        body = " ".join(self.rng.choice(WORDS) for _ in range(words))
        return f"{self.fleet.prompt_seed} {self.tag} #{self.counter}: {body}"

    def chat(self, model: str | None = None, *, words: int = 24, **extra) -> dict:
        return {
            "model": model or self.fleet.shared,
            "messages": [{"role": "user", "content": self.text(words)}],
            **extra,
        }

    def completion(self, model: str | None = None, *, words: int = 24, **extra) -> dict:
        return {"model": model or self.fleet.shared, "prompt": self.text(words), **extra}

    def send(
        self,
        path: str,
        body: dict,
        *,
        leave_after_s: float | None = None,
        leave_after_events: int | None = None,
    ) -> Sent:
        """One request on its own connection. ``leave_after_s``: give up waiting for the response head (or, not
        streaming, the body) after that long; ``leave_after_events``: close the stream after that many data
        events that carry tokens."""
        timeout = httpx.Timeout(60.0, read=leave_after_s) if leave_after_s else httpx.Timeout(60.0)
        headers = {"Authorization": f"Bearer {self.key}"}
        with httpx.Client(timeout=timeout) as http:
            try:
                with http.stream("POST", self.fleet.proxy + path, json=body, headers=headers) as response:
                    rid = response.headers.get("x-request-id")
                    if not body.get("stream") or response.status_code != 200:
                        response.read()
                        error = response.text[:200] if response.status_code >= 400 else ""
                        return Sent(rid, response.status_code, error=error)
                    events = 0
                    for line in response.iter_lines():
                        if leave_after_events is not None and _carries_tokens(line):
                            events += 1
                            if events >= leave_after_events:
                                return Sent(rid, response.status_code, left=f"after {events} events")
                    return Sent(rid, response.status_code)
            except httpx.ReadTimeout:
                return Sent(None, None, left=f"after {leave_after_s} s")


def _carries_tokens(line: str) -> bool:
    if not line.startswith("data: {"):
        return False
    try:
        chunk = json.loads(line[6:])
    except ValueError:
        return False
    for choice in chunk.get("choices") or []:
        if choice.get("text") or (choice.get("delta") or {}).get("content"):
            return True
    return False


def _together(calls: list[Callable[[], Sent]], *, stagger_s: float = 0.0, clients: int = 32) -> list[Sent]:
    with ThreadPoolExecutor(max(1, min(len(calls), clients))) as pool:
        futures = []
        for call in calls:
            futures.append(pool.submit(call))
            if stagger_s:
                time.sleep(stagger_s)
        return [f.result() for f in futures]


# -- the kinds -----------------------------------------------------------------------------------------------------
def non_streaming(c: Client) -> list[Sent]:
    calls = []
    for _ in range(2 * c.fleet.scale):
        calls.append(lambda: c.send(COMPLETIONS, c.completion(max_tokens=24)))
        calls.append(lambda: c.send(CHAT, c.chat(max_tokens=24)))
    return _together(calls)


def streaming(c: Client) -> list[Sent]:
    calls = []
    for _ in range(2 * c.fleet.scale):
        calls.append(lambda: c.send(CHAT, c.chat(max_tokens=40, stream=True)))
        calls.append(lambda: c.send(COMPLETIONS, c.completion(max_tokens=40, stream=True)))
    return _together(calls)


def disconnect_queued(c: Client, *, slots: int) -> list[Sent]:
    """Every replica slot taken by long streams, then more requests that wait in the proxy's queue and leave."""
    tokens = c.fleet.tokens(300)
    long = [lambda: c.send(CHAT, c.chat(max_tokens=tokens, ignore_eos=True, stream=True)) for _ in range(slots)]
    queued = [lambda: c.send(CHAT, c.chat(max_tokens=40, stream=True), leave_after_s=0.5) for _ in range(2)]
    return _together(long + queued, stagger_s=0.02)


def disconnect_prefill(c: Client) -> list[Sent]:
    """Long prompts on slowed replicas: the client leaves while the engine is still prefilling."""
    calls = [
        lambda: c.send(COMPLETIONS, c.completion(words=900, max_tokens=16, stream=True), leave_after_s=0.4)
        for _ in range(2 * c.fleet.scale)
    ]
    return _together(calls)


def disconnect_midstream(c: Client) -> list[Sent]:
    tokens, tokens_chat, tokens_completion = (c.fleet.tokens(n) for n in (240, 80, 60))
    calls = []
    for _ in range(c.fleet.scale):
        calls.append(
            lambda: c.send(
                CHAT, c.chat(max_tokens=tokens, ignore_eos=True, stream=True), leave_after_events=tokens_chat
            )
        )
        calls.append(
            lambda: c.send(
                COMPLETIONS,
                c.completion(max_tokens=tokens, ignore_eos=True, stream=True),
                leave_after_events=tokens_completion,
            )
        )
    return _together(calls)


def disconnect_before_usage(c: Client) -> list[Sent]:
    """Read all but the last few tokens of a fixed-length stream, then close: the client that hopes to be gone before
    the usage is counted."""
    tokens = c.fleet.tokens(200)
    calls = []
    for _ in range(c.fleet.scale):
        calls.append(
            lambda: c.send(
                COMPLETIONS,
                c.completion(max_tokens=tokens, ignore_eos=True, stream=True),
                leave_after_events=tokens - 5,
            )
        )
        calls.append(
            lambda: c.send(
                CHAT, c.chat(max_tokens=tokens, ignore_eos=True, stream=True), leave_after_events=tokens - 5
            )
        )
    return _together(calls)


def cancelled_non_streaming(c: Client) -> list[Sent]:
    tokens = c.fleet.tokens(400)
    calls = [
        lambda: c.send(CHAT, c.chat(max_tokens=tokens, ignore_eos=True), leave_after_s=0.6)
        for _ in range(2 * c.fleet.scale)
    ]
    return _together(calls)


def prompt_array(c: Client) -> list[Sent]:
    def body(**extra) -> dict:
        return {"model": c.fleet.shared, "prompt": [c.text(16) for _ in range(4)], **extra}

    calls = []
    for _ in range(c.fleet.scale):
        calls.append(lambda: c.send(COMPLETIONS, body(n=2, max_tokens=12, ignore_eos=True)))
        calls.append(lambda: c.send(COMPLETIONS, body(max_tokens=12, ignore_eos=True, stream=True)))
    return _together(calls)


def n_and_best_of(c: Client) -> list[Sent]:
    calls = []
    for _ in range(c.fleet.scale):
        calls.append(lambda: c.send(COMPLETIONS, c.completion(n=2, best_of=3, max_tokens=16)))
        calls.append(lambda: c.send(CHAT, c.chat(n=3, max_tokens=16, stream=True)))
    return _together(calls)


def min_tokens_ignore_eos(c: Client) -> list[Sent]:
    calls = []
    for _ in range(c.fleet.scale):
        calls.append(lambda: c.send(CHAT, c.chat(min_tokens=48, max_tokens=64, ignore_eos=True, stream=True)))
        calls.append(lambda: c.send(COMPLETIONS, c.completion(min_tokens=32, max_tokens=40)))
    return _together(calls)


def missing_max_tokens(c: Client) -> list[Sent]:
    calls = []
    for _ in range(c.fleet.scale):
        calls.append(lambda: c.send(COMPLETIONS, c.completion()))  # vLLM's default: 16
        # The rest of the context, until EOS: on the real engine a prompt that leaves a few hundred tokens of it.
        calls.append(lambda: c.send(CHAT, c.chat(words=c.fleet.context_words or 24, stream=True)))
    return _together(calls)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_invoice",
            "description": "Look up one invoice of the tenant by its number and return its lines and total.",
            "parameters": {
                "type": "object",
                "properties": {"number": {"type": "string"}, "currency": {"type": "string", "enum": ["EUR", "USD"]}},
                "required": ["number"],
            },
        },
    }
]


def chat_tools(c: Client) -> list[Sent]:
    calls = []
    for _ in range(c.fleet.scale):
        calls.append(lambda: c.send(CHAT, c.chat(tools=TOOLS, max_tokens=24)))
        calls.append(lambda: c.send(CHAT, c.chat(tools=TOOLS, tool_choice="auto", max_tokens=24, stream=True)))
    return _together(calls)


def chat_documents(c: Client) -> list[Sent]:
    def body(**extra) -> dict:
        parts = [{"type": "text", "text": c.text(20)}, {"type": "text", "text": c.text(20)}]
        documents = [{"title": "statement", "text": c.text(60)}, {"title": "contract", "text": c.text(60)}]
        return {
            "model": c.fleet.shared,
            "messages": [{"role": "user", "content": parts}],
            "documents": documents,
            **extra,
        }

    calls = []
    for _ in range(c.fleet.scale):
        calls.append(lambda: c.send(CHAT, body(max_tokens=24)))
        calls.append(lambda: c.send(CHAT, body(max_tokens=24, stream=True)))
    return _together(calls)


def lora_adapter(c: Client) -> list[Sent]:
    calls = []
    for _ in range(c.fleet.scale):
        calls.append(lambda: c.send(CHAT, c.chat(c.fleet.adapter, max_tokens=24, stream=True)))
        calls.append(lambda: c.send(COMPLETIONS, c.completion(c.fleet.adapter, max_tokens=24)))
    return _together(calls)


def fallback(c: Client) -> list[Sent]:
    calls = []
    for _ in range(c.fleet.scale):
        calls.append(lambda: c.send(CHAT, c.chat(c.fleet.primary, max_tokens=24, stream=True)))
        calls.append(lambda: c.send(COMPLETIONS, c.completion(c.fleet.primary, max_tokens=24)))
    return _together(calls)


def retry_after_fault(c: Client) -> list[Sent]:
    """One replica of the shared endpoint answers 500 before any token: the proxy retries on the other."""
    calls = []
    for _ in range(2 * c.fleet.scale):
        calls.append(lambda: c.send(COMPLETIONS, c.completion(max_tokens=16)))
        calls.append(lambda: c.send(CHAT, c.chat(max_tokens=16, stream=True)))
    return _together(calls)


def resumed_stream(c: Client) -> list[Sent]:
    """Every replica resets a stream after 20 tokens: the proxy resumes each on the other replica."""
    calls = []
    for _ in range(c.fleet.scale):
        calls.append(lambda: c.send(CHAT, c.chat(max_tokens=32, ignore_eos=True, stream=True)))
        calls.append(lambda: c.send(COMPLETIONS, c.completion(max_tokens=32, ignore_eos=True, stream=True)))
    return _together(calls)


def rate_limited(c: Client, *, burst: int) -> list[Sent]:
    """More requests at once than the tenant's requests-per-minute bucket holds: the rest are 429."""
    calls = [lambda: c.send(COMPLETIONS, c.completion(words=4, max_tokens=2)) for _ in range(burst)]
    # All at once: 32 at a time on the real engine took 28 s, and the bucket refilled as fast as they came.
    return _together(calls, clients=burst)


@dataclass(frozen=True)
class Kind:
    name: str
    send: Callable[..., list[Sent]]
    faults: dict | None = None  # faults on the shared endpoint's replicas for the phase (``Fleet.set_faults``)
    fault_first_replica_only: bool = False


def kinds(*, slots: int, burst: int) -> list[Kind]:
    """In the order the bench runs them (the rate-limit burst last: it empties the tenant's bucket)."""
    return [
        Kind("non_streaming", non_streaming),
        Kind("streaming", streaming),
        Kind("disconnect_queued", lambda c: disconnect_queued(c, slots=slots), faults={"slow_factor": 8.0}),
        Kind("disconnect_prefill", disconnect_prefill, faults={"slow_factor": 100.0}),
        Kind("disconnect_midstream", disconnect_midstream),
        Kind("disconnect_before_usage", disconnect_before_usage, faults={"slow_factor": 3.0}),
        Kind("cancelled_non_streaming", cancelled_non_streaming, faults={"slow_factor": 3.0}),
        Kind("prompt_array", prompt_array),
        Kind("n_best_of", n_and_best_of),
        Kind("min_tokens_ignore_eos", min_tokens_ignore_eos),
        Kind("missing_max_tokens", missing_max_tokens),
        Kind("chat_tools", chat_tools),
        Kind("chat_documents_parts", chat_documents),
        Kind("lora_adapter", lora_adapter),
        Kind("fallback", fallback),
        Kind("retry_after_fault", retry_after_fault, faults={"error_rate": 1.0}, fault_first_replica_only=True),
        Kind("resumed_stream", resumed_stream, faults={"reset_after_tokens": 20}),
        Kind("rate_limited", lambda c: rate_limited(c, burst=burst)),
    ]
