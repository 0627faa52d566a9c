"""The same closed-loop load on a real vLLM engine (over HTTP) and on the simulator's engine (in virtual time), and
the figures ``bench fidelity`` compares: throughput, TTFT p50/p90, TPOT p50 and prefix-cache hit rate.

Prompts are token ids (vLLM's ``/v1/completions`` takes them), so a shape's token counts and its shared prefix are
exact on both sides whatever the model's tokenizer; every request is streamed, so each one has a TTFT and a TPOT.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import os
import random
import statistics
import time
from dataclasses import dataclass

from capacity.hardware.profiles import EngineProfile
from capacity.percentiles import percentile
from capacity.replica_benchmark.http_driver import HttpReplicaDriver
from capacity.replica_benchmark.sweep import BenchmarkError, Sample, Shape, output_lengths, summarize
from simulator.engine import Engine, Sequence
from simulator.tokens import BLOCK_SIZE_TOKENS

FIRST_ID = 3  # ids 0-2 are the tiny model's BOS, EOS and padding


@dataclass(frozen=True)
class LoadPoint:
    """One closed-loop load: ``concurrency`` requests of ``shape`` in flight until ``requests`` have finished.
    With ``prefix_groups`` > 1 the shared prefix is one of that many (request i takes prefix i mod groups): a mix of
    conversations, each with its own system prompt."""

    shape: Shape
    concurrency: int
    requests: int
    prefix_groups: int = 1

    @property
    def label(self) -> str:
        groups = f"×{self.prefix_groups}g" if self.prefix_groups > 1 else ""
        return f"{self.shape.label}{groups} c{self.concurrency}"


def prompt_ids(shape: Shape, *, run_id: str, index: int, vocab_size: int, prefix_groups: int = 1) -> list[int]:
    """The token ids of request ``index`` of a run: a shared prefix (per group) and then its own tokens."""
    prefix_len = min(shape.shared_prefix_tokens, shape.input_tokens)
    shared = random.Random(f"{run_id}-prefix-{index % max(1, prefix_groups)}")
    own = random.Random(f"{run_id}-{index}")
    ids = [shared.randrange(FIRST_ID, vocab_size) for _ in range(prefix_len)]
    return ids + [own.randrange(FIRST_ID, vocab_size) for _ in range(shape.input_tokens - prefix_len)]


def grain_hashes(ids: list[int]) -> list[int]:
    """The simulator's prefix-cache hashes of a token-id prompt: one per full 16-token grain, chained (a grain's
    hash names the whole prefix up to it), as ``tokens.block_hashes`` hashes text."""
    out, parent = [], 0
    for start in range(0, len(ids) - BLOCK_SIZE_TOKENS + 1, BLOCK_SIZE_TOKENS):
        parent = hash((parent, tuple(ids[start : start + BLOCK_SIZE_TOKENS])))
        out.append(parent)
    return out


class TokenPromptDriver(HttpReplicaDriver):
    """``benchmark_replica``'s HTTP driver (``replica_benchmark.http_driver``) with exact token-id prompts and every
    request streamed; a ``replica_benchmark.sweep.LoadDriver``, so ``run_sweep`` calibrates with it."""

    name = "http-token-ids"

    def __init__(self, url: str, *, model: str, vocab_size: int, **kwargs):
        super().__init__(url, model=model, **kwargs)
        self.vocab_size = vocab_size

    def run(self, shape: Shape, concurrency: int, requests: int, run_id: str, prefix_groups: int = 1) -> list[Sample]:
        def prompt(index: int) -> list[int]:
            return prompt_ids(
                shape, run_id=run_id, index=index, vocab_size=self.vocab_size, prefix_groups=prefix_groups
            )

        return asyncio.run(
            self.closed_loop(
                concurrency=concurrency,
                outputs=output_lengths(shape, requests, run_id),
                prompt=prompt,
                streamed=lambda index: True,
            )
        )


class Recorder:
    """A ``LoadDriver`` that keeps every run another one makes (its load, run id and samples): ``run_sweep``'s
    levels, fit shapes and grid become the profile fit's data, and the run id replays the same prompts and output
    lengths in the simulator."""

    def __init__(self, driver):
        self.driver = driver
        self.name = driver.name
        self.runs: list[tuple[LoadPoint, str, list[Sample]]] = []

    def run(self, shape: Shape, concurrency: int, requests: int, run_id: str) -> list[Sample]:
        samples = self.driver.run(shape, concurrency, requests, run_id)
        self.runs.append((LoadPoint(shape, concurrency, requests), run_id, samples))
        return samples


@dataclass(frozen=True)
class ApiServerCost:
    """CPU seconds that vLLM's API server (and the load's client, on the same core) spends per request, per
    prompt token of a request (parsing, validation) and per streamed token (detokenizing, one SSE event, the
    client reading it). On a GPU host these are noise beside a model step; on a small CPU host a step of the tiny
    model takes 2-5 ms and they are not (docs/algorithms.md, "Calibration against real vLLM")."""

    per_request_s: float = 0.0
    per_prompt_token_s: float = 0.0
    per_token_s: float = 0.0
    # How much later than its headers a request reaches the scheduler while the engine is running others. vLLM's
    # engine core takes new input between steps, from an input thread of the process whose loop spins on its
    # worker's results, and here the two processes share one core; the delay is fitted, its cause not isolated.
    # An idle engine takes a request at once (the prefill probes see none of it).
    busy_admit_s: float = 0.0
    # With ``per_event_s`` the API server is modelled as vLLM's runs (``simulate_point``'s merging loop): a step's
    # outputs cost ``per_token_s`` a stream to process, and each stream's SSE event ``per_event_s``, once for all
    # the tokens processed since its last event. Without it, every token costs ``per_token_s`` in one FIFO.
    per_event_s: float = 0.0


class _Fifo:
    """One CPU doing jobs in the order they come: ``run`` returns when a job that came at ``at`` is done."""

    def __init__(self) -> None:
        self.free_at = 0.0

    def run(self, at: float, work_s: float) -> float:
        self.free_at = max(at, self.free_at) + work_s
        return self.free_at


def simulate_point(
    profile: EngineProfile,
    point: LoadPoint,
    *,
    run_id: str,
    client_gap_s: float = 0.0,
    api: ApiServerCost = ApiServerCost(),
) -> list[Sample]:
    """The point's closed loop on the simulator's engine in virtual time, with the prompts and output lengths the
    engine gets. A finished request's successor is sent ``client_gap_s`` later (the client's turnaround); the API
    server does its work for it (``api``: one FIFO of CPU work shared with every streamed token, so a request waits
    behind the tokens of the others), and the scheduler takes it in at its next step after that. Each step's tokens
    reach the client once the API server has done their work; TTFT counts from the send, as the client's does."""
    if api.per_event_s > 0:
        return _simulate_merging(profile, point, run_id=run_id, client_gap_s=client_gap_s, api=api)
    engine = Engine(profile)
    shape, n = point.shape, point.requests
    outputs = output_lengths(shape, n, run_id)
    server = _Fifo()
    prompts: dict[int, list[int]] = {}
    sent: list[tuple[float, int]] = [(0.0, i) for i in range(min(point.concurrency, n))]  # the client's sends
    arrivals: list[tuple[float, int, float, float]] = []  # (at the scheduler, index, sent, handed over)
    issued = len(sent)
    first_seen: dict[str, float] = {}
    samples: list[Sample] = []
    now = 0.0

    def receive(until: float) -> None:
        """The API server takes the requests sent by ``until``, in the order they were sent."""
        while sent and sent[0][0] <= until:
            at, index = heapq.heappop(sent)
            ids = prompts[index] = prompt_ids(
                shape, run_id=run_id, index=index, vocab_size=profile.vocab_size, prefix_groups=point.prefix_groups
            )
            done = server.run(at, api.per_request_s + api.per_prompt_token_s * len(ids))
            # The headers go out as the API server hands the request over; a busy engine takes it in later.
            busy = engine.running or engine.prefilling
            heapq.heappush(arrivals, (done + (api.busy_admit_s if busy else 0.0), index, at, done))

    while len(samples) < n:
        receive(now)
        _admit(engine, arrivals, prompts, outputs, run_id=run_id, now=now)
        plan = engine.plan(now, 1)
        if plan is None:
            upcoming = [q[0][0] for q in (sent, arrivals) if q]
            if not upcoming:
                raise BenchmarkError("the simulated engine went idle with requests outstanding")
            now = max(now, min(upcoming))
            continue
        # Requests sent while the step runs reach the API server before the step's tokens do: its FIFO takes
        # work in the order it comes, not after the step it overlaps.
        receive(now + plan.duration())
        now += plan.duration()
        finished = engine.commit(plan, plan.steps, now)
        seen = server.run(now, api.per_token_s * len(plan.seqs))  # this step's tokens, at the client
        for seq in plan.admitted:
            if seq.first_token_s is not None:
                first_seen.setdefault(seq.request_id, seen)
        for seq in finished:
            first = first_seen.pop(seq.request_id, seen)
            # The API server's part ends as the engine gets it (``seq.tag``).
            samples.append(
                Sample(
                    seq.arrival_s, seen, first, seq.prompt_tokens, seq.cached_tokens, seq.generated, accepted_s=seq.tag
                )
            )
            if issued < n:
                heapq.heappush(sent, (seen + client_gap_s, issued))
                issued += 1
    return samples


