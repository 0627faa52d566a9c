"""The engine model in virtual time: prefix caching, eviction, preemption, priority, aborts."""

import pytest

from capacity.hardware.profiles import get_profile
from simulator.engine import FINISHED, Engine, Sequence
from simulator.kvcache import KVCache
from simulator.tokens import block_hashes, count_tokens, filler_text, output_text, render_chat


def seq_for(text: str, out: int, rid: str, priority: int = 0) -> Sequence:
    return Sequence(rid, count_tokens(text), out, block_hashes(text), priority=priority)


def run_to_end(engine: Engine, now: float = 0.0, max_steps: int = 1 << 30) -> float:
    while (plan := engine.plan(now, max_steps)) is not None:
        now += plan.duration()
        engine.commit(plan, plan.steps, now)
    return now


def test_tokenizer_counts_exactly():
    assert count_tokens(filler_text(2048, seed="x")) == 2048
    assert count_tokens(output_text(0, 37)) == 37
    assert count_tokens("") == 0 and count_tokens("abcde") == 2
    assert filler_text(64, seed=1) != filler_text(64, seed=2)
    assert render_chat([{"role": "system", "content": "S"}]).startswith("<|system|>\nS\n")


def test_repeated_prefix_is_served_from_cache_and_skips_prefill():
    engine = Engine(get_profile())
    prefix = filler_text(2000, seed="system")
    cold = engine.add(seq_for(prefix + filler_text(40, seed="q1"), 8, "cold"))
    end = run_to_end(engine)
    warm = engine.add(
        Sequence("warm", cold.prompt_tokens, 8, block_hashes(prefix + filler_text(40, seed="q2")), arrival_s=end)
    )
    warm_start = end
    run_to_end(engine, end)
    assert cold.cached_tokens == 0
    assert warm.cached_tokens == 2000  # the 125 full blocks of the shared prefix
    cold_ttft = cold.first_token_s
    warm_ttft = warm.first_token_s - warm_start
    assert warm_ttft < 0.2 * cold_ttft
    assert engine.stats.prefix_hits == 2000


def test_fully_cached_prompt_still_recomputes_its_last_block():
    engine = Engine(get_profile())
    text = filler_text(64, seed="exact")  # exactly 4 blocks
    engine.add(seq_for(text, 2, "a"))
    end = run_to_end(engine)
    again = engine.add(seq_for(text, 2, "b"))
    run_to_end(engine, end)
    assert again.cached_tokens == 48


def test_lru_evicts_the_oldest_free_blocks_first():
    kv = KVCache(num_blocks=4, block_size=16)
    a, b = [1, 2], [3, 4]
    kv.acquire(a, 0)
    kv.release(a, 0)
    kv.acquire(b, 0)
    kv.release(b, 0)
    assert kv.match(a) == 2 and kv.free_blocks == 4
    kv.acquire([5], 0)  # one block: evicts a's tail block (the oldest request, its blocks freed in reverse)
    assert kv.match(a) == 1 and kv.match(b) == 2
    assert kv.usage == 0.25
    kv.acquire([6, 7], 0)  # two more: a's head block, then b's tail
    assert kv.match(a) == 0 and kv.match(b) == 1


def test_preemption_when_blocks_run_out_and_everything_still_finishes():
    engine = Engine(get_profile("tiny", num_gpu_blocks=64, max_num_seqs=8))
    seqs = [engine.add(seq_for(filler_text(100, seed=i), 300, f"s{i}")) for i in range(6)]
    run_to_end(engine, max_steps=7)
    assert engine.stats.preemptions > 0
    assert all(s.state == FINISHED and s.generated == 300 for s in seqs)
    assert engine.kv.used_blocks == 0


def test_priority_orders_the_waiting_queue():
    engine = Engine(get_profile("tiny", max_num_seqs=1))
    low = engine.add(seq_for(filler_text(20, seed="l"), 4, "low", priority=5))
    high = engine.add(seq_for(filler_text(20, seed="h"), 4, "high", priority=-1))
    run_to_end(engine)
    assert high.first_token_s < low.first_token_s


