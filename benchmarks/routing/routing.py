"""``bench routing``: every routing policy on llm-d's shared-prefix workload in the discrete-event simulator.

8 simulated replicas (``qwen3-32b-h100x2``, the model of llm-d's benchmark); 32 groups × 32 prompts,
2,048-token system prompt, 256-token question, 256-token output; Poisson arrivals in rising QPS stages,
one continuous run per policy (caches stay warm across stages), until the first *saturated* stage: more
than ``qps × TTFT_SLO`` requests waiting at a stage's end (Little's law: the mean wait alone exceeds the TTFT
SLO), or fewer than half of the requests finishing during the stage within their SLO. When the configured
stages run out first, the run keeps rising by the last step (up to twice the last configured QPS), so every
policy is measured up to its own saturation. After the last stage, arrivals go on at its rate for one more
(unmeasured) stage: the last stage's requests finish under the load they were offered, not on a fleet that
drains (which would make the saturated stage look good).

Per policy: SLO-meeting throughput (requests/s, arrived in a stage, that met TTFT and TPOT, best stage),
TTFT p50/p95 and output tokens/s at the highest stage every policy ran ("highest common load"),
prefix-cache hit rate (the engines' own counters), max/mean MU routed per replica, and the per-stage figures
with ``max_qps_at_90pct_slo`` (DistServe's goodput: the highest offered QPS with ≥ 90% of requests within the
SLO). Stages shorter than a request's life (~25 s near the knee) measure the ramp between stages rather than
the load: 12 s stages gave infercap up to +10% over llm-d that vanished at steady state. Then a hot-prefix
variant (half the traffic in one group: ours vs pure prefix affinity without the load bound) and a
multi-turn chat workload. Full mode also runs ``PartitionOracle`` (each group pinned to one replica, known
from the workload): the room prefix affinity leaves above llm-d. ``--live`` runs the shared-prefix workload
through the real proxy instead.

Where the ceiling is (so what "≥ 1.1 × llm-d" would take): one replica fed only its own four groups (perfect
cache, no interference) with Poisson arrivals meets the TPOT SLO for 97% of requests at 14.5 req/s and for at most
36% at 15 req/s, with 6,000 or 17,000 KV blocks alike (80 s warm-up, 40 s measured): about 116–118 req/s for 8
replicas. llm-d's scheduler already reaches 113–118 SLO-meeting req/s here (it deals the groups out 4 per
replica and keeps them), so nothing can be 1.1× it on this workload and hardware model.

Prompts use this module's own random text: each group's system prompt and each question differ from
the first block on, which is what makes prefix affinity matter.

Seeds (benchmarks/protocol.py, ``SEEDS["routing"]``): a plain run judges on training seeds only, seed 2 by default;
``--held-out`` runs the suite on the held-out seeds (the first ``QUICK_HELD_OUT_SEEDS`` with ``--quick``; ``seeds=``
picks others among them), judges the policies on their means and is logged by the command (``HELD_OUT``). No option
reaches a held-out seed without ``--held-out``.

Options (``--opt KEY=VALUE``): ``workloads=a,b`` runs only those suite workloads; ``seed=N`` judges on another
training seed (default 2); ``seeds=17-22`` (or ``3,5,9``, or ``training``: every training seed) runs the suite on
each seed and judges the policies on their means, with each seed's figures, how many seeds infercap was at least
llm-d and the best baseline, and the paired differences with their 95 % intervals; ``tune=llmd`` with ``seeds=`` tunes llm-d's scorer weights per workload on those
(tuning) seeds over ``routing_suite.LLMD_GRID`` and prints the weights each of llm-d's two profiles does best with
(the suite's ``llmd_tuned`` and ``llmd_precise_tuned`` baselines run them); ``load_bound=X`` runs infercap with another
load bound (the default's choice can be judged on the same arrivals), ``prefill_weight=W`` with another pending-prefill
weight (2 by default, 0 turns it off; docs/algorithms.md#pending-prefill); ``ceilings=off`` skips the two
router-independent ceilings (the slowest runs; with ``seeds=`` the means still carry each seed's paired difference
from the best baseline and its 95 % interval; without them ``out_of_reach`` is empty: it lists each missed "≥ 1.15×
llm-d" goal whose balanced-fleet ceiling is below 1.15× llm-d too, with that ceiling's ratio, and with ``seeds=``
each workload's ``balanced_bound_vs_llmd`` gives that ratio seed by seed with its 95 % interval); ``stage_s=S``;
``hot_prefix_s=S`` (the hot-prefix run's length; 30 quick, two legacy stages full); ``stages=Q1,Q2,...``, ``hot_share``, ``replicas`` for the legacy shared-prefix setup;
``combine=A.json,B.json`` judges earlier ``seeds=`` runs' saved last lines together over all their seeds, running
nothing (held-out runs only with ``--held-out``, which logs the look).
"""

