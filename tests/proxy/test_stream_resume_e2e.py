"""A replica that goes away mid-stream (a spot reclaim past its notice, a crash): the proxy resumes the answer on
another replica (docs/algorithms.md#stream-resumption), and the client reads one whole stream: one role chunk,
one id, every token it asked for, usage counted as one answer and no error event."""

import json
import re
import threading

import httpx
import pytest

from billing.models import UsageRecord
from endpoints.models import Replica
from tests.factories import EndpointFactory
from tests.proxy.conftest import TcpRelay, spawn_proxy, spawn_replica
from tests.proxy.helpers import METRICS_AUTH, chat_body, sse_events, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def running_on(port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    found = re.search(r"^vllm:num_requests_running\{[^}]*\} ([\d.]+)", text, re.M)
    return float(found.group(1)) if found else 0.0


class Reader(threading.Thread):
    """Streams one request through the proxy, keeping every SSE line; ``tokens`` counts content chunks so far."""

    def __init__(self, base: str, key: str, body: dict, path: str) -> None:
        super().__init__(daemon=True)
        self.base, self.key, self.body, self.path = base, key, body, path
        self.lines: list[str] = []
        self.tokens = 0
        self.status: int | None = None

    def run(self) -> None:
        headers = {"Authorization": f"Bearer {self.key}"}
        with httpx.stream("POST", self.base + self.path, json=self.body, headers=headers, timeout=60) as r:
            self.status = r.status_code
            for line in r.iter_lines():
                if not line:
                    continue
                self.lines.append(line)
                if '"content":"' in line and '"content":""' not in line or '"text":"' in line:
                    self.tokens += 1

    def events(self) -> list:
        return sse_events("\n\n".join(self.lines))


def content_of(event: dict, chat: bool) -> str:
    choice = event["choices"][0]
    return (choice.get("delta") or {}).get("content") or "" if chat else choice.get("text") or ""


def assert_one_whole_stream(reader: Reader, *, chat: bool, max_tokens: int, chunk_per_token: bool = True) -> dict:
    """``chunk_per_token``: the simulator streams each token as one chunk; real vLLM now and then two in one."""
    events = reader.events()
    assert reader.status == 200 and events[-1] == "[DONE]", events[-3:]
    chunks = events[:-1]
    assert not any("error" in e for e in chunks), [e for e in chunks if "error" in e]
    assert len({e["id"] for e in chunks}) == 1  # the continuation goes on under the first replica's id
    choices = [e for e in chunks if e["choices"]]
    if chat:
        assert sum(1 for e in choices if e["choices"][0]["delta"].get("role") == "assistant") == 1
    tokens = [e for e in choices if content_of(e, chat)]
    if chunk_per_token:
        assert len(tokens) == max_tokens  # every token asked for (ignore_eos), none twice
    else:
        assert 0.9 * max_tokens <= len(choices) - chat <= max_tokens
    assert choices[-1]["choices"][0]["finish_reason"] == "length"
    usage = chunks[-1]["usage"]
    if chunk_per_token:
        assert usage["completion_tokens"] == max_tokens
    else:  # the text streamed before the cut, as the continuing engine re-tokenized it, is part of the answer
        assert abs(usage["completion_tokens"] - max_tokens) <= 0.1 * max_tokens, usage
    return usage


def resumes(base: str, endpoint: str) -> dict[str, float]:
    text = httpx.get(base + "/metrics", headers=METRICS_AUTH).text
    pattern = rf'infercap_proxy_stream_resumes_total\{{endpoint="{endpoint}",outcome="(\w+)"\}} ([\d.]+)'
    return {outcome: float(value) for outcome, value in re.findall(pattern, text)}


def test_a_stream_cut_mid_answer_is_resumed_on_another_replica(procs, clean_redis, tenant_a):
    endpoint = EndpointFactory(name="resume-chat", owner_tenant=tenant_a.tenant)
    ports, relays = {}, {}
    for name in ("a", "b"):
        _, replica, port = spawn_replica(procs, endpoint=endpoint, name=name, speed=0.5)
        relay = relays[name] = TcpRelay("127.0.0.1", port)
        Replica.objects.filter(pk=replica.pk).update(url=f"http://127.0.0.1:{relay.port}")
        ports[name] = port
    base = spawn_proxy(procs, idle_timeout_s=5)
    key = tenant_a.raw_key
    # The same prompt answered whole, for its prompt token count.
    plain = httpx.post(
        base + "/v1/chat/completions",
        json=chat_body(endpoint.name, max_tokens=1, stream=False, content="tell me everything"),
        headers={"Authorization": f"Bearer {key}"},
    )
    prompt_tokens = plain.json()["usage"]["prompt_tokens"]

    body = chat_body(endpoint.name, max_tokens=40, content="tell me everything")
    reader = Reader(base, key, {**body, "stream_options": {"include_usage": True}}, "/v1/chat/completions")
    reader.start()
    wait_for(lambda: reader.tokens >= 8, 20, message="the stream is under way")
    serving = wait_for(lambda: next((n for n, p in ports.items() if running_on(p) >= 1), None), 10)
    relays[serving].cut()  # the replica is gone: the connection resets and no new one is accepted
    reader.join(60)
    usage = assert_one_whole_stream(reader, chat=True, max_tokens=40)
    # The streamed text moved from the continuation's prompt back to the answer (the simulator counts 4
    # characters a token, so the re-read prompt may round by a token).
    assert abs(usage["prompt_tokens"] - prompt_tokens) <= 1, (usage, prompt_tokens)
    assert resumes(base, endpoint.name).get("resumed") == 1
    survivor = next(n for n in ports if n != serving)
    record = wait_for(lambda: UsageRecord.objects.filter(endpoint=endpoint, output_tokens=40).first(), 20)
    assert record.status == "ok" and record.replica.name == survivor


def test_a_crashed_replica_s_completion_stream_is_resumed_and_n2_is_not(procs, clean_redis, tenant_a):
    endpoint = EndpointFactory(name="resume-text", owner_tenant=tenant_a.tenant)
    ports = {}
    for name in ("a", "b", "c"):
        ports[name] = spawn_replica(procs, endpoint=endpoint, name=name, speed=0.5)[2]
    base = spawn_proxy(procs, idle_timeout_s=5)
    key = tenant_a.raw_key

    def crash_the_serving_replica(reader: Reader) -> str:
        wait_for(lambda: reader.tokens >= 6, 20, message="the stream is under way")
        serving = wait_for(lambda: next((n for n, p in ports.items() if p and running_on(p) >= 1), None), 10)
        httpx.post(f"http://127.0.0.1:{ports[serving]}/admin/crash", timeout=5)
        ports[serving] = 0
        return serving

    body = {"model": endpoint.name, "prompt": "Once upon a time", "max_tokens": 30, "ignore_eos": True, "stream": True}
    reader = Reader(base, key, {**body, "stream_options": {"include_usage": True}}, "/v1/completions")
    reader.start()
    crash_the_serving_replica(reader)
    reader.join(60)
    assert_one_whole_stream(reader, chat=False, max_tokens=30)

    # Two choices cannot be resumed as one continuation: the stream ends with an error event, as before.
    reader = Reader(base, key, {**body, "n": 2}, "/v1/completions")
    reader.start()
    crash_the_serving_replica(reader)
    reader.join(60)
    events = reader.events()
    assert reader.status == 200 and events[-1] == "[DONE]" and "error" in events[-2], events[-3:]
    assert resumes(base, endpoint.name) == {"resumed": 1.0, "ended": 1.0}
    wait_for(lambda: UsageRecord.objects.filter(endpoint=endpoint, status="upstream_error").exists(), 20)
    assert json.loads(reader.lines[0][6:])["id"].startswith("cmpl-")