def _admit(engine: Engine, arrivals: list, prompts: dict, outputs: list, *, run_id: str, now: float) -> None:
    """The requests the API server handed over by ``now`` into the engine's queue, as vLLM's scheduler takes them."""
    while arrivals and arrivals[0][0] <= now:
        _, index, sent_s, at = heapq.heappop(arrivals)
        ids = prompts.pop(index)
        seq = Sequence(f"{run_id}-{index}", len(ids), outputs[index], grain_hashes(ids), arrival_s=sent_s)
        seq.tag = at  # when the API server handed it over
        engine.add(seq)


def _simulate_merging(
    profile: EngineProfile, point: LoadPoint, *, run_id: str, client_gap_s: float, api: ApiServerCost
) -> list[Sample]:
    """``simulate_point`` with vLLM's API server as it runs (``_MergingServer``); the engine's loop is the same."""
    engine = Engine(profile)
    server = _MergingServer(engine, profile, point, run_id=run_id, client_gap_s=client_gap_s, api=api)
    outputs = output_lengths(point.shape, point.requests, run_id)
    now = 0.0
    while True:
        server.serve(now)
        if server.done():
            return server.samples
        _admit(engine, server.arrivals, server.prompts, outputs, run_id=run_id, now=now)
        plan = engine.plan(now, 1)
        if plan is None:
            upcoming = [t for t in (server.arrivals[0][0] if server.arrivals else None, server.next_work())]
            upcoming = [t for t in upcoming if t is not None]
            if not upcoming:
                raise BenchmarkError("the simulated engine went idle with requests outstanding")
            now = max(now, min(upcoming))
            continue
        now += plan.duration()
        finished = engine.commit(plan, plan.steps, now)
        server.steps.append((now, list(plan.seqs), list(plan.admitted), list(finished)))