from __future__ import annotations

import functools
import json
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from benchmarks import protocol
from benchmarks.routing import routing_headline, routing_suite
from benchmarks.routing.routing_live import run_live
from benchmarks.routing.routing_suite import _ms
from benchmarks.serving.words import random_text
from capacity.hardware.profiles import get_profile
from capacity.percentiles import percentile
from gateway.routing import make_router
from gateway.routing.baselines import RouterBase
from gateway.routing.prefix import PREFIX_BLOCK_CHARS
from simulator.des import Simulation
from simulator.results import SimResult
from simulator.tokens import output_text
from simulator.workloads import SimRequest, poisson_times

POLICIES = ("round_robin", "least_request", "power_of_two", "llmd", "infercap")
# ``bench routing --held-out`` judges on benchmarks/protocol.py's held-out seeds (the command logs each such run).
HELD_OUT = True
QUICK_HELD_OUT_SEEDS = 3  # --held-out --quick: the first three held-out seeds (a quick run takes minutes a seed)


@dataclass(frozen=True)
class Setup:
    profile: str = "qwen3-32b-h100x2"
    # 6,000 blocks = a 96k-token KV cache per replica (Qwen3-32B TP2 on 2×48 GB GPUs, or an H100 pair with a
    # lower --gpu-memory-utilization): the 32 groups' prefixes (65k tokens) fill two thirds of one replica's
    # cache, the contended regime llm-d's prefix-aware scheduling is built for. None = the profile's own
    # 17,000 blocks (reported too, in full mode, as "compute_bound"). Both regimes saturate at the same place:
    # the TPOT SLO caps a replica near 14.5 req/s here (decode step ≈ 12 ms + 12 ms when a prefill rides
    # along + 0.2 ms per running sequence; 100 ms allows ~370 sequences = 370 / (256 × 0.1 s) req/s), and
    # ~370 running sequences with four groups' prefixes and questions also fill the 6,000 blocks.
    num_gpu_blocks: int | None = 6000
    replicas: int = 8
    groups: int = 32
    prompts_per_group: int = 32
    system_tokens: int = 2048
    question_tokens: int = 256
    output_tokens: int = 256
    ttft_slo_s: float = 2.0  # the endpoint defaults (Endpoint.ttft_slo_ms / tpot_slo_ms)
    tpot_slo_s: float = 0.1
    # Coarse steps to the neighbourhood of the knee, then 5 qps steps: SLO-meeting throughput is the best stage,
    # so the step size near saturation is the resolution of the comparison.
    stages: tuple[float, ...] = (40, 50, 60, 65, 70, 75, 80, 90, 100, 105, 110, 115, 120, 125, 130, 135, 140, 150, 160)
    # A stage must outlast a request: near the knee a request lives ~25 s (256 tokens at ~0.1 s). Shorter stages
    # measure the ramp between stages, not the offered load (12 s stages flattered infercap by up to 10%).
    stage_s: float = 40.0
    hot_share: float = 0.5
    seed: int = 1


# Round robin's knee is near 60 qps, the prefix-aware ones' near 115: both get 5–10 qps steps there.
QUICK = Setup(stages=(40, 50, 60, 65, 70, 80, 100, 110, 115, 120, 125, 130, 140, 150, 160), stage_s=30.0)


def stage_plan(setup: Setup) -> tuple[float, ...]:
    """The configured stages, then rising by the last step up to twice the last one (until saturation)."""
    stages = tuple(float(q) for q in setup.stages)
    if not stages:
        raise ValueError("bench routing needs at least one QPS stage")
    step = stages[-1] - stages[-2] if len(stages) > 1 and stages[-1] > stages[-2] else max(stages[-1] / 10, 1.0)
    extra, qps = [], stages[-1]
    while qps + step <= 2 * stages[-1] + 1e-9:
        qps += step
        extra.append(qps)
    return stages + tuple(extra)


def engine_profile(setup: Setup):
    if setup.num_gpu_blocks:
        return get_profile(setup.profile, num_gpu_blocks=setup.num_gpu_blocks)
    return get_profile(setup.profile)


# -- workloads ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4)
def _texts(groups: int, per_group: int, system_tokens: int, question_tokens: int, seed: int):
    rng = random.Random(f"routing-bench-text-{seed}")
    systems = [random_text(system_tokens, rng) for _ in range(groups)]
    questions = [[random_text(question_tokens, rng) for _ in range(per_group)] for _ in range(groups)]
    return systems, questions


