"""The routing workload suite has the shapes docs/algorithms.md promises, and is the same for the same seed."""

import statistics

from benchmarks.routing import routing_suite
from capacity.hardware.profiles import get_profile
from gateway.routing import make_router
from simulator.des import Simulation
from simulator.routing_workloads import chat_sessions, mixed_lengths, prefix_groups, zipf_weights
from simulator.tokens import BLOCK_CHARS, count_tokens, distinct_text, filler_text
from simulator.workloads import poisson_times


def workload(name: str, quick: bool = False):
    return next(w for w in routing_suite.suite(quick=quick) if w.name == name)


def test_cache_pressure_fleet_holds_about_a_quarter_of_the_prefixes():
    for quick in (False, True):
        w = workload("cache_pressure", quick)
        prefix_tokens = w.shape["groups"] * w.shape["prefix_tokens"]
        fleet_kv_tokens = len(w.replicas) * w.num_gpu_blocks * get_profile(w.replicas[0]).block_size
        assert 0.2 <= fleet_kv_tokens / prefix_tokens <= 0.3
    assert (
        workload("cache_pressure").shape["groups"] == 256 and workload("cache_pressure").shape["prefix_tokens"] == 4096
    )


def test_prefix_groups_share_a_prefix_within_a_group_and_never_repeat_a_question():
    requests = list(
        prefix_groups(
            times=[0.1 * i for i in range(200)],
            groups=8,
            prefix_tokens=64,
            question_tokens=16,
            output_tokens=4,
            seed=5,
        )
    )
    by_group = {}
    for r in requests:
        by_group.setdefault(r.extra["group"], set()).add(r.prompt_parts[0])
    assert all(len(prefixes) == 1 for prefixes in by_group.values())
    assert len({p for s in by_group.values() for p in s}) == len(by_group)
    assert len({r.prompt_parts[1] for r in requests}) == len(requests)
    again = list(
        prefix_groups(
            times=[0.1 * i for i in range(200)],
            groups=8,
            prefix_tokens=64,
            question_tokens=16,
            output_tokens=4,
            seed=5,
        )
    )
    assert [r.extra["group"] for r in again] == [r.extra["group"] for r in requests]


def test_zipf_popularity_has_a_few_very_hot_prefixes():
    weights = zipf_weights(128, 1.1)
    assert 0.15 < weights[0] < 0.25 and sum(weights[:5]) > 0.4 and weights[-1] < 0.003
    groups = [
        r.extra["group"]
        for r in prefix_groups(
            times=[i * 0.01 for i in range(5000)],
            groups=128,
            prefix_tokens=16,
            question_tokens=16,
            output_tokens=4,
            zipf_s=1.1,
            seed=1,
        )
    ]
    assert abs(groups.count(0) / len(groups) - weights[0]) < 0.02


def test_chat_sessions_run_3_to_12_turns_with_think_time_and_a_growing_context():
    sim = Simulation(router=make_router("least_request", seed=1), replicas=2, profile="qwen3-32b-h100x2")
    result = sim.run(chat_sessions(times=poisson_times(2.0, count=40, seed=2), think_time_s=10.0, seed=2))
    turns: dict[str, list] = {}
    for r in result.requests:
        turns.setdefault(r.session_id, []).append(r)
    counts = [len(v) for v in turns.values()]
    assert len(turns) == 40 and min(counts) >= 3 and max(counts) <= 12 and len(set(counts)) > 4
    for session in turns.values():
        session.sort(key=lambda r: r.arrival_s)
        for earlier, later in zip(session, session[1:], strict=False):
            # The next turn carries the previous prompt and its answer: its prompt grows by at least the answer.
            assert later.prompt_tokens >= earlier.prompt_tokens + earlier.output_tokens
            assert later.arrival_s > earlier.finish_s  # after a think time
    think = [b.arrival_s - a.finish_s for s in turns.values() for a, b in zip(s, s[1:], strict=False)]
    assert 6.0 < statistics.mean(think) < 14.0  # exponential, mean 10 s
    assert result.prefix_hit_rate() > 0.5  # later turns hit the earlier turns' blocks