class _MergingServer:
    """vLLM's API server as it runs (vllm/v1/engine/async_llm.py, output_processor.py): one event loop whose output
    handler processes every engine step's outputs as soon as they are queued, without yielding while more are
    (``per_token_s`` a stream a step: detokenizing, the request's output), and puts each stream's output in its
    ``RequestOutputCollector``, which merges it into one not yet taken. The streams' own tasks, woken by that, send
    one SSE event each (``per_event_s``) with every token merged since their last one; new requests' HTTP handling
    comes after them in the loop. So the loop runs in phases: process the steps that came, send the woken streams'
    events, take the requests that came; a busy server sends fewer, larger events instead of falling behind by a
    token a stream a step."""

    def __init__(self, engine, profile, point: LoadPoint, *, run_id: str, client_gap_s: float, api: ApiServerCost):
        self.engine, self.profile, self.point, self.run_id, self.gap, self.api = (
            engine, profile, point, run_id, client_gap_s, api
        )  # fmt: skip
        self.n = point.requests
        self.sent: list[tuple[float, int]] = [(0.0, i) for i in range(min(point.concurrency, self.n))]
        self.issued = len(self.sent)
        self.arrivals: list[tuple[float, int, float, float]] = []  # (at the scheduler, index, sent, handed over)
        self.prompts: dict[int, list[int]] = {}
        # Engine steps not processed yet, in time order: (end, seqs, admitted, finished).
        self.steps: collections.deque[tuple[float, list, list, list]] = collections.deque()
        self.woken: dict[str, tuple[Sequence, bool, bool]] = {}  # streams with tokens processed, not sent yet
        self.first_seen: dict[str, float] = {}
        self.samples: list[Sample] = []
        self.free_at = 0.0  # when the loop is free

    def done(self) -> bool:
        return len(self.samples) >= self.n

    def next_work(self) -> float | None:
        """When the loop's next phase starts (None: nothing to do until the engine steps)."""
        times = [queue[0][0] for queue in (self.steps, self.sent) if queue]
        return max(self.free_at, min(times)) if times else None

    def serve(self, until: float) -> None:
        """Every phase of the loop that starts by ``until``."""
        while (start := self.next_work()) is not None and start <= until:
            t = self._process(start)
            t = self._send_events(t)
            self.free_at = self._take_requests(t)

    def _process(self, t: float) -> float:
        """The output handler drains the steps queued by ``t``: every stream that got a token (decoding, prefill
        ended, finished) is woken, with whether the token is its first and whether it finished."""
        while self.steps and self.steps[0][0] <= t:
            _, seqs, admitted, finished = self.steps.popleft()
            # A sequence admitted and preempted in the same step got no token (its first_token_s stays unset).
            got_first = [seq for seq in admitted if seq.first_token_s is not None]
            streams = {seq.request_id: seq for seq in (*seqs, *got_first, *finished)}
            t += self.api.per_token_s * len(streams)
            done = {seq.request_id for seq in finished}
            firsts = {seq.request_id for seq in got_first}
            for request_id, seq in streams.items():
                _, first, end = self.woken.get(request_id, (seq, False, False))
                self.woken[request_id] = (seq, first or request_id in firsts, end or request_id in done)
        return t

    def _send_events(self, t: float) -> float:
        """One SSE event a woken stream, with every token merged since its last; a finished stream's successor is
        sent by the client ``client_gap_s`` after its last event."""
        for request_id, (seq, first, end) in self.woken.items():
            t += self.api.per_event_s
            if first:
                self.first_seen.setdefault(request_id, t)
            if end:
                first_at = self.first_seen.pop(request_id, t)
                self.samples.append(
                    Sample(
                        seq.arrival_s,
                        t,
                        first_at,
                        seq.prompt_tokens,
                        seq.cached_tokens,
                        seq.generated,
                        accepted_s=seq.tag,
                    )  # fmt: skip
                )
                if self.issued < self.n:
                    heapq.heappush(self.sent, (t + self.gap, self.issued))
                    self.issued += 1
        self.woken.clear()
        return t

    def _take_requests(self, t: float) -> float:
        """The requests whose bytes came by the time the loop polls: parsed, handed to the engine (a busy one takes
        them ``busy_admit_s`` later)."""
        polled, point, api = t, self.point, self.api
        while self.sent and self.sent[0][0] <= polled:
            sent_at, index = heapq.heappop(self.sent)
            ids = self.prompts[index] = prompt_ids(
                point.shape, run_id=self.run_id, index=index, vocab_size=self.profile.vocab_size,
                prefix_groups=point.prefix_groups,
            )  # fmt: skip
            t += api.per_request_s + api.per_prompt_token_s * len(ids)
            busy = self.engine.running or self.engine.prefilling
            heapq.heappush(self.arrivals, (t + (api.busy_admit_s if busy else 0.0), index, sent_at, t))
        return t


