"""The performance model of one vLLM engine, shared by the real-time HTTP replica and the discrete-event runner.

The engine has no clock of its own: callers pass ``now`` (seconds on whatever clock they run) and drive it
in *plans* (one scheduler decision followed by one or more model steps):

    plan = engine.plan(now, max_steps)      # schedule waiting → running, choose how many steps to run
    ... the caller lets plan.duration(k) seconds pass ...
    done = engine.commit(plan, k, now)       # k ≤ plan.steps steps happened; returns finished sequences

Model (vLLM V1 in outline):
- continuous batching up to ``max_num_seqs``; the waiting queue is ordered by (priority, arrival) under the
  ``priority`` policy (lower value first, as vLLM) or by arrival under ``fcfs``; head-of-line blocking;
- chunked prefill under vLLM's token budget: a step gives each decoding sequence one token of
  ``max_num_batched_tokens`` and the rest to prompts (partial prefills first, then newly admitted ones, a long
  prompt split over several steps); such a step costs ``decode(batch) + overhead + prompt_tokens / prefill_rate``
  and yields the first token of every prompt it completes. Prefix-cache hits (``kvcache.KVCache``) cost no
  prefill time;
- KV blocks of ``profile.block_size`` tokens are allocated per scheduled chunk, as vLLM's ``allocate_slots``:
  admission needs the prefix hits plus the first chunk's blocks, each later chunk takes its own; a full prompt
  block is registered in the prefix cache as soon as it is allocated, so a request scheduled after it (an
  ``n > 1`` sibling included) hits it. Callers give prompt hashes on the 16-token grain of ``tokens.block_hashes``;
  the engine keeps every (block_size / 16)-th, the chained hash of its whole block;
- prefix-cache queries and hits are counted as vLLM counts them: at a request's first admission, queries +=
  its tokens, hits += its cached tokens (re-admissions after a preemption are not counted);
- a pure decode step costs ``t0 + per_seq·batch + per_ctx_token·context_tokens`` and produces one token per
  running sequence. The discrete-event runner asks for many decode steps at once (a batch of steps with a
  fixed running set, up to the next finish), so it never handles individual tokens;
- full blocks of generated text are cached too when a sequence leaves (give it ``prompt_tail``), so a chat's
  next turn hits the previous answer as well as the previous prompt (all but the last sampled token, whose KV
  is never computed);
- a step whose batch holds a LoRA request costs ``lora.step_factor`` times more (``lora_overhead``; docs/lora.md);
- a sequence grows a block every ``block_size`` tokens; when blocks run out, the running sequence with the
  largest (priority, arrival) is preempted (recompute: its blocks are freed, it goes back to the waiting queue
  and later prefills prompt + generated tokens again, usually hitting its own cached prefix).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

from capacity.hardware.profiles import EngineProfile
from simulator.adapter_slots import step_factor
from simulator.kvcache import KVCache
from simulator.tokens import BLOCK_SIZE_TOKENS, block_hashes, output_text

WAITING, PREFILLING, RUNNING, FINISHED = "waiting", "prefilling", "running", "finished"


@dataclass(eq=False)
class Sequence:
    """One request inside the engine. Times are on the caller's clock."""

    request_id: str
    prompt_tokens: int
    max_tokens: int  # tokens it generates (the caller drew its length: EOS, a stop string or max_tokens)
    block_hashes: list[int]  # the prompt's full 16-token blocks (``tokens.block_hashes``)
    priority: int = 0
    arrival_s: float = 0.0
    stop_reason: str = "length"  # finish_reason when max_tokens is reached ("stop" for a natural end)
    tag: object = None  # caller's handle (the HTTP stream, the DES request)
    # Set both to cache the full blocks of generated text too (``tokens.partial_block(prompt)``, vLLM's cache_salt):
    # a follow-up prompt that repeats this answer (a chat's next turn) then hits them.
    prompt_tail: str | None = None
    cache_salt: str | None = None
    adapter: str | None = None  # the LoRA adapter it names (None: the base model)
    lora_rank: int = 0  # that adapter's rank: the step overhead (``lora.step_factor``)
    # A KV connector's offer (docs/disaggregation.md): prompt tokens whose KV it can load at admission (None: the
    # engine has no connector). What it did load beyond the local hit is ``external_hit``; those tokens cost
    # blocks but no prefill time, as vLLM injects them into the paged memory before the step.
    external_tokens: int | None = None
    external_hit: int = 0
    # progress
    state: str = WAITING
    cached_tokens: int = 0  # prefix-cache hit at first scheduling (usage.prompt_tokens_details.cached_tokens)
    created_cache_tokens: int = 0  # prompt tokens its first prefill wrote to the cache (created_cache_tokens)
    held_hashed: list[int] = field(default_factory=list)
    held_anon: int = 0
    held_blocks: int = 0  # len(held_hashed) + held_anon, kept in step for speed
    scheduled_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    finish_reason: str | None = None
    preemptions: int = 0
    order: int = 0
    # While running, tokens are counted lazily: generated = _gen + (engine tick − _tick_base), so a decode step
    # costs the engine O(1) instead of a pass over the batch.
    _gen: int = field(default=0, repr=False)
    _tick_base: int = field(default=0, repr=False)
    _cell: list = field(default=None, repr=False)
    _run: int = field(default=0, repr=False)  # bumped at every (re)admission: invalidates old heap entries
    prefill_left: int = field(default=0, repr=False)  # uncached prompt tokens still to prefill (chunked prefill)
    kv_hashes: list[int] = field(default_factory=list, repr=False)  # block_hashes on the engine's block size
    hashed_upto: int = field(default=0, repr=False)  # blocks whose cache registration is settled

    @property
    def generated(self) -> int:
        if self.state == RUNNING:
            return self._gen + self._cell[0] - self._tick_base
        return self._gen

    @property
    def remaining(self) -> int:
        return self.max_tokens - self.generated