def test_fcfs_ignores_priority():
    engine = Engine(get_profile("tiny", max_num_seqs=1), scheduling_policy="fcfs")
    first = engine.add(seq_for(filler_text(20, seed="l"), 4, "first", priority=5))
    second = engine.add(seq_for(filler_text(20, seed="h"), 4, "second", priority=-1))
    run_to_end(engine)
    assert first.first_token_s < second.first_token_s


def test_abort_frees_blocks_and_counts():
    engine = Engine(get_profile("tiny"))
    seq = engine.add(seq_for(filler_text(200, seed="a"), 50, "a"))
    plan = engine.plan(0.0, 1)
    engine.commit(plan, 1, plan.duration())
    assert engine.kv.used_blocks > 0
    assert engine.abort(seq, 1.0)
    assert engine.kv.used_blocks == 0 and engine.num_running == 0
    assert engine.stats.finished["abort"] == 1
    assert not engine.abort(seq, 2.0)


def test_too_long_prompt_is_refused():
    engine = Engine(get_profile("tiny"))
    with pytest.raises(ValueError, match="maximum context length"):
        engine.add(seq_for(filler_text(1000, seed="x"), 100, "x"))


def test_unknown_profile_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown simulator profile"):
        get_profile("nope")
    with pytest.raises(ValueError, match="unknown profile fields"):
        get_profile("tiny", bogus=1)