METRICS = ("throughput_tok_s", "ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "prefix_hit_rate")
# The TTFT split where the replica answers the headers: the API server's part before (HTTP, request processing)
# and the engine's after (scheduling, prefill, the first token back through the API server).
SPLIT_METRICS = ("frontend_p50_s", "engine_ttft_p50_s", "engine_ttft_p90_s")


def point_stats(point: LoadPoint, samples: list[Sample]) -> dict[str, float | None]:
    """The compared figures of one run: output tok/s, TTFT and TPOT over the steady window (``summarize``'s: the
    first and last ``concurrency`` finishes are ramp-up and drain), prefix hit rate over every request."""
    stats = summarize(point.shape, point.concurrency, samples)
    ok = sorted((s for s in samples if s.ok), key=lambda s: s.end_s)
    n, c = len(ok), point.concurrency
    window = ok[c : n - c] if n >= 3 * c else ok
    ttfts = [s.first_token_s - s.start_s for s in window if s.first_token_s is not None]
    tpots = [
        (s.end_s - s.first_token_s) / (s.output_tokens - 1)
        for s in window
        if s.first_token_s is not None and s.output_tokens > 1
    ]
    prompt = sum(s.prompt_tokens for s in ok)
    accepted = [s for s in window if s.first_token_s is not None and s.accepted_s is not None]
    engine_ttfts = [s.first_token_s - s.accepted_s for s in accepted]
    return {
        "throughput_tok_s": stats.aggregate_tok_s,
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p90_s": percentile(ttfts, 90),
        "tpot_p50_s": statistics.median(tpots) if tpots else None,
        "prefix_hit_rate": sum(s.cached_tokens for s in ok) / prompt if prompt else None,
        "frontend_p50_s": statistics.median(s.accepted_s - s.start_s for s in accepted) if accepted else None,
        "engine_ttft_p50_s": percentile(engine_ttfts, 50),
        "engine_ttft_p90_s": percentile(engine_ttfts, 90),
    }


def group_pids(pgid: int) -> list[int]:
    """The processes of process group ``pgid`` (Linux ``/proc``)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            pids.append(int(entry))
    return pids


def set_affinity(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` on ``cpus`` (``sched_setaffinity`` moves one thread)."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:  # a thread that ended meanwhile
            pass


def pin_engine(pgid: int, engine_cores: int) -> dict | None:
    """Lay the measurement out on the CPUs this process may use: vLLM's engine processes (its engine core and
    workers, named ``VLLM::…``) on the first ``engine_cores``, its API server and this process (the load's client)
    on the rest. Left to the kernel on a 2-core host, the engine core's busy-wait for its worker migrates onto
    the API server's and the client's core and the client-side times stop being repeatable (docs/algorithms.md,
    "Calibration against real vLLM"). None, changing nothing, when no core would be left for the API server."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) <= engine_cores:
        return None
    engine, rest = set(allowed[:engine_cores]), set(allowed[engine_cores:])
    for pid in group_pids(pgid):
        try:
            with open(f"/proc/{pid}/comm") as fh:
                name = fh.read().strip()
        except OSError:
            continue
        set_affinity(pid, engine if name.startswith("VLLM::") else rest)
    set_affinity(os.getpid(), rest)
    return {"engine": sorted(engine), "api_server_and_client": sorted(rest)}


class CpuMeter:
    """Who used this machine's CPUs during a run (Linux ``/proc``): the engine's processes (its process group),
    this process, and everything else: the evidence when a shared machine's neighbours disturb a measurement."""

    def __init__(self, engine_pgid: int | None = None):
        self.engine_pgid = engine_pgid
        self.tick = os.sysconf("SC_CLK_TCK")

    def _busy_ticks(self) -> float:
        with open("/proc/stat") as fh:
            fields = [float(v) for v in fh.readline().split()[1:]]
        return sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0.0)  # all but idle and iowait

    def _group_ticks(self) -> float:
        total = 0.0
        if self.engine_pgid is None:
            return total
        for pid in group_pids(self.engine_pgid):
            try:
                with open(f"/proc/{pid}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += float(fields[11]) + float(fields[12])  # utime + stime
        return total

    def __enter__(self) -> CpuMeter:
        self._wall = time.monotonic()
        self._busy, self._engine, self._own = self._busy_ticks(), self._group_ticks(), sum(os.times()[:2])
        return self

    def __exit__(self, *exc) -> None:
        wall = max(time.monotonic() - self._wall, 1e-9)
        busy = (self._busy_ticks() - self._busy) / self.tick
        engine = (self._group_ticks() - self._engine) / self.tick
        own = sum(os.times()[:2]) - self._own
        self.figures = {
            "cpus": os.cpu_count(),
            "busy_cores": round(busy / wall, 2),
            "engine_cores": round(engine / wall, 2) if self.engine_pgid is not None else None,
            "others_cores": round(max(0.0, busy - engine - own) / wall, 2) if self.engine_pgid is not None else None,
            "load_average_1m": round(os.getloadavg()[0], 2),
        }