def test_chat_sessions_are_the_same_conversations_however_fast_they_are_served():
    """A faster fleet changes when turns arrive, never which turns there are: routers are compared on one workload."""

    def conversations(replicas: int) -> tuple[dict, float]:
        sim = Simulation(router=make_router("least_request", seed=1), replicas=replicas, profile="qwen3-32b-h100x2")
        result = sim.run(chat_sessions(times=poisson_times(20.0, count=60, seed=5), think_time_s=1.0, seed=5))
        turns: dict[str, list] = {}
        for r in sorted(result.requests, key=lambda r: r.arrival_s):
            turns.setdefault(r.session_id, []).append((r.prompt_tokens, r.max_tokens))
        return turns, statistics.mean(r.e2e_s for r in result.requests)

    slow, slow_e2e = conversations(1)
    fast, fast_e2e = conversations(4)
    assert fast_e2e < 0.8 * slow_e2e  # the two runs really were served at different speeds
    assert fast == slow


def test_mixed_lengths_are_log_normal_with_a_long_output_tail():
    requests = list(mixed_lengths(times=[i * 0.01 for i in range(4000)], seed=3))
    prompts = sorted(count_tokens(r.prompt_text) for r in requests)
    outputs = sorted(r.output_tokens for r in requests)
    assert 850 < statistics.median(prompts) < 1200
    assert 100 < statistics.median(outputs) < 160
    p99 = outputs[int(0.99 * len(outputs))]
    assert p99 > 10 * statistics.median(outputs)  # long-tailed: p99 over ten times the median
    assert statistics.mean(outputs) > 1.5 * statistics.median(outputs)


def test_mixed_lengths_prompts_are_independent_not_one_repeated():
    # Seed 5's requests 3,500-3,999 drew 138 prompts that an earlier request had sent (filler_text's offsets, through
    # CRC-32 of similar seeds): a burst of "recurring prefixes" in a workload of unique prompts.
    requests = list(mixed_lengths(times=[i * 0.001 for i in range(4500)], seed=5))
    assert len({r.prompt_text[:BLOCK_CHARS] for r in requests}) == len(requests)
    earlier = {filler_text(1024, seed=f"mixed-5-{i}")[:BLOCK_CHARS] for i in range(3500)}
    repeats = sum(filler_text(1024, seed=f"mixed-5-{i}")[:BLOCK_CHARS] in earlier for i in range(3500, 4000))
    assert repeats > 100  # what it replaced: filler_text alone repeats earlier prompts in that run


def test_distinct_text_keeps_the_length_and_differs_in_the_first_block():
    for tokens in (1, 8, 16, 17, 1024):
        a, b = distinct_text(tokens, seed="x-1"), distinct_text(tokens, seed="x-2")
        assert count_tokens(a) == count_tokens(b) == tokens
        assert a[: min(len(a), BLOCK_CHARS)] != b[: min(len(b), BLOCK_CHARS)]
    assert distinct_text(64, seed="x-1") == distinct_text(64, seed="x-1")  # deterministic
    assert distinct_text(64, seed="x-1")[BLOCK_CHARS:] == filler_text(64, seed="x-1")[BLOCK_CHARS:]


def test_heterogeneous_fleet_mixes_h100_and_a100_pairs_and_weighs_them_by_speed():
    w = workload("heterogeneous")
    assert w.replicas.count("qwen3-32b-h100x2") == 4 and w.replicas.count("qwen3-32b-a100x2") == 4
    a100 = routing_suite.replica_speed("qwen3-32b-a100x2")
    assert routing_suite.replica_speed("qwen3-32b-h100x2") == 1.0 and 0.3 < a100 < 0.8
    # The roofline's A100 pair is slower at every batch size, in decode and prefill.
    h, a = get_profile("qwen3-32b-h100x2"), get_profile("qwen3-32b-a100x2")
    assert a.decode_step_s(64, 64 * 2000) > 1.3 * h.decode_step_s(64, 64 * 2000)
    assert a.prefill_s(4096) > 2 * h.prefill_s(4096)