def test_block_accounting_stays_exact_under_random_load_preemption_and_aborts():
    import random

    rng = random.Random(11)
    engine = Engine(get_profile("tiny", num_gpu_blocks=80, max_num_seqs=6))
    now, live = 0.0, []
    for step in range(400):
        if rng.random() < 0.3:
            live.append(
                engine.add(
                    seq_for(
                        filler_text(rng.randint(5, 300), seed=rng.randint(0, 9)),
                        rng.randint(1, 120),
                        f"s{step}",
                        priority=rng.randint(-1, 1),
                    )
                )
            )
        if live and rng.random() < 0.05:
            engine.abort(rng.choice(live), now)
        plan = engine.plan(now, rng.choice([1, 3, 50, 1 << 30]))
        if plan is None:
            continue
        steps = rng.randint(1, plan.steps)
        now += plan.duration(steps)
        engine.commit(plan, steps, now)
        running = engine.running
        shared = {h for s in running for h in s.held_hashed}  # prefix blocks are held once, however many hold them
        assert engine.kv.used_blocks == len(shared) + sum(s.held_anon for s in running) <= engine.kv.num_blocks
        for s in running:
            assert s.held_blocks >= -(-(s.prompt_tokens + s.generated - 1) // 16)
            assert 0 < s.generated <= s.max_tokens
    while (plan := engine.plan(now, 1 << 30)) is not None:
        now += plan.duration()
        engine.commit(plan, plan.steps, now)
    assert engine.kv.used_blocks == 0
    assert all(s.state == FINISHED for s in live)
    assert all(s.generated == s.max_tokens for s in live if s.finish_reason != "abort")
    assert engine.stats.preemptions > 0


def test_generated_blocks_are_cached_so_a_chat_follow_up_hits_the_answer_too():
    from simulator.tokens import partial_block

    engine = Engine(get_profile())
    first_prompt = filler_text(100, seed="turn-1")  # 6 full blocks + 4 tokens
    first = Sequence(
        "t1", count_tokens(first_prompt), 60, block_hashes(first_prompt), prompt_tail=partial_block(first_prompt)
    )
    engine.add(first)
    end = run_to_end(engine)
    follow_up = first_prompt + output_text(0, 60) + filler_text(20, seed="turn-2")
    second = engine.add(seq_for(follow_up, 5, "t2"))
    run_to_end(engine, end)
    # 100 + 60 tokens, of which 159 were computed (never the last sampled token's KV, as in vLLM): 9 full
    # blocks, all reusable (the answer's 3 included).
    assert second.cached_tokens == 144
    without_output_cache = Engine(get_profile())
    without_output_cache.add(seq_for(first_prompt, 60, "t1"))
    end = run_to_end(without_output_cache)
    again = without_output_cache.add(seq_for(follow_up, 5, "t2"))
    run_to_end(without_output_cache, end)
    assert again.cached_tokens == 96


def test_long_prompts_are_prefilled_in_chunks_while_others_keep_decoding():
    profile = get_profile()  # max_num_batched_tokens 2048
    engine = Engine(profile)
    runner = engine.add(seq_for(filler_text(100, seed="r"), 50, "runner"))
    now = 0.0
    plan = engine.plan(now, 1)
    now += plan.duration()
    engine.commit(plan, 1, now)
    long = engine.add(seq_for(filler_text(5000, seed="long"), 4, "long"))
    steps, gaps = 0, []
    while long.first_token_s is None:
        plan = engine.plan(now, 1)
        before = runner.generated
        now += plan.duration()
        engine.commit(plan, 1, now)
        steps += 1
        assert runner.generated == before + 1  # the running request advances in every chunked step
        gaps.append(plan.duration())
        assert engine.num_running == 2
    assert steps == 3  # 2047 + 2047 + 906 prompt tokens
    assert max(gaps) < profile.decode_step_s(1, 200) + profile.prefill_s(2048) + 1e-9
    assert long.cached_tokens == 0 and long.generated == 1


def test_a_long_prompt_holds_the_blocks_of_its_chunks_not_of_the_whole_prompt():
    engine = Engine(get_profile())  # 2,048-token prefill budget, 16-token blocks
    long = engine.add(seq_for(filler_text(5000, seed="chunks"), 4, "long"))
    now, held = 0.0, []
    while long.first_token_s is None:
        plan = engine.plan(now, 1)
        now += plan.duration()
        engine.commit(plan, 1, now)
        held.append(long.held_blocks)
    # vLLM's allocate_slots: each scheduled chunk takes the blocks it fills (2,048 then 4,096 tokens computed).
    assert held == [128, 256, 313]


def test_one_lru_free_queue_reuses_the_oldest_freed_block_even_when_it_holds_a_prefix():
    kv = KVCache(num_blocks=4, block_size=16)
    prefix = [1, 2]
    kv.acquire(prefix, 0)  # a request's two prompt blocks …
    kv.grow(2)  # … and another request's two decode blocks
    kv.release(prefix, 0)  # the prompt blocks are freed first (tail first: 2, then 1) …
    kv.release([], 2)  # … then the plain ones
    assert kv.free_blocks == 4 and kv.match(prefix) == 2
    kv.grow(1)  # one new block: the least recently freed, the prefix's tail, although plain blocks are free
    assert kv.match(prefix) == 1 and kv.evictions == 1
    kv.grow(1)
    assert kv.match(prefix) == 0


def test_prefix_counters_count_a_request_once_at_its_first_admission_as_vllm():
    engine = Engine(get_profile("tiny", num_gpu_blocks=40, max_num_seqs=4))
    seqs = [engine.add(seq_for(filler_text(150, seed=i), 200, f"s{i}")) for i in range(4)]
    run_to_end(engine, max_steps=5)
    assert engine.stats.preemptions > 0  # re-admitted requests looked the cache up again, uncounted
    assert engine.stats.prefix_queries == sum(s.prompt_tokens for s in seqs)
    assert engine.stats.prefix_hits == sum(s.cached_tokens for s in seqs)


def test_128_token_blocks_cache_whole_blocks_and_siblings_hit_the_first_ones():
    profile = get_profile("tiny-cpu")
    assert profile.block_size == 128
    engine = Engine(profile)
    text = filler_text(300, seed="cpu")
    siblings = [engine.add(seq_for(text, 2, f"n{i}")) for i in range(3)]  # an n=3 request
    end = run_to_end(engine)
    repeat = engine.add(seq_for(text, 2, "again"))
    run_to_end(engine, end)
    full_repeat = (300 - 1) // 128 * 128
    assert [s.cached_tokens for s in siblings] == [0, full_repeat, full_repeat]
    assert repeat.cached_tokens == full_repeat == 256
    # created_cache_tokens: full prompt blocks the first prefill wrote to the cache, minus what it found there.
    assert [s.created_cache_tokens for s in siblings] == [256, 0, 0] and repeat.created_cache_tokens == 0
    assert engine.stats.prefix_queries == 4 * 300 and engine.stats.prefix_hits == 3 * full_repeat


def test_block_size_must_be_a_multiple_of_the_hash_grain():
    with pytest.raises(ValueError, match="multiple of 16"):
        Engine(get_profile("tiny", block_size=24))