def shared_prefix_requests(setup: Setup, times: Iterator[float], *, hot_share: float = 0.0) -> Iterator[SimRequest]:
    systems, questions = _texts(
        setup.groups, setup.prompts_per_group, setup.system_tokens, setup.question_tokens, setup.seed
    )
    pick = random.Random(f"routing-bench-pick-{setup.seed}")
    for i, t in enumerate(times):
        group = 0 if hot_share and pick.random() < hot_share else pick.randrange(setup.groups)
        yield SimRequest(
            request_id=f"sp-{i}",
            arrival_s=t,
            prompt_parts=(systems[group], questions[group][pick.randrange(setup.prompts_per_group)]),
            output_tokens=setup.output_tokens,
            extra={"group": group},
        )


def multi_turn_requests(*, sessions: int, turns: int, rate: float, seed: int) -> Iterator[SimRequest]:
    """Chat sessions: each turn's prompt is the whole conversation so far; ``x-session-id`` set."""
    rng = random.Random(f"routing-bench-mt-{seed}")
    system = random_text(512, rng)

    def turn(session: str, k: int, history: str, at: float) -> SimRequest:
        user = random_text(64, rng)
        request = SimRequest(
            request_id=f"{session}-t{k}",
            arrival_s=at,
            prompt_parts=(system, history + user),
            output_tokens=128,
            session_id=session,
        )
        if k + 1 < turns:

            def followup(result, _history=history + user) -> SimRequest | None:
                answer = output_text(0, result.output_tokens or 0)
                return turn(session, k + 1, _history + answer, result.finish_s + rng.expovariate(1 / 3.0))

            request.followup = followup
        return request

    for i, t in enumerate(poisson_times(rate, count=sessions, seed=seed)):
        yield turn(f"s{i}", 0, "", t)


# -- one policy, rising stages -----------------------------------------------------------------------------


class SloMonitor:
    """Plugged in as the simulation's autoscaler (it never acts): keeps every finished request, per tick."""

    def __init__(self):
        self.finished: list = []

    def tick(self, fleet, actions, now: float) -> None:
        self.finished.extend(fleet.finished_last_tick)


def _staged_times(setup: Setup, sim_ref: list, monitor: SloMonitor, stopped: list) -> Iterator[float]:
    """Rising Poisson stages; stops after the first stage at whose end the fleet is saturated, then goes on at
    that stage's rate for one unmeasured stage (so the measured requests never finish on a draining fleet)."""
    start = 0.0
    plan = stage_plan(setup)
    for index, qps in enumerate(plan):
        yield from poisson_times(qps, duration_s=setup.stage_s, start_s=start, seed=setup.seed * 1000 + index)
        fleet = sim_ref[0].fleet_view()
        # Little's law on the waiting requests (proxy backlog + engines' waiting queues): more than
        # qps × TTFT SLO of them means the average wait alone already exceeds the TTFT SLO.
        waiting = fleet.queued + sum(r.num_waiting for r in fleet.replicas)
        # A replica past its batch size breaks TPOT for everything it runs, without any queue: watch the
        # requests that finished during the stage too.
        recent = [r for r in monitor.finished if r.finish_s is not None and r.finish_s >= start]
        good = sum(r.meets(ttft_s=setup.ttft_slo_s, tpot_s=setup.tpot_slo_s) for r in recent)
        start += setup.stage_s
        if waiting > qps * setup.ttft_slo_s or (len(recent) >= 20 and good < 0.5 * len(recent)):
            stopped.append(index)
            break
    yield from poisson_times(qps, duration_s=setup.stage_s, start_s=start, seed=setup.seed * 1000 + 999)


class PartitionOracle(RouterBase):
    """Reference, not a product policy: knows each request's prefix group and pins group g to replica g mod n.

    Every replica holds exactly its share of the groups (perfect cache partition, no duplicated prefix, no
    prefix miss after the first), with the Poisson imbalance of independent groups. It is what prefix affinity
    can reach at best without moving groups, so it shows how much room the workload leaves above llm-d.
    """

    name = "partition_oracle"

    def __init__(self, setup: Setup, **kwargs):
        super().__init__(**kwargs)
        systems, _ = _texts(
            setup.groups, setup.prompts_per_group, setup.system_tokens, setup.question_tokens, setup.seed
        )
        self._group = {text[:PREFIX_BLOCK_CHARS]: g for g, text in enumerate(systems)}

    def pick(self, request, replicas, now):
        candidates = sorted(self.candidates(replicas, request), key=lambda r: r.replica_id)
        if not candidates:
            return None
        group = self._group.get(request.prompt_text[:PREFIX_BLOCK_CHARS], 0)
        return candidates[group % len(candidates)].replica_id


