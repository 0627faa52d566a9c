"""``bench metering [--quick | --live] [--plot FILE.svg]``: do the books hold against an adversarial client mix?

A real proxy process (production settings) in front of replicas of one shared endpoint, with LoRA slots, and one
always-failing replica of an endpoint that falls back to it. Three tenants share the endpoint, each with its own
reservation and one inference key per client kind (``metering_kinds``): disconnects at every phase, prompt arrays,
``n``/``best_of``, ``min_tokens``, tools, documents, adapters, fallbacks, retries, resumed streams, cancellations,
rate limiting. ``--opt scale=N`` sends N times the requests of each kind; ``--opt kinds=a,b`` runs only those;
``--opt tenants=rotate`` runs each kind once, for tenants A, B, C in turn (as ``--live`` does; ``--smoke``).

The modes: ``--quick`` (the test's) and the full mode (``scale=3``) run on two simulated replicas, each kind for
every tenant. ``--live`` runs on the real engine (``metering_live``: two CPU vLLM engines serving the tiny model,
each behind a fault relay; the failing primary is a port nobody listens on), each kind once, for tenants A, B, C in
turn, with the long answers shortened (``Fleet.work``): 3.5-5.5 minutes on two loaded cores, a minute of it the
engines' starts. ``metering.runtime`` says which (``sim`` or ``vllm``), ``metering.cases`` which kinds ran.

Attribution is exact by construction: the phases run one after the other, one tenant and one kind at a time, and
each starts and ends on an idle fleet (no request running or waiting on any replica, every record written, the
counters still), so the replicas' own counter deltas over a phase (``vllm:prompt_tokens_total``,
``vllm:prefix_cache_hits_total``, ``vllm:generation_tokens_total``, summed over every replica) are that tenant's
work of that kind. The phase's usage records are those of its key; records of any other key that finished inside
the window are strays. ``metering_books`` reconciles the two. The last line is JSON (``metering.*``).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx
from django.conf import settings

from benchmarks.billing import metering_live
from benchmarks.billing.metering_books import Charge, Phase, Tokens, by_kind, goals, phase_books, summarize
from benchmarks.billing.metering_kinds import Client, Fleet, Kind, kinds
from benchmarks.harness.security.world import SecurityWorld, world_create
from benchmarks.harness.throwaway_database import throwaway_database
from billing.models import UsageRecord
from capacity.runtimes.processes import free_port, sim_replica_argv, uvicorn_argv
from capacity.unit_resolver import coefficients_by_endpoint
from console.charts import Bar, bar_chart
from endpoints.models import Adapter, Endpoint, Replica, ReplicaState
from tenants.models import CapacityReservation, Tenant
from tenants.services import api_key_create

SPEED = 20.0  # simulated seconds per wall second
SMOKE = {"tenants": "rotate"}  # --smoke: each kind once, not once per tenant
SLOTS_PER_REPLICA = 4
RPM_LIMIT = 60  # each tenant's requests per minute on the shared endpoint: the rate-limit kind bursts past it
COUNTERS = {
    "vllm:prompt_tokens_total": "prompt",
    "vllm:prefix_cache_hits_total": "cached",
    "vllm:generation_tokens_total": "output",
}


@dataclass
class MeteringWorld(SecurityWorld):
    """The security bench's world (tenants A, B, C, the shared endpoint, the proxy machinery) plus the fleet the
    metering bench reconciles: two LoRA-capable replicas on the shared endpoint and a failing primary."""

    primary: object = None
    adapter: object = None
    lora_root: str = ""
    fleet_replicas: list[str] = field(default_factory=list)  # the replicas whose counters a phase reads
    shared_replicas: list[str] = field(default_factory=list)  # the shared endpoint's, as the proxy reaches them
    live: bool = False
    relays: dict = field(default_factory=dict)  # live: replica URL -> its FaultRelay
    progress: object = print

    def _start_proxy(self) -> str:
        if self.live:
            self._live_replicas()
        else:
            lora = ["--max-loras", "2"]
            for i in range(2):
                self._replica(self.shared, f"r{i}", lora)
            self._replica(self.primary, "r0", ["--fault", "error_rate=1.0"])
        port = free_port()
        env = self._proxy_env(INFERCAP_LORA_ROOT=self.lora_root)
        self.procs.spawn(uvicorn_argv("config.asgi:application", port), env=env, port=port, timeout=60)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + (180 if self.live else 60)
        body = {"model": self.shared.name, "prompt": "warm up", "max_tokens": 2}
        while True:  # serving once its snapshot holds the fleet
            try:
                response = httpx.post(
                    base + "/v1/completions", json=body, headers={"Authorization": f"Bearer {self.c.key}"}, timeout=10
                )
                if response.status_code == 200:
                    return base
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the proxy did not serve the shared endpoint in time")
            time.sleep(0.2)

    def _live_replicas(self) -> None:
        engines = metering_live.engines_start(self.procs, served_model_name=self.shared.name, progress=self.progress)
        for i, relay in enumerate(metering_live.relays_for(engines)):
            self.relays[relay.url] = relay
            self._row(self.shared, f"r{i}", relay.url, metering_live.LIVE_SLOTS_PER_REPLICA)
            self.shared_replicas.append(relay.url)
        self._row(self.primary, "r0", metering_live.dead_url(), SLOTS_PER_REPLICA)
        self.fleet_replicas = engines  # the counters straight from the engines, not through the relays

    def close(self) -> None:
        for relay in self.relays.values():
            relay.close()
        super().close()

    def _row(self, endpoint, name: str, url: str, slots: int) -> None:
        Replica.objects.create(
            endpoint=endpoint,
            name=f"{endpoint.name}-{name}",
            url=url,
            state=ReplicaState.READY,
            concurrency_limit=slots,
        )

    def _replica(self, endpoint, name: str, extra: list[str]) -> None:
        port = free_port()
        self.procs.spawn(
            sim_replica_argv(port, speed=SPEED, served_model_name=endpoint.name, extra=extra), port=port, timeout=60
        )
        url = f"http://127.0.0.1:{port}"
        self._row(endpoint, name, url, SLOTS_PER_REPLICA)
        self.fleet_replicas.append(url)
        if endpoint == self.shared:
            self.shared_replicas.append(url)


def metering_world_create(lora_root: str, *, live: bool = False, progress=print) -> MeteringWorld:
    base = world_create()
    world = MeteringWorld(**{name: getattr(base, name) for name in base.__dataclass_fields__})
    world.lora_root, world.live, world.progress = lora_root, live, progress
    shared = world.shared
    shared.launch_options = (
        {"max_loras": 2, "max_lora_rank": metering_live.LORA_MAX_RANK} if live else {"max_loras": 2}
    )
    shared.save(update_fields=["launch_options"])
    world.primary = Endpoint.objects.create(
        name=f"{world.tag}-primary",
        owner_tenant=None,
        model_profile=shared.model_profile,
        hardware_profile=shared.hardware_profile,
        runtime=shared.runtime,
        concurrency_limit=16,
        concurrency_max=16,
        fallback=shared,
    )
    artifact = f"{world.tag}-ft"
    # At the root and under its shared/ part: where a shared adapter lies depends on the adapter store's layout.
    if live:  # real weights, which the engine loads
        metering_live.lora_artifact_build(lora_root, artifact)
    for directory in () if live else (os.path.join(lora_root, artifact), os.path.join(lora_root, "shared", artifact)):
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "adapter_config.json"), "w") as config:
            json.dump({"r": 8, "base_model_name_or_path": shared.name, "peft_type": "LORA"}, config)
    world.adapter = Adapter.objects.create(
        name=f"{world.tag}-ft", owner_tenant=None, endpoint=shared, rank=8, artifact_path=artifact
    )
    for tenant in tenants_of(world):
        tenant.accepts_fallback = True
        tenant.save(update_fields=["accepts_fallback"])
        CapacityReservation.objects.create(tenant=tenant, endpoint=shared, mu_per_min=1e6, rpm_limit=RPM_LIMIT)
    return world


def tenants_of(world: MeteringWorld) -> list[Tenant]:
    return [world.a.tenant, world.b.tenant, world.c.tenant]


# -- the replicas' own counters ----------------------------------------------------------------------------------
def scrape(urls: list[str]) -> tuple[Tokens, float]:
    """Counters summed over the replicas, and the requests running or waiting on them."""
    sums = {"prompt": 0.0, "cached": 0.0, "output": 0.0}
    busy = 0.0
    for url in urls:
        for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in COUNTERS:
                sums[COUNTERS[name]] += float(line.rsplit(" ", 1)[1])
            elif name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
                busy += float(line.rsplit(" ", 1)[1])
    return Tokens(**sums), busy


def settle(urls: list[str], key_id: int, sent: int, *, timeout_s: float = 8.0) -> Tokens:
    """Wait for an idle fleet with still counters and the phase's records written (or the timeout: lost ones)."""
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        counters, busy = scrape(urls)
        records = UsageRecord.objects.filter(api_key_id=key_id).count()
        if busy == 0 and counters == last and records >= sent:
            return counters
        if time.monotonic() > deadline:
            return counters
        last = counters
        time.sleep(0.3)