@dataclass
class Plan:
    """What the engine will do next: ``steps`` model steps over ``seqs`` starting at ``start_s``."""

    start_s: float
    steps: int
    seqs: list[Sequence]
    prefill_s: float  # extra time of the first step (prefill of newly admitted sequences)
    step0_s: float  # decode cost of the first step
    ctx_slope_s: float  # per-step growth of the decode cost (context grows by one token per sequence)
    admitted: list[Sequence]  # sequences whose prefill completes in this step (their first token)
    prefill_tokens: int = 0  # prompt tokens computed in this step

    def duration(self, steps: int | None = None) -> float:
        """Time taken by the first ``steps`` steps (all of them by default)."""
        k = self.steps if steps is None else steps
        if k <= 0:
            return 0.0
        return self.prefill_s + k * self.step0_s + self.ctx_slope_s * k * (k - 1) / 2

    def steps_started_before(self, elapsed_s: float) -> int:
        """Steps already under way ``elapsed_s`` after the plan started (the one in progress included)."""
        lo, hi = 1, self.steps
        while lo < hi:  # the smallest k whose end is at or after elapsed_s
            mid = (lo + hi) // 2
            if self.duration(mid) >= elapsed_s:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def step_s(self, index: int) -> float:
        """Duration of step ``index`` (0-based)."""
        return self.duration(index + 1) - self.duration(index)


class EngineStats:
    """Counters behind vLLM's Prometheus series."""

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.prefix_queries = 0  # tokens looked up at first admissions (vllm:prefix_cache_queries)
        self.prefix_hits = 0  # of which cached (vllm:prefix_cache_hits)
        self.prompt_cached = 0  # cached tokens of the prompts counted in prompt_tokens (vllm:prompt_tokens_cached)
        self.external_queries = 0  # tokens asked of a KV connector (vllm:external_prefix_cache_queries)
        self.external_hits = 0  # of which it loaded (vllm:external_prefix_cache_hits)
        self.prompt_external = 0  # loaded tokens of the prompts counted in prompt_tokens (external_kv_transfer)
        self.preemptions = 0
        self.finished: dict[str, int] = {"stop": 0, "length": 0, "abort": 0, "error": 0}
        self.busy_s = 0.0
        self.steps = 0
        self.iteration_tokens: list[int] = []  # tokens per step since the last drain (real-time metrics)