def run_staged(setup: Setup, policy: str, router_options: dict | None = None) -> dict:
    if policy == PartitionOracle.name:
        router = PartitionOracle(setup, seed=setup.seed)
    else:
        router = make_router(policy, seed=setup.seed, **(router_options or {}))
    monitor = SloMonitor()
    sim = Simulation(
        router=router, replicas=setup.replicas, profile=engine_profile(setup), autoscaler=monitor, seed=setup.seed
    )
    stopped: list[int] = []
    result = sim.run(shared_prefix_requests(setup, _staged_times(setup, [sim], monitor, stopped)))
    plan = stage_plan(setup)
    last_stage = stopped[0] if stopped else len(plan) - 1
    stages = [_stage_figures(setup, result, k) for k in range(last_stage + 1)]
    return {"result": result, "stages": stages, "saturated_at_qps": plan[last_stage] if stopped else None}


def _stage_window(setup: Setup, k: int) -> tuple[float, float]:
    return k * setup.stage_s, (k + 1) * setup.stage_s


def _stage_figures(setup: Setup, result: SimResult, k: int) -> dict:
    lo, hi = _stage_window(setup, k)
    arrived = [r for r in result.requests if lo <= r.arrival_s < hi]
    good = sum(r.meets(ttft_s=setup.ttft_slo_s, tpot_s=setup.tpot_slo_s) for r in arrived)
    # Requests never completed count as infinitely late, so a saturated stage's percentiles are honest.
    ttfts = [r.ttft_s if r.ttft_s is not None else math.inf for r in arrived]
    tokens_out = _tokens_generated_between(result, lo, hi)
    return {
        "qps": stage_plan(setup)[k],
        "requests": len(arrived),
        "slo_rps": good / setup.stage_s,
        "slo_attainment": good / len(arrived) if arrived else 0.0,
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p95_s": percentile(ttfts, 95),
        "output_tok_s": tokens_out / setup.stage_s,
    }


def max_qps_meeting(stages: list[dict], attainment: float) -> float | None:
    """The highest offered QPS among the stages where at least ``attainment`` of the requests met the SLO."""
    good = [s["qps"] for s in stages if s["requests"] and s["slo_attainment"] >= attainment]
    return max(good) if good else None


def _tokens_generated_between(result: SimResult, lo: float, hi: float) -> float:
    """Output tokens produced inside [lo, hi), spreading each request's decode evenly over its decode time."""
    total = 0.0
    for r in result.requests:
        if r.first_token_s is None or r.finish_s is None or not r.output_tokens:
            continue
        start, end = r.first_token_s, max(r.finish_s, r.first_token_s + 1e-9)
        overlap = max(0.0, min(end, hi) - max(start, lo))
        total += r.output_tokens * overlap / (end - start)
    return total


def load_over_mean(result: SimResult, *, since_s: float = 0.0) -> float:
    """max / mean of the MU routed to each replica (requests arriving after ``since_s``)."""
    per_replica = {rep.replica_id: 0.0 for rep in result.replicas}
    for r in result.requests:
        if r.replica_id is not None and r.arrival_s >= since_s:
            per_replica[r.replica_id] = per_replica.get(r.replica_id, 0.0) + r.mu
    loads = list(per_replica.values())
    mean = sum(loads) / len(loads) if loads else 0.0
    return max(loads) / mean if mean else 1.0


# --smoke: half-second stages and a 3 s hot-prefix run (every workload, policy and key, in seconds).
SMOKE = {"stage_s": "0.5", "hot_prefix_s": "3"}


# -- the benchmark -----------------------------------------------------------------------------------------