def _wait_until_served(proxy: str, key: str, *, timeout_s: float = 15.0) -> None:
    """Until the proxy knows the phase's new key (its snapshot follows a key change within milliseconds, longer on
    a starved machine): a phase's requests refused as an unknown key would read as lost records."""
    deadline = time.monotonic() + timeout_s
    while True:
        response = httpx.get(f"{proxy}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=5)
        if response.status_code != 401 or time.monotonic() > deadline:
            return
        time.sleep(0.05)


# -- the run -----------------------------------------------------------------------------------------------------
def run(*, quick: bool, plot: str | None = None, live: bool = False, progress=print, **opts) -> dict:
    if settings.BACKENDS.embedded_database or settings.BACKENDS.embedded_redis:
        raise RuntimeError("bench metering starts a proxy, which needs PostgreSQL and Redis (DATABASE_URL, REDIS_URL)")
    if live and quick:
        raise RuntimeError("bench metering: --quick runs on the simulator, --live on the real engine; not both")
    scale = int(opts.get("scale", 1 if quick or live else 3))
    with throwaway_database("metering", progress), tempfile.TemporaryDirectory(prefix="metering-lora-") as lora_root:
        world = metering_world_create(lora_root, live=live, progress=progress)
        try:
            figures = _run_in(world, scale=scale, progress=progress, opts=opts)
        finally:
            world.close()
    if plot:
        _write_svg(plot, figures["metering.by_kind"])
        progress(f"plot written to {plot}")
    return figures


def _run_in(world: MeteringWorld, *, scale: int, progress, opts: dict) -> dict:
    runtime = "vllm" if world.live else "sim"
    progress(f"world {world.tag}: tenants A, B, C on {world.shared.name}; starting the proxy and {runtime}")
    fleet_kind = metering_live.LiveFleet if world.live else Fleet
    fleet = fleet_kind(
        proxy=world.proxy(),
        shared=world.shared.name,
        primary=world.primary.name,
        adapter=world.adapter.name,
        shared_replicas=world.shared_replicas,
        scale=scale,
        prompt_seed=world.tag,
    )
    if world.live:
        fleet.relays = world.relays
        fleet.work, fleet.context_words = metering_live.LIVE_WORK, metering_live.CONTEXT_WORDS
    rotate = world.live or opts.get("tenants") == "rotate"
    figures = _phases(world, fleet, progress, only=opts.get("kinds"), rotate=rotate)
    figures["metering.runtime"] = runtime
    return figures


def _phases(world: MeteringWorld, fleet: Fleet, progress, only: str | None = None, rotate: bool = False) -> dict:
    tenants = tenants_of(world)
    letters = {t.pk: letter for t, letter in zip(tenants, "ABC", strict=True)}
    coeffs = coefficients_by_endpoint([world.shared, world.primary])
    lora_factor = _lora_factor(coeffs[world.shared.pk])
    slots = len(fleet.shared_replicas) * (metering_live.LIVE_SLOTS_PER_REPLICA if world.live else SLOTS_PER_REPLICA)
    kind_list = kinds(slots=slots, burst=RPM_LIMIT + 15)
    wanted = [n.strip() for n in str(only or "").split(",") if n.strip()]
    if wanted:
        unknown = set(wanted) - {k.name for k in kind_list}
        if unknown:
            raise ValueError(f"no metering kind is named {', '.join(sorted(unknown))}")
        kind_list = [k for k in kind_list if k.name in wanted]
    books = []
    started = time.perf_counter()
    for i, kind in enumerate(kind_list):
        # rotate (live, smoke): each kind once, the tenants in turn (live engines decode ~30 tokens/s per stream on
        # loaded cores)
        for tenant in [tenants[i % len(tenants)]] if rotate else tenants:
            phase, errors = _phase(world, fleet, kind, tenant, coeffs[world.shared.pk], lora_factor)
            result = phase_books(phase)
            books.append(result)
            progress(
                f"{kind.name:<24} tenant {letters[tenant.pk]}: {result.requests} sent, {result.records} records "
                f"{dict(sorted(result.statuses.items()))}; computed {result.computed.total:.0f} tok / "
                f"{result.computed_work:.3f} MU, billed {result.billed.total:.0f} tok / {result.billed_work:.3f} MU"
                f"{f', LOST {result.lost}' if result.lost else ''}"
                f"{f', DUPLICATED {result.duplicates}' if result.duplicates else ''}"
                f"{f'; first error: {errors[0]}' if errors else ''}"
            )
    total = summarize(books)
    kinds_run = [k.name for k in kind_list]
    by_tenant = {}
    for tenant in tenants:
        mine = [b for b in books if b.tenant_id == tenant.pk]
        by_tenant[letters[tenant.pk]] = summarize(mine)
    progress(
        f"{len(books)} phases in {time.perf_counter() - started:.0f} s: unbilled {total['unbilled_fraction']:.2%}, "
        f"overbilled {total['overbilled_fraction']:.2%}, misattributed {total['misattributed_fraction']:.2%}, "
        f"lost {total['lost']}, duplicated {total['duplicates']}"
    )
    checks = goals(total, len(kinds_run))
    return {
        "metering.requests": total["requests"],
        "metering.records": total["records"],
        "metering.unbilled_fraction": total["unbilled_fraction"],
        "metering.overbilled_fraction": total["overbilled_fraction"],
        "metering.misattributed_fraction": total["misattributed_fraction"],
        "metering.lost_records": total["lost"],
        "metering.duplicate_records": total["duplicates"],
        "metering.cases": {"count": len(kinds_run), "kinds": kinds_run},
        "metering.goals": checks,
        "metering.passed": all(c["passed"] for c in checks.values()),
        "metering.computed_tokens": total["computed_tokens"],
        "metering.billed_tokens": total["billed_tokens"],
        "metering.computed_mu": total["computed_mu"],
        "metering.billed_mu": total["billed_mu"],
        "metering.adapter_loads": {"records": total["adapter_loads"], "mu": total["adapter_load_mu"]},
        "metering.platform_prompt_tokens": total["platform_prompt_tokens"],
        "metering.by_tenant": by_tenant,
        "metering.by_kind": by_kind(books),
        "metering.attribution": "sequential phases, one tenant and one kind each, on an idle fleet"
        + (" (each kind once, tenants A, B, C in turn)" if world.live else ""),
    }


def _phase(
    world: MeteringWorld, fleet: Fleet, kind: Kind, tenant: Tenant, coeffs, lora_factor: float
) -> tuple[Phase, list[str]]:
    row, raw = api_key_create(tenant=tenant, name=f"{world.tag} {kind.name}", scopes=["inference"])
    urls = world.fleet_replicas
    settle_s = 60.0 if world.live else 8.0  # live: a request its client left may run on to its end
    before = settle(urls, row.pk, 0, timeout_s=settle_s)
    _wait_until_served(fleet.proxy, raw)
    window_start = time.time()
    if kind.faults:
        targets = fleet.shared_replicas[:1] if kind.fault_first_replica_only else fleet.shared_replicas
        fleet.set_faults(targets, **kind.faults)
    try:
        sent = kind.send(Client(fleet, raw, tag=f"{tenant.slug}/{kind.name}"))
    finally:
        if kind.faults:
            fleet.clear_faults()
    after = settle(urls, row.pk, len(sent), timeout_s=settle_s)
    window_end = time.time()
    records = list(UsageRecord.objects.filter(api_key_id=row.pk))
    strays = UsageRecord.objects.exclude(api_key_id=row.pk).filter(
        finished_at__gte=_aware(window_start), finished_at__lte=_aware(window_end)
    )
    computed = Tokens(after.prompt - before.prompt, after.cached - before.cached, after.output - before.output)
    phase = Phase(
        kind=kind.name,
        tenant_id=tenant.pk,
        sent=len(sent),
        response_ids=[s.request_id for s in sent if s.request_id],
        computed=computed,
        charges=[_charge(r, world, lora_factor) for r in records],
        strays=[_charge(r, world, lora_factor) for r in strays],
        coeffs=coeffs,
    )
    errors = [f"{s.status} {s.error}" for s in sent if s.error and s.status != 429]
    return phase, errors


def _charge(record: UsageRecord, world: MeteringWorld, lora_factor: float) -> Charge:
    return Charge(
        request_id=record.request_id,
        tenant_id=record.tenant_id,
        tokens=Tokens(record.input_tokens, record.cached_tokens, record.output_tokens),
        mu=record.mu,
        adapter_factor=lora_factor if record.adapter else 1.0,
        status=record.status,
        load_mu=record.adapter_load_mu,
        platform_prompt=record.platform_prompt_tokens,
    )


def _aware(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, tz=UTC)


def _lora_factor(coeffs) -> float:
    """The proxy's price factor for an adapter on this endpoint (``snapshot_loader.lora_mu_factor``)."""
    fitted = coeffs.lora_overhead
    overhead = fitted if fitted is not None else float(settings.INFERCAP.get("LORA_MU_OVERHEAD", 0.0))
    return 1.0 + max(0.0, overhead)


def _write_svg(path: str, kinds_books: dict[str, dict]) -> None:
    bars = []
    for kind, books in kinds_books.items():
        computed = books["computed_tokens"]
        billed = books["billed_tokens"]
        bars.append(Bar(f"{kind} computed", computed["prompt"] + computed["output"]))
        bars.append(
            Bar(
                f"{kind} billed",
                billed["prompt"] + billed["output"],
                note=f"unbilled {books['unbilled_fraction']:.1%}" if books["unbilled_fraction"] else "",
            )
        )
    svg = bar_chart("bench metering: tokens the replicas computed vs tokens billed, per client kind", bars, unit="tok")
    with open(path, "w") as out:
        out.write(svg)