class Engine:
    def __init__(self, profile: EngineProfile, *, scheduling_policy: str = "priority", record_iterations=False):
        if scheduling_policy not in ("fcfs", "priority"):
            raise ValueError("scheduling_policy must be 'fcfs' or 'priority'")
        if profile.block_size % BLOCK_SIZE_TOKENS:
            raise ValueError(f"block_size must be a multiple of {BLOCK_SIZE_TOKENS} tokens (the prompt hash grain)")
        self.profile = profile
        self.scheduling_policy = scheduling_policy
        self.lora_overhead = 0.0  # step-time fraction at rank 16 when a batch holds an adapter (adapter_slots.py)
        self._hash_stride = profile.block_size // BLOCK_SIZE_TOKENS
        self.kv = KVCache(profile.num_gpu_blocks, profile.block_size)
        self.running: list[Sequence] = []  # decoding (tokens counted lazily)
        self.prefilling: list[Sequence] = []  # admitted, prompt partly computed (chunked prefill)
        self._waiting: list[tuple[int, int, Sequence]] = []
        self._order = itertools.count()
        self.stats = EngineStats()
        self._record_iterations = record_iterations
        self._block = profile.block_size
        self._tick = [0]  # decode steps run so far: the clock of lazily counted tokens (Sequence.generated)
        self._ctx = 0  # prompt + generated tokens of the running set
        self._attended = 0.0  # the last schedule's Σ u·(c + u/2) (``EngineProfile.prefill_s``)
        self._finishes: list = []  # (tick at which it has generated max_tokens, order, run, seq)
        self._boundaries: list = []  # (tick at which it needs another KV block, order, run, seq)

    # -- queue -------------------------------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        """vllm:num_requests_running: decoding plus partially prefilled sequences."""
        return len(self.running) + len(self.prefilling)

    @property
    def kv_usage(self) -> float:
        return self.kv.usage

    def validate(self, prompt_tokens: int, max_tokens: int) -> None:
        limit = self.profile.max_model_len
        if prompt_tokens >= limit:
            raise ValueError(
                f"The decoder prompt (length {prompt_tokens}) is longer than the maximum model length of {limit}."
            )
        if prompt_tokens + max_tokens > limit:
            raise ValueError(
                f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum context "
                f"length is {limit} tokens and your request has {prompt_tokens} input tokens "
                f"({max_tokens} > {limit} - {prompt_tokens})."
            )

    def add(self, seq: Sequence) -> Sequence:
        self.validate(seq.prompt_tokens, seq.max_tokens)
        if seq.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        seq.order = next(self._order)
        seq.state = WAITING
        stride = self._hash_stride
        seq.kv_hashes = seq.block_hashes if stride == 1 else seq.block_hashes[stride - 1 :: stride]
        self._push_waiting(seq)
        return seq

    def _push_waiting(self, seq: Sequence) -> None:
        key = seq.priority if self.scheduling_policy == "priority" else 0
        heapq.heappush(self._waiting, (key, seq.order, seq))

    def abort(self, seq: Sequence, now: float, reason: str = "abort") -> bool:
        """Cancel a sequence (client disconnect); frees its blocks. False if it had already finished."""
        if seq.state == FINISHED:
            return False
        if seq.state == RUNNING:
            self._stop_running(seq)
        elif seq.state == PREFILLING:
            self.prefilling.remove(seq)
            self._free(seq)
        else:
            self._waiting = [item for item in self._waiting if item[2] is not seq]
            heapq.heapify(self._waiting)
        self._finish(seq, now, reason)
        return True

    def abort_all(self, now: float, reason: str = "abort") -> list[Sequence]:
        victims = list(self.running) + list(self.prefilling) + [item[2] for item in self._waiting]
        for seq in victims:
            self.abort(seq, now, reason)
        return victims

    # -- scheduling --------------------------------------------------------------------------------
    def _schedule(self, now: float) -> tuple[list[Sequence], int]:
        """One step's prefill work under vLLM's token budget: each decoding sequence takes one token, partial
        prefills continue, then waiting sequences are admitted (chunked when their prompt exceeds what is left).
        Each chunk holds the blocks it fills. Returns the sequences whose prefill completes in this step and the
        prompt tokens it computes."""
        budget = self.profile.max_num_batched_tokens - len(self.running)
        completed: list[Sequence] = []
        prefill_tokens = 0
        self._attended = 0.0  # Σ u·(c + u/2) over this step's chunks: attention's part of the prefill
        for seq in list(self.prefilling):
            if budget <= 0:
                break
            if seq.state != PREFILLING:
                continue  # preempted for an earlier chunk's blocks
            take = min(seq.prefill_left, budget)
            done = seq.prompt_tokens + seq._gen - seq.prefill_left
            if not self._hold_through(seq, done + take):
                continue
            budget -= take
            prefill_tokens += take
            self._attended += take * (done + take / 2)
            seq.prefill_left -= take
            if not seq.prefill_left:
                completed.append(seq)
        block = self._block
        # Like vLLM, the running sequences' next blocks come first: waiting ones get what is left.
        reserve = self._blocks_due(1) if self._waiting else 0
        limit = self.profile.max_num_seqs
        kv = self.kv
        while self._waiting and budget > 0 and len(self.running) + len(self.prefilling) < limit:
            seq = self._waiting[0][2]
            tokens = seq.prompt_tokens + seq._gen
            hashes = seq.kv_hashes
            # vLLM recomputes at least the last token, so a fully cached prompt still prefills one block.
            local_blocks = hit_blocks = min(kv.match(hashes), (tokens - 1) // block)
            if seq.external_tokens and seq.scheduled_s is None:
                # A connector's load (once, at the first admission): whole blocks beyond the local hit, never the
                # last token; they are allocated below like a prefill chunk's and registered, without its time.
                hit_blocks = max(local_blocks, min(seq.external_tokens, tokens - 1) // block)
            hit_tokens = hit_blocks * block
            take = min(tokens - hit_tokens, budget)
            new_blocks = -(-(hit_tokens + take) // block) - local_blocks
            if new_blocks + kv.free_among(hashes[:local_blocks]) > kv.free_blocks - reserve:
                break  # head-of-line: wait for blocks to free up
            heapq.heappop(self._waiting)
            kv.touch(hashes[:local_blocks])
            seq.held_hashed = list(hashes[:local_blocks])
            seq.held_blocks = seq.hashed_upto = local_blocks
            seq.held_anon = 0
            self._hold_through(seq, hit_tokens + take)
            if seq.scheduled_s is None:
                # vLLM counts a request's lookup once, at its first admission, never after a preemption.
                seq.scheduled_s = now
                seq.cached_tokens = hit_tokens
                seq.created_cache_tokens = max(0, len(hashes) * block - hit_tokens)
                self.stats.prefix_queries += tokens
                self.stats.prefix_hits += local_blocks * block
                if seq.external_tokens is not None:
                    seq.external_hit = hit_tokens - local_blocks * block
                    self.stats.external_queries += tokens - local_blocks * block
                    self.stats.external_hits += seq.external_hit
            budget -= take
            prefill_tokens += take
            self._attended += take * (hit_tokens + take / 2)
            seq.prefill_left = tokens - hit_tokens - take
            seq.state = PREFILLING
            self.prefilling.append(seq)
            if not seq.prefill_left:
                completed.append(seq)
        for seq in completed:
            if seq.state == PREFILLING:
                self.prefilling.remove(seq)
                self._start_running(seq)
        return [seq for seq in completed if seq.state == RUNNING], prefill_tokens

    def _hold_through(self, seq: Sequence, tokens: int) -> bool:
        """Hold the blocks of ``seq``'s first ``tokens`` tokens and register the full prompt blocks among them.

        Short of blocks, running sequences are preempted (vLLM's running queue); False when ``seq`` itself was."""
        kv, block = self.kv, self._block
        need = -(-tokens // block) - seq.held_blocks
        while need > kv.free_blocks:
            if self._preempt_one() is seq:
                return False
        if need > 0:
            kv.grow(need)
            seq.held_anon += need
            seq.held_blocks += need
        full = min(len(seq.kv_hashes), tokens // block)
        for h in seq.kv_hashes[seq.hashed_upto : full]:
            if kv.register(h):
                seq.held_hashed.append(h)
                seq.held_anon -= 1
        seq.hashed_upto = max(seq.hashed_upto, full)
        return True

    def _start_running(self, seq: Sequence) -> None:
        tick = self._tick[0]
        seq.state = RUNNING
        seq._cell = self._tick
        seq._tick_base = tick
        seq._run += 1
        self.running.append(seq)
        self._ctx += seq.prompt_tokens + seq._gen
        heapq.heappush(self._finishes, (tick + seq.max_tokens - seq._gen, seq.order, seq._run, seq))
        self._push_boundary(seq, tick)

    def _push_boundary(self, seq: Sequence, tick: int) -> None:
        """Queue the tick at which ``seq`` needs its next KV block (after its ``generated`` passes a block)."""
        # commit() holds ceil((prompt + generated − 1) / block) blocks: one more once generated reaches g*.
        g_star = seq.held_blocks * self._block - seq.prompt_tokens + 2
        generated = seq._gen + tick - seq._tick_base
        at = tick + max(1, g_star - generated)
        heapq.heappush(self._boundaries, (at, seq.order, seq._run, seq))

    def _stop_running(self, seq: Sequence) -> None:
        """Leave the running set (finish, preemption, abort): freeze the token count, free the blocks."""
        generated = seq.generated
        self.running.remove(seq)
        self._ctx -= seq.prompt_tokens + generated
        seq._gen = generated
        seq.state = WAITING  # callers set the final state
        self._free(seq)

    def _preempt_one(self) -> Sequence:
        victim = max(self.running + self.prefilling, key=lambda s: (s.priority, s.order))
        if victim.state == PREFILLING:
            self.prefilling.remove(victim)
            victim.state = WAITING
            self._free(victim)
        else:
            self._stop_running(victim)
        victim.preemptions += 1
        self.stats.preemptions += 1
        self._push_waiting(victim)
        return victim

    def _free(self, seq: Sequence) -> None:
        output_hashes = ()
        if seq.prompt_tail is not None and seq._gen > 1 and seq.held_anon:
            # The full blocks of prompt + output whose KV was computed: all but the last sampled token.
            parent = seq.block_hashes[-1] if seq.block_hashes else None
            text = seq.prompt_tail + output_text(0, seq._gen - 1)
            grain = seq.block_hashes + block_hashes(text, salt=seq.cache_salt, parent=parent)
            stride = self._hash_stride
            output_hashes = grain[stride - 1 :: stride][len(seq.kv_hashes) :]
        self.kv.release(seq.held_hashed, seq.held_anon, output_hashes)
        seq.held_hashed = []
        seq.held_anon = 0
        seq.held_blocks = 0
        seq.hashed_upto = 0

    def _growth(self, steps: int) -> int:
        """Blocks the running set needs for ``steps`` more decode steps (exact; O(batch))."""
        need = 0
        block = self._block
        for seq in self.running:
            extra = -(-(seq.prompt_tokens + seq.generated + steps - 1) // block) - seq.held_blocks
            if extra > 0:
                need += extra
        return need

    def _max_steps_within(self, free: int, steps: int) -> int:
        """The most steps (≤ ``steps``) whose block growth fits in ``free`` blocks; 0 if not even one."""
        batch = len(self.running)
        per_block = -(-steps // self._block)
        if batch * per_block <= free:  # each sequence grows at most one block per block_size steps
            return steps
        if free >= batch:
            return min(steps, self._block * (free // batch))
        lo, hi = 0, min(steps, self._block)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._growth(mid) <= free:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _blocks_due(self, steps: int) -> int:
        """Running sequences that cross a block boundary within ``steps`` steps (a pruned walk of the heap)."""
        heap, limit, count = self._boundaries, self._tick[0] + steps, 0
        stack = [0] if heap else []
        while stack:
            i = stack.pop()
            at, _, run, seq = heap[i]
            if at > limit:
                continue  # heap order: nothing below is due either
            if seq.state == RUNNING and run == seq._run:
                count += 1
            for child in (2 * i + 1, 2 * i + 2):
                if child < len(heap):
                    stack.append(child)
        return count

    def _next_finish_tick(self) -> int:
        finishes = self._finishes
        while finishes:
            _, _, run, seq = finishes[0]
            if seq.state == RUNNING and run == seq._run:
                return finishes[0][0]
            heapq.heappop(finishes)
        raise RuntimeError("no running sequence")

    def plan(self, now: float, max_steps: int = 1) -> Plan | None:
        """Schedule and decide the next steps; None when there is nothing to run."""
        profile = self.profile
        old_batch, old_ctx = len(self.running), self._ctx
        admitted, prefill_tokens = self._schedule(now)
        if not self.running and not prefill_tokens:
            return None
        if prefill_tokens:
            # The prefill step: the sequences already running also decode one token in it.
            if self._max_steps_within(self.kv.free_blocks, 1) < 1:
                while self._max_steps_within(self.kv.free_blocks, 1) < 1:
                    self._preempt_one()
                new = {id(s) for s in admitted}
                old = [s for s in self.running if id(s) not in new]
                old_batch, old_ctx = len(old), sum(s.prompt_tokens + s.generated for s in old)
            step0 = profile.decode_step_s(old_batch, old_ctx) if old_batch else profile.decode_t0_s
            prefill = profile.prefill_s(prefill_tokens, self._attended)
            factor = self._lora_factor()
            return Plan(now, 1, list(self.running), prefill * factor, step0 * factor, 0.0, admitted, prefill_tokens)
        while True:
            steps = min(max_steps, self._next_finish_tick() - self._tick[0])
            steps = self._max_steps_within(self.kv.free_blocks, steps)
            if steps >= 1:
                break
            self._preempt_one()
            if not self.running:
                return None
        batch = len(self.running)
        factor = self._lora_factor()
        step0 = profile.decode_step_s(batch, self._ctx) * factor
        return Plan(now, steps, list(self.running), 0.0, step0, profile.decode_per_ctx_token_s * batch * factor, [])

    def _lora_factor(self) -> float:
        """The LoRA overhead of the batch about to run (1.0 without adapters or overhead)."""
        if not self.lora_overhead:
            return 1.0
        return step_factor((s.lora_rank for s in itertools.chain(self.running, self.prefilling)), self.lora_overhead)

    def commit(self, plan: Plan, steps: int, now: float) -> list[Sequence]:
        """Apply ``steps`` completed steps of ``plan`` ending at ``now``; returns the sequences that finished."""
        if steps <= 0:
            return []
        for seq in plan.admitted:
            if seq.state == RUNNING and seq.first_token_s is None:
                seq.first_token_s = plan.start_s + plan.duration(1)
                # vLLM counts a prompt when its first token comes out (the output processor's prefill stats), so
                # a request aborted while queued or during its prefill adds nothing to vllm:prompt_tokens_total.
                self.stats.prompt_tokens += seq.prompt_tokens
                self.stats.prompt_cached += seq.cached_tokens
                self.stats.prompt_external += seq.external_hit
        batch = len(self.running)
        tick = self._tick[0] = self._tick[0] + steps
        self._ctx += batch * steps
        # KV blocks for the tokens just written, from the queue of block boundaries.
        boundaries, block, grown = self._boundaries, self._block, 0
        while boundaries and boundaries[0][0] <= tick:
            _, _, run, seq = heapq.heappop(boundaries)
            if seq.state != RUNNING or run != seq._run:
                continue
            need = -(-(seq.prompt_tokens + seq.generated - 1) // block) - seq.held_blocks
            if need > 0:
                grown += need
                seq.held_anon += need
                seq.held_blocks += need
            self._push_boundary(seq, tick)
        self.kv.grow(grown)
        finished: list[Sequence] = []
        finishes = self._finishes
        while finishes and finishes[0][0] <= tick:
            _, _, run, seq = heapq.heappop(finishes)
            if seq.state == RUNNING and run == seq._run:
                finished.append(seq)
        self.stats.generation_tokens += batch * steps
        self.stats.busy_s += plan.duration(steps)
        self.stats.steps += steps
        if self._record_iterations:
            self.stats.iteration_tokens.append(batch * steps)
        for seq in finished:
            self._stop_running(seq)
            self._finish(seq, now, seq.stop_reason)
        return finished

    def _finish(self, seq: Sequence, now: float, reason: str) -> None:
        seq.state = FINISHED
        seq.finish_s = now
        seq.finish_reason = reason
        self.stats.finished[reason] = self.stats.finished.get(reason, 0) + 1