def run(
    *,
    quick: bool = False,
    plot: str | None = None,
    live: bool = False,
    progress: Callable = print,
    held_out: bool = False,
    **options,
) -> dict:
    if "combine" in options:
        return _combine(str(options.pop("combine")), held_out=held_out, rest=options, progress=progress)
    setup = QUICK if quick else Setup()
    suite_stage_s = float(options["stage_s"]) if "stage_s" in options else None
    if "stages" in options:
        setup = Setup(**{**setup.__dict__, "stages": tuple(float(q) for q in str(options.pop("stages")).split(","))})
    for key in ("stage_s", "hot_share", "replicas"):
        if key in options:
            kind = type(getattr(setup, key))
            setup = Setup(**{**setup.__dict__, key: kind(options.pop(key))})
    hot_prefix_s = float(options.pop("hot_prefix_s", 30.0 if quick else 0)) or None
    seed, seeds = seeds_of_run(options, held_out=held_out, quick=quick, one_seed_only=bool(plot or live))
    tune = options.pop("tune", None)
    ceilings = _pop_ceilings(options)
    infercap_options = _pop_infercap_options(options)
    only = [w for w in str(options.pop("workloads", "")).split(",") if w]
    known = {w.name for w in routing_suite.suite(quick=quick)}
    if set(only) - known:
        raise ValueError(
            f"unknown workloads {', '.join(sorted(set(only) - known))}; choose from {', '.join(sorted(known))}"
        )
    if options:
        raise ValueError(f"unknown options for bench routing: {', '.join(sorted(options))}")
    if seeds is not None and (plot or live):
        raise ValueError("seeds= runs the suite on several seeds; --plot and --live take one (use seed=)")
    if tune is not None:
        return _tune(tune, seeds, quick=quick, stage_s=suite_stage_s, only=only, progress=progress, one=plot or live)
    if live:
        return run_live(setup=setup, quick=quick, progress=progress)

    started = time.perf_counter()
    if seeds is not None:
        return _run_seeds(
            seeds,
            quick=quick,
            stage_s=suite_stage_s,
            only=only,
            progress=progress,
            started=started,
            infercap_options=infercap_options,
            ceilings=ceilings,
            held_out=held_out,
        )
    suite = routing_suite.run_suite(
        quick=quick,
        stage_s=suite_stage_s,
        seed=seed,
        only=only,
        progress=progress,
        infercap_options=infercap_options,
        ceilings=ceilings,
    )
    figures: dict = {"workloads": suite["workloads"], "stage_s": suite["stage_s"], "seed": suite["seed"]}
    figures["held_out"] = False  # a training seed (seeds_of_run)
    if infercap_options:
        figures["infercap_options"] = infercap_options
    if not only or "shared_prefix" in only:
        progress("hot-prefix variant")
        shared = suite["workloads"]["shared_prefix"]
        scale = setup.replicas / len(shared["replicas"])
        figures["hot_prefix"] = hot_prefix(
            setup, best_qps=shared["infercap"]["slo_throughput"] * scale, duration_s=hot_prefix_s
        )
    figures["goals"] = routing_suite.goals(figures["workloads"], figures.get("hot_prefix"))
    figures["out_of_reach"] = routing_suite.out_of_reach(figures["workloads"])
    figures["wall_s"] = round(time.perf_counter() - started, 1)
    if plot:
        routing_suite.write_panels_svg(plot, suite["curves"])
        progress(f"wrote {plot}")
    return figures


def _combine(paths: str, *, held_out: bool, rest: dict, progress) -> dict:
    """``combine=A.json,B.json``: the last-line figures of earlier ``seeds=`` runs (of the same code) judged
    together on all their seeds; no simulation runs. Runs of held-out seeds combine only with ``--held-out`` (the
    command logs the look), training runs only without it."""
    if rest:
        raise ValueError(f"combine= takes no other option: {', '.join(sorted(rest))}")
    saved = []
    for path in [p for p in paths.split(",") if p]:
        with open(path) as f:
            run = json.load(f)
        if "seeds" not in run or "workloads" not in run:
            raise ValueError(f"{path}: not the figures of a seeds= run of bench routing")
        if bool(run.get("held_out")) != held_out:
            raise ValueError(f"{path}: {'held-out' if run.get('held_out') else 'training'} seeds; "
                             f"{'drop' if not run.get('held_out') else 'add'} --held-out")  # fmt: skip
        saved.append(run)
    if len(saved) < 2:
        raise ValueError("combine= needs two or more saved runs, comma-separated")
    combined = routing_headline.combine(saved)
    seeds = [seed for run in saved for seed in run["seeds"]]
    progress(f"combined {len(saved)} runs: {len(seeds)} seeds ({', '.join(map(str, seeds))})")
    for name, w in combined["workloads"].items():
        progress(
            f"  {name} ({len(w['seeds'])} seeds): infercap {w['infercap']['slo_throughput']}, best baseline "
            f"{w['best_baseline']['name']} {w['best_baseline']['slo_throughput']}, paired difference 95 % "
            f"{w['paired_diff_vs_best_baseline_ci95']}, x ceiling {w['ratio_vs_ceiling']} {w['ratio_vs_ceiling_ci95']}"
        )
    return {**combined, "seeds": seeds, "held_out": held_out, "combined_from": paths.split(",")}


