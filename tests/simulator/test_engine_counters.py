"""The replica's own token counters as vLLM 0.32 keeps them (what ``bench metering`` reconciles the books against):
a prompt counts in ``vllm:prompt_tokens_total`` when its first token comes out, so a request aborted while queued
or during its prefill adds nothing; a stream whose connection is reset mid-answer (``reset_after_tokens``) keeps
the tokens it generated."""

import httpx
import pytest

from capacity.hardware.profiles import get_profile
from simulator.faults import Faults
from simulator.server import ThreadedReplica
from simulator.tokens import filler_text
from tests.simulator.test_http import scrape, value
from tests.waiting import wait_for


def _idle(url: str) -> bool:
    samples = scrape(url)
    return value(samples, "vllm:num_requests_running") == 0 and value(samples, "vllm:num_requests_waiting") == 0


def test_a_request_aborted_during_its_prefill_counts_no_prompt_tokens_and_a_finished_one_counts_its_prompt():
    with ThreadedReplica(get_profile(), speed=1.0) as replica:
        replica.server.faults.update({"slow_factor": 8.0})  # a prefill of about 2 s
        body = {"prompt": filler_text(1500, seed="aborted"), "max_tokens": 5}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{replica.url}/v1/completions", json=body, timeout=httpx.Timeout(5.0, read=0.5))
        wait_for(lambda: _idle(replica.url), timeout=10)
        aborted = scrape(replica.url)
        assert value(aborted, "vllm:request_success_total", finished_reason="abort") == 1
        assert value(aborted, "vllm:prompt_tokens_total") == 0
        assert value(aborted, "vllm:generation_tokens_total") == 0
        assert value(aborted, "vllm:prefix_cache_queries_total") > 0  # the scheduler looked it up: counted then

        replica.server.faults.update({"slow_factor": 1.0})
        body = {"prompt": filler_text(300, seed="served"), "max_tokens": 7, "ignore_eos": True}
        usage = httpx.post(f"{replica.url}/v1/completions", json=body, timeout=30).json()["usage"]
        served = scrape(replica.url)
        assert value(served, "vllm:prompt_tokens_total") == usage["prompt_tokens"]
        assert value(served, "vllm:generation_tokens_total") == usage["completion_tokens"] == 7
        by_source = {s.labels["source"]: s.value for s in served["vllm:prompt_tokens_by_source_total"]}
        assert sum(by_source.values()) == usage["prompt_tokens"]


def test_reset_after_tokens_drops_the_stream_without_done_and_the_engine_keeps_what_it_computed():
    faults = Faults(reset_after_tokens=6)
    with ThreadedReplica(get_profile("tiny"), speed=1.0, faults=faults) as replica:
        body = {"model": "tiny", "prompt": "hello there", "max_tokens": 40, "ignore_eos": True, "stream": True}
        lines = []
        with pytest.raises(httpx.HTTPError):
            with httpx.stream("POST", f"{replica.url}/v1/completions", json=body, timeout=10) as response:
                for line in response.iter_lines():
                    lines.append(line)
        events = [line for line in lines if line.startswith("data: ")]
        assert 6 <= len(events) < 40 and "data: [DONE]" not in events and not any('"error"' in e for e in events)
        wait_for(lambda: _idle(replica.url), timeout=10)
        samples = scrape(replica.url)
        assert value(samples, "vllm:request_success_total", finished_reason="abort") == 1
        assert 6 <= value(samples, "vllm:generation_tokens_total") < 40
        assert value(samples, "vllm:prompt_tokens_total") > 0


def test_reset_after_tokens_must_be_positive():
    with pytest.raises(ValueError, match="reset_after_tokens"):
        Faults(reset_after_tokens=0)
