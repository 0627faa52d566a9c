"""The simulated replica over HTTP: vLLM's shapes through the OpenAI client, /metrics, prefix caching, aborts."""

import threading
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from capacity.hardware.profiles import get_profile
from simulator.metrics import ITL_BUCKETS, REQUEST_BUCKETS, TTFT_BUCKETS
from simulator.server import ThreadedReplica
from simulator.tokens import count_tokens, filler_text
from tests.waiting import wait_for

DESIGN_METRICS = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:cache_config_info",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:inter_token_latency_seconds_bucket",
    "vllm:e2e_request_latency_seconds_bucket",
    "vllm:request_queue_time_seconds_bucket",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
)


@pytest.fixture
def tiny():
    with ThreadedReplica(get_profile("tiny"), speed=4.0) as replica:
        yield replica


def scrape(url: str) -> dict[str, list]:
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def value(samples, name: str, **labels) -> float:
    return next(s.value for s in samples[name] if all(s.labels.get(k) == v for k, v in labels.items()))


def test_openai_client_streams_the_exact_token_count_and_a_usage_chunk_with_cached_tokens(tiny):
    client = openai.OpenAI(base_url=f"{tiny.url}/v1", api_key="unused", max_retries=0)
    messages = [{"role": "system", "content": filler_text(512, seed="sys")}, {"role": "user", "content": "hello"}]
    usages = []
    for _ in range(2):
        stream = client.chat.completions.create(
            model="tiny",
            messages=messages,
            max_tokens=37,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        text, finish, usage, roles = "", None, None, []
        for chunk in stream:
            if chunk.choices:
                delta = chunk.choices[0].delta
                roles.append(delta.role)
                text += delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage:
                usage = chunk.usage
        assert count_tokens(text) == 37 and roles[0] == "assistant"
        assert finish == "length"
        assert usage.completion_tokens == 37 and usage.prompt_tokens == count_tokens(
            "<|system|>\n" + messages[0]["content"] + "\n<|user|>\nhello\n<|assistant|>\n"
        )
        usages.append(usage)
    assert usages[0].prompt_tokens_details.cached_tokens == 0  # vLLM 0.32 sends the details even when nothing hit
    assert usages[1].prompt_tokens_details.cached_tokens >= 512  # the system prompt's blocks, then some
    assert usages[1].prompt_tokens_details.cached_tokens % 16 == 0


def test_non_streaming_chat_and_completions_shapes(tiny):
    response = httpx.post(
        f"{tiny.url}/v1/chat/completions",
        headers={"X-Request-Id": "abc123"},
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "ignore_eos": True},
    )
    body = response.json()
    assert response.status_code == 200 and response.headers["x-request-id"] == "abc123"
    assert response.headers["content-type"] == "application/json"
    assert body["id"] == "chatcmpl-abc123" and body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert count_tokens(body["choices"][0]["message"]["content"]) == 5
    assert body["system_fingerprint"].startswith("vllm-0.32.0-")
    assert body["usage"] == {
        "prompt_tokens": body["usage"]["prompt_tokens"],
        "total_tokens": body["usage"]["prompt_tokens"] + 5,
        "completion_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 0, "created_cache_tokens": 0, "multimodal_tokens": None},
        "completion_tokens_details": None,
    }
    completion = httpx.post(
        f"{tiny.url}/v1/completions", json={"model": "tiny", "prompt": "abcd" * 10, "ignore_eos": True}
    ).json()
    assert completion["object"] == "text_completion" and completion["usage"]["completion_tokens"] == 16
    assert completion["usage"]["prompt_tokens"] == 10
    assert completion["usage"]["prompt_tokens_details"]["created_cache_tokens"] is None  # chat only, as vLLM
    response = httpx.post(
        f"{tiny.url}/v1/completions",
        json={"model": "tiny", "prompt": "x", "max_tokens": 3, "stream": True, "ignore_eos": True},
    )
    assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
    lines = response.text.split("\n\n")
    assert lines[0].startswith('data: {"id":"cmpl-') and '"usage"' not in lines[0]
    assert '"system_fingerprint":"vllm-0.32.0-' in lines[2]  # the terminal chunk, without a usage chunk
    assert lines[-2] == "data: [DONE]" and len(lines) == 5  # three chunks, [DONE], trailing ""
    models = httpx.get(f"{tiny.url}/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "tiny"
    assert models["data"][0]["max_model_len"] == 1024
    assert httpx.get(f"{tiny.url}/health").status_code == 200
    assert httpx.get(f"{tiny.url}/version").json() == {"version": "0.32.0"}


FORMAT = "Bad Request"  # a field of the wrong type: FastAPI's validation error, as vLLM answers it


@pytest.mark.parametrize(
    ("path", "payload", "status", "kind", "param"),
    [
        ("/v1/chat/completions", {"model": "tiny"}, 400, FORMAT, "body.messages"),
        (
            "/v1/chat/completions",
            {"model": "nope", "messages": [{"role": "user", "content": "x"}]},
            404,
            "NotFoundError",
            "model",
        ),
        (
            "/v1/completions",
            {"model": "tiny", "prompt": "x", "max_tokens": 5000},
            400,
            "BadRequestError",
            "max_tokens",
        ),
        ("/v1/completions", {"model": "tiny", "prompt": "abcd" * 1100}, 400, "BadRequestError", "input_tokens"),
        (
            "/v1/completions",
            {"model": "tiny", "prompt": "x", "stream_options": {"include_usage": True}},
            400,
            "BadRequestError",
            "stream_options",
        ),
        ("/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 0}, 400, "BadRequestError", "max_tokens"),
        ("/v1/completions", {"model": "tiny", "prompt": "x", "n": 0}, 400, "BadRequestError", None),
        ("/v1/completions", {"model": "tiny", "prompt": "x", "cache_salt": ""}, 400, "BadRequestError", "cache_salt"),
        ("/v1/completions", {"model": "tiny", "prompt": "x", "priority": "high"}, 400, FORMAT, "body.priority"),
        ("/v1/completions", {"model": "tiny", "prompt": 5}, 400, FORMAT, "body.prompt"),
        (
            "/v1/completions",
            {"model": "tiny", "prompt": "x", "temperature": -1},
            400,
            "BadRequestError",
            "temperature",
        ),
        ("/v1/completions", {"model": "tiny", "prompt": "x", "top_p": 0}, 400, "BadRequestError", "top_p"),
        ("/v1/completions", {"model": "tiny", "prompt": "x", "logprobs": 21}, 400, "BadRequestError", "logprobs"),
    ],
)
def test_bad_requests_get_vllms_error_shape(tiny, path, payload, status, kind, param):
    response = httpx.post(f"{tiny.url}{path}", json=payload, headers={"X-Request-Id": "bad-1"})
    assert response.status_code == status and response.headers["x-request-id"] == "bad-1"
    error = response.json()["error"]
    assert error["code"] == status and error["param"] == param and error["message"]
    assert error["type"] == kind


def test_invalid_json_unknown_routes_and_methods_answer_as_fastapi(tiny):
    response = httpx.post(f"{tiny.url}/v1/completions", content=b"{nope", headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["type"] == FORMAT and response.json()["error"]["param"] == "body.1"
    missing = httpx.get(f"{tiny.url}/no-such-route")
    assert (missing.status_code, missing.json()) == (404, {"detail": "Not Found"})
    wrong = httpx.get(f"{tiny.url}/v1/chat/completions")
    assert (wrong.status_code, wrong.json()) == (405, {"detail": "Method Not Allowed"})
    assert len(wrong.headers["x-request-id"]) == 32  # every response carries one, as vLLM's


def test_metrics_carry_every_design_name_with_vllm_buckets_and_move_under_load():
    with ThreadedReplica(get_profile("tiny", max_num_seqs=4), speed=0.5) as replica:
        idle = scrape(replica.url)
        for name in DESIGN_METRICS:
            assert name in idle, name
        info = idle["vllm:cache_config_info"][0].labels
        assert info["block_size"] == "16" and info["num_gpu_blocks"] == "96"
        assert value(idle, "vllm:num_requests_running") == 0
        for name, buckets in (
            ("vllm:time_to_first_token_seconds_bucket", TTFT_BUCKETS),
            ("vllm:inter_token_latency_seconds_bucket", ITL_BUCKETS),
            ("vllm:e2e_request_latency_seconds_bucket", REQUEST_BUCKETS),
        ):
            les = [float(s.labels["le"]) for s in idle[name] if s.labels["le"] != "+Inf"]
            assert les == [float(b) for b in buckets]
        assert all(s.labels["model_name"] == "tiny" for s in idle["vllm:num_requests_running"])

        # Six requests on four batch slots: two must wait. They are sent together (a barrier after each thread has
        # built its client), so a busy machine starting threads slowly cannot let the first four finish first.
        together = threading.Barrier(6)

        def one(i):
            with httpx.Client(timeout=30) as client:
                together.wait(10)
                client.post(
                    f"{replica.url}/v1/completions",
                    json={"model": "tiny", "prompt": filler_text(100, seed=i), "max_tokens": 150, "ignore_eos": True},
                )

        threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        peak = {"running": 0, "waiting": 0, "kv": 0.0}
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(t.is_alive() for t in threads):
            s = scrape(replica.url)
            peak["running"] = max(peak["running"], value(s, "vllm:num_requests_running"))
            peak["waiting"] = max(peak["waiting"], value(s, "vllm:num_requests_waiting"))
            peak["kv"] = max(peak["kv"], value(s, "vllm:kv_cache_usage_perc"))
            time.sleep(0.02)
        for t in threads:
            t.join(30)
        assert peak["running"] == 4 and peak["waiting"] >= 1 and peak["kv"] > 0.3
        after = scrape(replica.url)
        assert value(after, "vllm:num_requests_running") == 0 and value(after, "vllm:kv_cache_usage_perc") == 0
        assert value(after, "vllm:generation_tokens_total") == 900
        assert value(after, "vllm:prompt_tokens_total") == 600
        assert value(after, "vllm:request_success_total", finished_reason="length") == 6
        assert value(after, "vllm:time_to_first_token_seconds_count") == 6
        assert value(after, "vllm:inter_token_latency_seconds_count") == 6 * 149


def test_a_repeated_2000_token_prefix_cuts_time_to_first_token():
    # One client for every request: creating an httpx client (TLS context) costs more than a warm prefill.
    with ThreadedReplica(get_profile(), speed=1.0) as replica, httpx.Client(timeout=30) as client:
        prefix = filler_text(2000, seed="long-system-prompt")

        def ttft(suffix: str) -> tuple[float, dict]:
            started = time.perf_counter()
            with client.stream(
                "POST",
                f"{replica.url}/v1/completions",
                json={
                    "model": "llama-13b",
                    "prompt": prefix + suffix,
                    "max_tokens": 4,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                },
            ) as response:
                lines = response.iter_lines()
                first = next(line for line in lines if line.startswith("data: "))
                elapsed = time.perf_counter() - started
                usage = [line for line in lines if '"usage":{' in line]
            assert '"text":' in first
            import json

            return elapsed, json.loads(usage[-1][6:])["usage"]

        cold, cold_usage = ttft(filler_text(30, seed="q1"))
        cold_ttft_sum = value(scrape(replica.url), "vllm:time_to_first_token_seconds_sum")
        # The best of three warm requests: one stall of a busy shared machine must not decide the test.
        warm_runs = [ttft(filler_text(30, seed=f"q{i}")) for i in range(2, 5)]
        warm = min(elapsed for elapsed, _ in warm_runs)
        assert cold_usage["prompt_tokens_details"]["cached_tokens"] == 0
        assert all(usage["prompt_tokens_details"]["cached_tokens"] == 2000 for _, usage in warm_runs)
        assert cold > 0.3  # ≈ 10 ms + 2,030 tokens at 6,000 tok/s
        assert warm < 0.35 * cold
        after = scrape(replica.url)
        warm_ttft_mean = (value(after, "vllm:time_to_first_token_seconds_sum") - cold_ttft_sum) / 3
        assert warm_ttft_mean < 0.5 * cold_ttft_sum  # the replica's own view, in simulated seconds
        assert value(after, "vllm:prefix_cache_hits_total") == 3 * 2000


def test_client_disconnect_aborts_and_frees_blocks():
    with ThreadedReplica(get_profile("tiny"), speed=1.0) as replica:
        with httpx.stream(
            "POST",
            f"{replica.url}/v1/completions",
            timeout=30,
            json={
                "model": "tiny",
                "prompt": filler_text(200, seed="d"),
                "max_tokens": 800,
                "ignore_eos": True,
                "stream": True,
            },
        ) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
        with pytest.raises(httpx.ReadTimeout):  # a non-streaming request abandoned by its client
            httpx.post(
                f"{replica.url}/v1/completions",
                timeout=0.3,
                json={"model": "tiny", "prompt": filler_text(200, seed="e"), "max_tokens": 800, "ignore_eos": True},
            )
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            s = scrape(replica.url)
            if value(s, "vllm:request_success_total", finished_reason="abort") == 2:
                break
            time.sleep(0.05)
        assert value(s, "vllm:request_success_total", finished_reason="abort") == 2
        assert value(s, "vllm:num_requests_running") == 0 and value(s, "vllm:kv_cache_usage_perc") == 0
        assert replica.call(lambda: replica.server.engine.kv.used_blocks) == 0


@pytest.mark.slow
def test_priority_is_served_first_when_the_batch_is_full():
    with ThreadedReplica(get_profile("tiny", max_num_seqs=1), speed=0.25) as replica:
        finished: dict[str, float] = {}

        def send(name: str, priority: int, tokens: int):
            httpx.post(
                f"{replica.url}/v1/completions",
                timeout=30,
                json={"model": "tiny", "prompt": name, "max_tokens": tokens, "priority": priority, "ignore_eos": True},
            )
            finished[name] = time.monotonic()

        def until(running: int, waiting: int) -> None:
            # The replica's own gauges, not sleeps: on a loaded machine a thread's request can arrive late.
            wait_for(
                lambda: (
                    value(s := scrape(replica.url), "vllm:num_requests_running") >= running
                    and value(s, "vllm:num_requests_waiting") >= waiting
                ),
                timeout=10,
                interval=0.01,
                message=f"{running} running and {waiting} waiting",
            )

        # ~8 s at a quarter speed: long enough that both later requests arrive while it runs, even when a loaded
        # machine delays their threads by seconds (at ~2 s a CI run saw the blocker finish before "low" was queued).
        blocker = threading.Thread(target=send, args=("blocker", 0, 900))
        blocker.start()
        until(running=1, waiting=0)
        low = threading.Thread(target=send, args=("low", 10, 5))
        low.start()
        until(running=1, waiting=1)  # low waits behind the blocker
        high = threading.Thread(target=send, args=("high", -10, 5))
        high.start()
        for t in (blocker, low, high):
            t.join(30)
        assert finished["blocker"] < finished["high"] < finished["low"]  # both waited; high went first


def test_fail_after_tokens_ends_a_stream_with_vllms_error_event():
    from simulator.faults import Faults

    with ThreadedReplica(get_profile("tiny"), speed=4.0, faults=Faults(fail_after_tokens=3)) as replica:
        text = httpx.post(
            f"{replica.url}/v1/chat/completions",
            timeout=10,
            json={
                "model": "tiny",
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 10,
                "ignore_eos": True,
                "stream": True,
            },
        ).text
        frames = [f for f in text.split("\n\n") if f]
        assert '"role":"assistant"' in frames[0]
        assert sum('"content":" ' in f for f in frames) == 3
        assert frames[-2].startswith('data: {"error":') and frames[-1] == "data: [DONE]"
        plain = httpx.post(
            f"{replica.url}/v1/completions", timeout=10, json={"model": "tiny", "prompt": "x", "max_tokens": 10}
        )
        assert plain.status_code == 500 and plain.json()["error"]["type"] == "InternalServerError"
        assert (
            httpx.post(
                f"{replica.url}/v1/completions", timeout=10, json={"model": "tiny", "prompt": "x", "max_tokens": 2}
            ).status_code
            == 200
        )
        s = scrape(replica.url)
        assert value(s, "vllm:request_success_total", finished_reason="abort") == 2
        assert value(s, "vllm:num_requests_running") == 0


def test_priority_needs_the_priority_scheduler():
    with ThreadedReplica(get_profile("tiny"), scheduling_policy="fcfs") as replica:
        response = httpx.post(f"{replica.url}/v1/completions", json={"model": "tiny", "prompt": "x", "priority": 3})
        assert response.status_code == 400 and response.json()["error"]["param"] == "priority"
        ok = httpx.post(f"{replica.url}/v1/completions", json={"model": "tiny", "prompt": "x", "priority": 0})
        assert ok.status_code == 200


def test_templated_content_frames_equal_the_json_encoder():
    import json

    from simulator.protocol import parse_request
    from simulator.responses import chat_chunk, completion_chunk
    from simulator.serving import _content_template, _sse

    for chat in (True, False):
        body = {"messages": [{"role": "user", "content": "x"}]} if chat else {"prompt": "x"}
        parsed = parse_request(
            {**body, "stream": True},
            chat=chat,
            served_model="m",
            max_model_len=100,
            scheduling_policy="priority",
            header_request_id="r1",
        )
        for index in (0, 1):
            head, tail = _content_template(parsed, 123, index)
            for word in (" the", " GPU", "e si"):
                if chat:
                    expected = chat_chunk(parsed, 123, {"content": word}, index=index)
                else:
                    expected = completion_chunk(parsed, 123, word, index=index)
                assert head + word.encode() + tail == _sse(expected)
                assert json.loads((head + word.encode() + tail)[6:])["id"].endswith("-r1")


def test_a_chat_follow_up_reuses_the_previous_answer_from_the_cache(tiny):
    messages = [{"role": "system", "content": filler_text(200, seed="mt")}, {"role": "user", "content": "first"}]
    with httpx.Client(timeout=10) as client:
        first = client.post(
            f"{tiny.url}/v1/chat/completions",
            json={"model": "tiny", "messages": messages, "max_tokens": 64, "ignore_eos": True},
        ).json()
        answer = first["choices"][0]["message"]["content"]
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "second"}]
        second = client.post(
            f"{tiny.url}/v1/chat/completions", json={"model": "tiny", "messages": messages, "max_tokens": 4}
        ).json()
    # The answer's KV was computed for all but its last token (vLLM never computes the last sampled one).
    computed = first["usage"]["prompt_tokens"] + 64 - 1
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == computed // 16 * 16 and cached > first["usage"]["prompt_tokens"]