def _tune(tune: str, seeds: list[int] | None, *, quick: bool, stage_s, only, progress, one) -> dict:
    """``tune=llmd``: llm-d's scorer weights tuned per workload on ``seeds`` (training seeds: ``seeds_of_run``)."""
    if tune != "llmd":
        raise ValueError(f"tune={tune}: only llm-d's scorer weights are tuned here (tune=llmd)")
    if seeds is None or one:
        raise ValueError("tune=llmd needs seeds= (the tuning seeds, never the judged ones) and no --plot or --live")
    started = time.perf_counter()
    tuned = routing_suite.tune_llmd(seeds, quick=quick, stage_s=stage_s, only=only, progress=progress)
    return {**tuned, "wall_s": round(time.perf_counter() - started, 1)}


def seeds_of_run(options: dict, *, held_out: bool, quick: bool, one_seed_only: bool) -> tuple[int, list[int] | None]:
    """The run's seed and seeds (None: one seed), from ``seed=`` and ``seeds=``, checked against the protocol: a plain
    run takes no held-out seed (benchmarks/protocol.py), a ``--held-out`` run takes only held-out seeds, its own by
    default, and never ``seed=``, ``tune=``, ``--plot`` or ``--live`` (one seed, or a decision's seeds)."""
    text = options.pop("seeds", None)
    training = protocol.seeds_for("routing", held_out=False)
    seeds = list(training) if text == "training" else None if text is None else routing_suite.parse_seeds(text)
    if not held_out:
        seed = int(options.pop("seed", routing_suite.EVAL_SEED))
        looked = [s for s in seeds or [seed] if protocol.is_held_out("routing", s)]
        if looked:
            raise ValueError(
                f"seeds {', '.join(map(str, looked))} are held out (benchmarks/protocol.py): only --held-out runs them, "
                "and the command logs the look"
            )
        return seed, seeds
    refused = [name for name, given in (("seed=", "seed" in options), ("tune=", "tune" in options)) if given]
    if refused or one_seed_only:
        raise ValueError(
            f"--held-out judges the means of the held-out seeds: no {', '.join(refused) or '--plot or --live'}"
        )
    pool = protocol.seeds_for("routing", held_out=True)
    seeds = seeds or list(pool[:QUICK_HELD_OUT_SEEDS] if quick else pool)
    if set(seeds) - set(pool):
        raise ValueError(f"--held-out runs only held-out seeds (benchmarks/protocol.py: {pool[0]}-{pool[-1]})")
    return routing_suite.EVAL_SEED, seeds


def _pop_ceilings(options: dict) -> bool:
    """``ceilings=on`` (the default) runs the router-independent ceilings beside the policies; ``off`` skips them."""
    ceilings = str(options.pop("ceilings", "on"))
    if ceilings not in ("on", "off"):
        raise ValueError(f"ceilings={ceilings}: on (the default) or off (skip the router-independent ceilings)")
    return ceilings == "on"


def _pop_infercap_options(options: dict) -> dict | None:
    """The infercap router options given on the command line (``load_bound``, ``prefill_weight``), checked."""
    return {
        name: _at_least(name, options.pop(name), lowest, meaning)
        for name, lowest, meaning in (
            ("load_bound", 1.0, "a replica's load over the mean"),
            ("prefill_weight", 0.0, "MU per 1,000 prompt tokens awaiting prefill"),
        )
        if name in options
    } or None


def _at_least(name: str, text: str, lowest: float, meaning: str) -> float:
    """``text`` as a finite number of at least ``lowest``, or a ValueError naming the option."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not lowest <= value < math.inf:
        raise ValueError(f"{name}={text}: a number of at least {lowest:g} ({meaning})")
    return value


def _run_seeds(
    seeds: list[int],
    *,
    quick: bool,
    stage_s: float | None,
    only,
    progress,
    started: float,
    infercap_options=None,
    ceilings: bool = True,
    held_out: bool = False,
) -> dict:
    """The suite on each seed, judged on the means (``held_out``: the protocol's held-out seeds, on which no design
    decision was made)."""
    tables = {}
    for k, seed in enumerate(seeds, 1):
        progress(f"seed {seed} ({k} of {len(seeds)})")
        suite = routing_suite.run_suite(
            quick=quick,
            stage_s=stage_s,
            seed=seed,
            only=only,
            progress=progress,
            infercap_options=infercap_options,
            ceilings=ceilings,
        )
        tables[seed] = suite["workloads"]
    workloads = routing_suite.mean_over_seeds(tables)
    return {
        "workloads": workloads,
        **({"infercap_options": infercap_options} if infercap_options else {}),
        "seeds": seeds,
        "held_out": held_out,
        "stage_s": stage_s or (8.0 if quick else 30.0),
        "goals": routing_suite.goals(workloads, None),
        "out_of_reach": routing_suite.out_of_reach(workloads),
        "wall_s": round(time.perf_counter() - started, 1),
    }


def compare_policies(setup: Setup, names, progress) -> tuple[dict, dict]:
    runs = {}
    for policy in names:
        t0 = time.perf_counter()
        runs[policy] = run_staged(setup, policy)
        best = max(s["slo_rps"] for s in runs[policy]["stages"])
        progress(
            f"{policy}: stages up to {runs[policy]['stages'][-1]['qps']:g} qps, best SLO-meeting {best:.1f} req/s "
            f"({time.perf_counter() - t0:.1f} s)"
        )
    common = min(len(r["stages"]) for r in runs.values()) - 1
    policies = {}
    for policy, data in runs.items():
        at_common = data["stages"][common]
        result = data["result"]
        policies[policy] = {
            "slo_rps": round(max(s["slo_rps"] for s in data["stages"]), 2),
            "ttft_p50_ms": _ms(at_common["ttft_p50_s"]),
            "ttft_p95_ms": _ms(at_common["ttft_p95_s"]),
            "output_tok_s": round(at_common["output_tok_s"], 1),
            "prefix_hit_rate": round(result.prefix_hit_rate(), 4),
            "max_over_mean_load": round(load_over_mean(result), 3),
            "saturated_at_qps": data["saturated_at_qps"],
            "max_qps_at_90pct_slo": max_qps_meeting(data["stages"], 0.9),
            # Per stage: offered QPS, SLO-meeting requests/s, share of the stage's requests that met the SLO.
            "stages": [[s["qps"], round(s["slo_rps"], 2), round(s["slo_attainment"], 3)] for s in data["stages"]],
        }
    ours = policies["infercap"]
    figures = {
        "workload": {
            "profile": setup.profile,
            "num_gpu_blocks": engine_profile(setup).num_gpu_blocks,
            "replicas": setup.replicas,
            "groups": setup.groups,
            "prompts_per_group": setup.prompts_per_group,
            "tokens": [setup.system_tokens, setup.question_tokens, setup.output_tokens],
            "stages_qps": list(stage_plan(setup)[: max(len(r["stages"]) for r in runs.values())]),
            "stage_s": setup.stage_s,
            "slo": {"ttft_s": setup.ttft_slo_s, "tpot_s": setup.tpot_slo_s},
            "highest_common_qps": stage_plan(setup)[common],
        },
        "policies": policies,
        "ratio_vs_round_robin": _ratio(ours["slo_rps"], policies["round_robin"]["slo_rps"]),
        "ratio_vs_llmd": _ratio(ours["slo_rps"], policies["llmd"]["slo_rps"]),
        "ttft_p50_ratio_vs_round_robin": _ratio(ours["ttft_p50_ms"], policies["round_robin"]["ttft_p50_ms"]),
        # DistServe's goodput: the highest offered QPS at which ≥ 90% of the requests met their SLO.
        "ratio_vs_llmd_at_90pct_slo": _ratio(ours["max_qps_at_90pct_slo"], policies["llmd"]["max_qps_at_90pct_slo"]),
    }
    # Past saturation: SLO-meeting throughput at the last stage llm-d's scheduler ran (its saturated stage).
    llmd_last = len(runs["llmd"]["stages"]) - 1
    if llmd_last < len(runs["infercap"]["stages"]):
        figures["ratio_vs_llmd_at_its_saturation"] = _ratio(
            runs["infercap"]["stages"][llmd_last]["slo_rps"], runs["llmd"]["stages"][llmd_last]["slo_rps"]
        )
    return runs, figures


def partition_oracle(setup: Setup, figures: dict) -> dict:
    """The same staged run with ``PartitionOracle``: the room prefix affinity leaves above llm-d's scheduler."""
    data = run_staged(setup, PartitionOracle.name)
    slo_rps = round(max(s["slo_rps"] for s in data["stages"]), 2)
    at_90 = max_qps_meeting(data["stages"], 0.9)
    llmd = figures["policies"]["llmd"]
    return {
        "slo_rps": slo_rps,
        "max_qps_at_90pct_slo": at_90,
        "prefix_hit_rate": round(data["result"].prefix_hit_rate(), 4),
        "stages": [[s["qps"], round(s["slo_rps"], 2), round(s["slo_attainment"], 3)] for s in data["stages"]],
        "ratio_vs_llmd": _ratio(slo_rps, llmd["slo_rps"]),
        "ratio_vs_llmd_at_90pct_slo": _ratio(at_90, llmd["max_qps_at_90pct_slo"]),
    }


def hot_prefix(setup: Setup, *, best_qps: float, duration_s: float | None = None) -> dict:
    """Half the traffic in one group, at half our best throughput: bounded load vs pure affinity."""
    qps = max(10.0, 0.5 * best_qps)
    duration = duration_s or setup.stage_s * 2
    out = {"qps": round(qps, 1), "hot_share": setup.hot_share}
    variants = {"infercap": {}, "affinity": {"load_bound": 1e9, "load_slack": 1e9, "prefill_weight": 0.0}}
    for name, router_options in variants.items():
        router = make_router("infercap", seed=setup.seed, **router_options)
        sim = Simulation(router=router, replicas=setup.replicas, profile=engine_profile(setup), seed=setup.seed)
        times = poisson_times(qps, duration_s=duration, seed=setup.seed + 7)
        result = sim.run(shared_prefix_requests(setup, times, hot_share=setup.hot_share))
        out[name] = {
            "max_over_mean_load": round(load_over_mean(result, since_s=duration / 2), 3),
            "prefix_hit_rate": round(result.prefix_hit_rate(), 4),
            "slo_attainment": round(result.slo_attainment(ttft_s=setup.ttft_slo_s, tpot_s=setup.tpot_slo_s), 4),
            "ttft_p50_ms": _ms(result.percentile("ttft_s", 50)),
        }
    out["max_over_mean_load"] = out["infercap"]["max_over_mean_load"]
    out["hit_rate_vs_affinity"] = _ratio(out["infercap"]["prefix_hit_rate"], out["affinity"]["prefix_hit_rate"])
    return out


def multi_turn(setup: Setup, *, quick: bool) -> dict:
    sessions, turns, rate = (120, 4, 12.0) if quick else (600, 6, 30.0)
    out = {"sessions": sessions, "turns": turns, "session_rate_per_s": rate}
    for policy in ("round_robin", "llmd", "infercap"):
        router = make_router(policy, seed=setup.seed)
        sim = Simulation(router=router, replicas=setup.replicas, profile=engine_profile(setup), seed=setup.seed)
        result = sim.run(multi_turn_requests(sessions=sessions, turns=turns, rate=rate, seed=setup.seed))
        out[policy] = {
            "slo_attainment": round(result.slo_attainment(ttft_s=setup.ttft_slo_s, tpot_s=setup.tpot_slo_s), 4),
            "ttft_p50_ms": _ms(result.percentile("ttft_s", 50)),
            "prefix_hit_rate": round(result.prefix_hit_rate(), 4),
        }
    return out


def goals(figures: dict) -> dict:
    hot = figures["hot_prefix"]
    checks = {
        "slo_rps_ge_2x_round_robin": (figures["ratio_vs_round_robin"] or 0) >= 2.0,
        "slo_rps_ge_1.1x_llmd": (figures["ratio_vs_llmd"] or 0) >= 1.1,
        "ttft_p50_le_0.1x_round_robin": (figures["ttft_p50_ratio_vs_round_robin"] or math.inf) <= 0.1,
        "hot_prefix_max_over_mean_le_1.3": hot["max_over_mean_load"] <= 1.3,
        "hot_prefix_hit_rate_ge_0.8x_affinity": (hot["hit_rate_vs_affinity"] or 0) >= 0.8,
    }
    return {**checks, "all": all(checks.values())}


def write_svg(path: str, runs: dict, setup: Setup) -> None:
    """SLO-meeting requests/s against offered QPS, one line per policy (no plotting library needed)."""
    width, height, pad = 640, 400, 50
    top = max(s["qps"] for data in runs.values() for s in data["stages"])
    colors = ["#888", "#4a90d9", "#7cb342", "#f5a623", "#d0021b"]

    def xy(qps, rps):
        return pad + (width - 2 * pad) * qps / top, height - pad - (height - 2 * pad) * rps / top

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
        'font-size="12">',
        f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" stroke="black"/>',
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="black"/>',
        f'<text x="{width / 2}" y="{height - 15}" text-anchor="middle">offered QPS</text>',
        f'<text x="15" y="{height / 2}" transform="rotate(-90 15 {height / 2})" text-anchor="middle">'
        "SLO-meeting req/s</text>",
    ]
    for i, (policy, data) in enumerate(runs.items()):
        color = colors[i % len(colors)]
        points = " ".join("{:.1f},{:.1f}".format(*xy(s["qps"], s["slo_rps"])) for s in data["stages"])
        parts.append(f'<polyline points="{points}" fill="none" stroke="{color}" stroke-width="2"/>')
        parts.append(f'<text x="{width - pad + 5 - 90}" y="{pad + 16 * i}" fill="{color}">{policy}</text>')
    parts.append("</svg>")
    with open(path, "w") as fh:
        fh.write("\n".join(parts))


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a is not None and b else None
