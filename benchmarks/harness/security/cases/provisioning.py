"""Provisioning: a tenant cannot make the platform start more than its quota, put flags or foreign weights into a
replica's command line, steer another tenant's Kubernetes Deployment through the name it chooses, learn other
tenants' endpoint names from the uniqueness error, or read a shared endpoint's totals, replica placement or
placement launch options in the API or the console.

Each case attacks the real code: the REST API as the tenant (Django's test client, session and Bearer), the
autoscaler's own decision functions (``horizontal_inputs`` → ``horizontal.decide``, ``launch_allowance``) on rows
written past the API, the local actuator's ``replica_argv``, the Kubernetes actuator's name functions, the console
page through the test client. Everything they create is rolled back with the case.
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta
from unittest import mock

from django.test import Client, TestCase
from django.urls import reverse
from django.utils import timezone

from benchmarks.harness.security.registry import expect, security_case
from benchmarks.harness.security.world import SecurityWorld
from billing.models import UsageRecord
from billing.rollups import usage_rollup_run
from capacity.autoscaling import horizontal, store, ticks
from capacity.autoscaling import services as autoscaling
from capacity.autoscaling.actuators import kubernetes_objects
from capacity.autoscaling.actuators.local import replica_argv
from capacity.autoscaling.limits import launch_allowance
from capacity.models import AutoscalerDecision, HardwareProfile
from capacity.runtimes.vllm import argv_model
from capacity.services import simulated_profiles_get_or_create
from console import live
from endpoints.models import Endpoint, EndpointVersion, Replica, ReplicaState, Rollout, Runtime
from endpoints.rollouts import services as rollouts
from endpoints.services import replica_transition
from tenants.models import CapacityReservation
from tenants.quotas import live_usage, quota_for


def _endpoint_payload(name: str, **extra) -> dict:
    hardware, model = simulated_profiles_get_or_create()
    return {"name": name, "model_profile": model.pk, "hardware_profile": hardware.pk, "runtime": "sim", **extra}


def _endpoint(world: SecurityWorld, label: str, *, owner, **fields):
    """A fresh endpoint (rolled back with the case), written directly: what a row created before a check looks like."""
    hardware, model = simulated_profiles_get_or_create()
    defaults = {"model_profile": model, "hardware_profile": hardware, "runtime": Runtime.SIM}
    return Endpoint.objects.create(
        name=f"{world.tag}-{label}-{uuid.uuid4().hex[:4]}", owner_tenant=owner, **{**defaults, **fields}
    )


def _flat(endpoint, **fields):
    """Write fields past every service check, as SQL or a row older than the check would hold them."""
    type(endpoint).objects.filter(pk=endpoint.pk).update(**fields)
    endpoint.refresh_from_db()
    return endpoint


# -- quotas and launch caps ------------------------------------------------------------------------------------
@security_case(
    "capacity.quotas",
    "a tenant admin asks for thousands of replicas, GPUs or warm replicas, raises its own quota, or has such a row "
    "in the database for the autoscaler to launch",
)
def quotas(world: SecurityWorld) -> str:
    tenant = world.a.tenant
    quota = quota_for(tenant)
    mine = world.a.endpoint
    before = Endpoint.objects.filter(pk=mine.pk).values("min_replicas", "max_replicas", "warm_pool_size").get()
    refusals = _api_refuses_past_quota(world, mine)
    expect(not Endpoint.objects.filter(name=f"{world.tag}-greedy").exists(), "the greedy endpoint was created")
    after = Endpoint.objects.filter(pk=mine.pk).values("min_replicas", "max_replicas", "warm_pool_size").get()
    expect(after == before, f"A's endpoint changed: {before} -> {after}")
    tenant.refresh_from_db()
    expect(quota_for(tenant) == quota, "A's quota changed")
    _endpoint_count_capped(world)
    decided, by_gpus, launches, warm = _autoscaler_stops_at_quota(world, quota)
    return (
        f"{len(refusals)} API attempts (admin, write key) 400 on quota, raising its own quota refused, endpoint "
        f"count capped; past the API the autoscaler decides {decided} (quota {quota.max_replicas}), "
        f"{by_gpus}x8 GPUs (quota {quota.max_gpus}), launches {launches}/tick, warm pool {warm}"
    )


def _api_refuses_past_quota(world: SecurityWorld, mine) -> list[str]:
    """Through the API, as the admin and as a write key: each field beyond the quota is a field error, and raising
    the tenant's own quota is refused."""
    refusals = []
    for who, label in ((world.a.admin, "admin"), (world.a.keys["write"], "write key")):
        api = world.api(who)
        attempts = {
            "create min_replicas 5000": (
                api.post(
                    reverse("endpoint-list"),
                    _endpoint_payload(f"{world.tag}-greedy", min_replicas=5000, max_replicas=5000),
                    format="json",
                ),
                "min_replicas",
            ),
            "max_replicas 5000": (
                api.patch(reverse("endpoint-detail", args=[mine.pk]), {"max_replicas": 5000}, format="json"),
                "max_replicas",
            ),
            "warm_pool_size 500": (
                api.patch(reverse("endpoint-detail", args=[mine.pk]), {"warm_pool_size": 500}, format="json"),
                "warm_pool_size",
            ),
        }
        for attempt, (response, field) in attempts.items():
            body = response.json() if response.status_code == 400 else {}
            expect(
                response.status_code == 400 and "quota" in str(body.get(field)),
                f"{label} {attempt}: answered {response.status_code} {response.content[:160]}",
            )
            refusals.append(attempt)
        raised = api.patch(
            reverse("tenant-quota-detail", args=[world.a.tenant.pk]),
            {"max_replicas": 10_000, "max_gpus": 10_000},
            format="json",
        )
        expect(raised.status_code in (403, 404), f"{label} raising its own quota answered {raised.status_code}")
    return refusals


def _endpoint_count_capped(world: SecurityWorld) -> None:
    """The endpoint count, at a quota of 1 (A already has its one endpoint)."""
    tenant = world.a.tenant
    tenant.quota_max_endpoints = 1
    tenant.save(update_fields=["quota_max_endpoints"])
    client = Client()
    client.force_login(world.a.admin)
    extra = client.post(
        reverse("endpoint-list"), _endpoint_payload(f"{world.tag}-second"), content_type="application/json"
    )
    expect(
        extra.status_code == 400 and "quota" in str(extra.json().get("owner_tenant")),
        f"a second endpoint past a quota of 1 answered {extra.status_code}",
    )


def _autoscaler_stops_at_quota(world: SecurityWorld, quota) -> tuple[int, int, int, int]:
    """Past the API (a row written in SQL or before quotas): the autoscaler's decision stops at the quota, and one
    reconcile launches at most the per-tick cap. (replicas decided, 8-GPU replicas decided, launches, warm)"""
    tenant = world.a.tenant
    greedy = _flat(_endpoint(world, "flat", owner=tenant), min_replicas=5000, max_replicas=5000, desired_replicas=5000)
    eight = HardwareProfile.objects.create(
        name=f"{world.tag}-8gpu",
        gpu_type="H100 (bench)",
        gpus_per_replica=8,
        gpu_memory_gb=80,
        memory_bandwidth_gbps=3350,
        usd_per_gpu_hour=4.0,
    )
    wide = _flat(_endpoint(world, "wide", owner=tenant, hardware_profile=eight), min_replicas=6, max_replicas=6)
    try:
        decision = horizontal.decide(ticks.horizontal_inputs(greedy, now=time.time()))
        by_gpus = horizontal.decide(ticks.horizontal_inputs(wide, now=time.time()))
    finally:  # the decision appended a demand sample per endpoint: leave no key behind for rolled-back ids
        store.client().delete(*(store.SAMPLES_KEY.format(endpoint_id=e.pk) for e in (greedy, wide)))
    expect(decision.desired <= quota.max_replicas, f"min_replicas 5000 decided {decision.desired} replicas")
    expect(
        by_gpus.desired * 8 <= quota.max_gpus,
        f"6 replicas of 8 GPUs decided {by_gpus.desired} ({quota.max_gpus} GPUs)",
    )
    per_tick = autoscaling.LaunchBudget().left
    launches, _ = launch_allowance(
        wanted=decision.desired,
        standby=False,
        left=autoscaling.quota_left(greedy, exclude_own_serving=False),
        gpus_per_replica=1,
        per_tick_left=per_tick,
    )
    expect(launches <= min(per_tick, quota.max_replicas), f"one reconcile may launch {launches}")
    warm_row = _flat(greedy, warm_pool_size=500)
    warm, _ = launch_allowance(
        wanted=500,
        standby=True,
        left=autoscaling.quota_left(warm_row, exclude_own_serving=False),
        gpus_per_replica=1,
        per_tick_left=per_tick,
    )
    expect(warm <= quota.max_warm_pool, f"a warm pool of 500 may start {warm}")
    return decision.desired, by_gpus.desired, launches, warm


# -- launch options ------------------------------------------------------------------------------------------------
DANGEROUS_OPTIONS = [
    {"model": "--trust-remote-code"},
    {"model": "attacker/poisoned-weights"},
    {"tensor_parallel_size": 8},
    {"gpu_memory_utilization": 1.0},
    {"dtype": "float32"},
    {"executable": "/bin/sh"},
    {"extra_args": ["--trust-remote-code"]},
    {"host": "0.0.0.0"},
    {"actuator": "kubernetes"},
    {"deployment": "victim-deployment"},
    {"namespace": "kube-system"},
]
BAD_VALUES = [
    {"max_num_seqs": "8 --enforce-eager"},
    {"profile": "-h"},
    {"profile": "tiny --fault crash=1"},
    {"profile_opts": {"--x": 1}},
    {"max_num_seqs": 10**9},
]


@security_case(
    "capacity.launch_options_allowlist",
    "a tenant sets launch options that inject engine flags, load other weights or pick placement, or has such a "
    "row stored for the actuator to launch",
)
def launch_options_allowlist(world: SecurityWorld) -> str:
    mine = world.a.endpoint
    stored = dict(mine.launch_options or {})
    wrong = []
    for who, label in ((world.a.admin, "admin"), (world.a.keys["write"], "write key")):
        api = world.api(who)
        for options in DANGEROUS_OPTIONS:
            created = api.post(
                reverse("endpoint-list"),
                _endpoint_payload(f"{world.tag}-launch", runtime="vllm", launch_options=options),
                format="json",
            )
            patched = api.patch(reverse("endpoint-detail", args=[mine.pk]), {"launch_options": options}, format="json")
            for verb, response in (("create", created), ("PATCH", patched)):
                if response.status_code != 400 or "only operators may set" not in str(response.json()):
                    wrong.append(f"{label} {verb} {options}: {response.status_code}")
        for options in BAD_VALUES:
            response = api.patch(
                reverse("endpoint-detail", args=[mine.pk]), {"launch_options": options}, format="json"
            )
            if response.status_code != 400 or "launch_options" not in response.json():
                wrong.append(f"{label} value {options}: {response.status_code}")
    expect(not wrong, "accepted: " + "; ".join(wrong[:4]))
    expect(not Endpoint.objects.filter(name=f"{world.tag}-launch").exists(), "an endpoint was created")
    mine.refresh_from_db()
    expect((mine.launch_options or {}) == stored, f"A's launch options changed: {mine.launch_options}")
    allowed = world.api(world.a.admin).patch(
        reverse("endpoint-detail", args=[mine.pk]), {"launch_options": {"speed": 2.0}}, format="json"
    )
    expect(allowed.status_code == 200, f"an allowlisted option was refused ({allowed.status_code}): proves nothing")

    # A hostile row already stored (SQL, or written before the allowlist): the argv serves the model profile, and
    # a flag-shaped value either never reaches it or stops the launch.
    row = _flat(
        _endpoint(world, "argv", owner=world.a.tenant),
        runtime="vllm",
        launch_options={"model": "--trust-remote-code", "max_num_seqs": 32},
    )
    argv = replica_argv(row, port=8001)
    expect(argv_model(argv) == row.model_profile.name, f"the argv serves {argv_model(argv)}")
    expect("--trust-remote-code" not in argv, f"the stored flag reached the argv: {argv}")
    expect(argv[argv.index("--served-model-name") + 1] == row.name, "the served model name is not the endpoint's")
    refused = []
    for options in ({"dtype": "--trust-remote-code"}, {"max_num_seqs": "8 --enforce-eager"}, {"executable": "-c"}):
        try:
            replica_argv(_flat(row, launch_options=options), port=8001)
        except ValueError:
            refused.append(next(iter(options)))
    expect(len(refused) == 3, f"hostile stored values built an argv; refused only {refused}")
    return (
        f"{len(DANGEROUS_OPTIONS)} operator-only options and {len(BAD_VALUES)} bad values 400 for admin and write "
        f"key; a stored '--trust-remote-code' model serves '{row.model_profile.name}', flag-shaped values raise"
    )


# -- Kubernetes Deployment names --------------------------------------------------------------------------------
@security_case(
    "capacity.deployment_names_from_ids",
    "tenant B names its endpoint so that it normalises to tenant A's Deployment, or sets A's Deployment by name",
)
def deployment_names_from_ids(world: SecurityWorld) -> str:
    names = {}
    for side, name in ((world.a, f"{world.tag}-Llama.3.70B"), (world.b, f"{world.tag}-llama_3_70b")):
        created = world.api(side.admin).post(reverse("endpoint-list"), _endpoint_payload(name), format="json")
        expect(created.status_code == 201, f"creating {name} failed ({created.status_code}): proves nothing")
        names[side.tenant.slug] = Endpoint.objects.get(pk=created.json()["id"])
    a, b = names.values()
    # The actuator is the operators' choice; set it as they would, for both.
    for endpoint in (a, b):
        _flat(endpoint, launch_options={"actuator": "kubernetes"})
    derived = {
        endpoint.pk: {
            kubernetes_objects.deployment_name(endpoint),
            kubernetes_objects.standby_deployment_name(endpoint),
            kubernetes_objects.version_deployment_name(endpoint, 2),
        }
        for endpoint in (a, b)
    }
    expect(not derived[a.pk] & derived[b.pk], f"A and B share a Deployment: {derived[a.pk] & derived[b.pk]}")
    for endpoint in (a, b):
        expect(
            kubernetes_objects.deployment_name(endpoint) == f"infercap-ep-{endpoint.pk}",
            f"{endpoint.name} runs in {kubernetes_objects.deployment_name(endpoint)}",
        )
        expect(
            not any("llama" in n for n in derived[endpoint.pk]), f"named after the endpoint: {derived[endpoint.pk]}"
        )
    aimed = world.api(world.b.admin).patch(
        reverse("endpoint-detail", args=[b.pk]),
        {"launch_options": {"actuator": "kubernetes", "deployment": kubernetes_objects.deployment_name(a)}},
        format="json",
    )
    expect(aimed.status_code == 400, f"B aiming its endpoint at A's Deployment answered {aimed.status_code}")
    b.refresh_from_db()
    expect(kubernetes_objects.deployment_name(b) == f"infercap-ep-{b.pk}", "B's Deployment changed")
    return (
        f"'Llama.3.70B' and 'llama_3_70b' run in {kubernetes_objects.deployment_name(a)} / {kubernetes_objects.deployment_name(b)} "
        "(standby and version names distinct too); B naming A's Deployment is 400"
    )


# -- endpoint names ------------------------------------------------------------------------------------------------
@security_case(
    "isolation.endpoint_name_leak",
    "tenant A probes whether B (or the operators) hold an endpoint name by creating or renaming onto it",
)
def endpoint_name_leak(world: SecurityWorld) -> str:
    shared = _endpoint(world, "shared-probe", owner=None)
    mine = world.a.endpoint
    api = world.api(world.a.admin)
    answers = {}
    for label, name in (("B's", world.b.endpoint.name), ("a shared", shared.name), ("its own", mine.name)):
        created = api.post(reverse("endpoint-list"), _endpoint_payload(name), format="json")
        expect(created.status_code == 400, f"creating {label} name answered {created.status_code}")
        answers[f"create {label}"] = created.json().get("name")
        if name != mine.name:
            renamed = api.patch(reverse("endpoint-detail", args=[mine.pk]), {"name": name}, format="json")
            expect(renamed.status_code == 400, f"renaming onto {label} name answered {renamed.status_code}")
            answers[f"rename {label}"] = renamed.json().get("name")
    distinct = {str(a) for a in answers.values()}
    expect(len(distinct) == 1, f"the answers differ by holder: {answers}")
    message = distinct.pop()
    for secret in (world.b.tenant.name, world.b.tenant.slug, "exists", "endpoint", "another tenant"):
        expect(secret.lower() not in message.lower(), f"the message says {secret!r}: {message}")
    mine.refresh_from_db()
    expect(mine.name == f"{world.a.tenant.slug}-model", f"A's endpoint was renamed to {mine.name}")
    free = api.post(reverse("endpoint-list"), _endpoint_payload(f"{world.tag}-free-name"), format="json")
    expect(free.status_code == 201, f"a free name was refused too ({free.status_code}): proves nothing")
    expect(Endpoint.objects.filter(name=world.b.endpoint.name).count() == 1, "B's name was duplicated")
    return f"create/rename onto B's, a shared and its own name: one answer {message!r}; a free name 201"


# -- console figures of a shared endpoint --------------------------------------------------------------------------
@security_case(
    "console.shared_totals",
    "tenant A opens the console page of a shared endpoint to read B's reservation, demand and the replicas' pids",
)
def shared_totals(world: SecurityWorld) -> str:
    now = timezone.now()
    shared = _endpoint(world, "shared-console", owner=None)
    Replica.objects.create(
        endpoint=shared, name="r-secret", state=ReplicaState.READY, actuator="local", actuator_ref="424242"
    )
    CapacityReservation.objects.create(tenant=world.a.tenant, endpoint=shared, mu_per_min=123.0)
    CapacityReservation.objects.create(tenant=world.b.tenant, endpoint=shared, mu_per_min=4567.0)
    for side, count in ((world.a, 2), (world.b, 9)):
        for n in range(count):
            at = now - timedelta(minutes=2, seconds=n)
            UsageRecord.objects.create(
                request_id=f"{world.tag}-console-{side.tenant.slug}-{n}",
                tenant=side.tenant,
                endpoint=shared,
                status="ok",
                started_at=at,
                finished_at=at,
            )
    usage_rollup_run(now=now)
    secret_reason = f"scale up: {world.tag}-b-secret-demand"
    AutoscalerDecision.objects.create(
        endpoint=shared, axis="horizontal", current=1, desired=3, reason=secret_reason, at=now
    )
    url = reverse("console:endpoint", args=[shared.pk])
    leaks = {"B's reservation": "4,567", "the total sold": "4,690", "B's demand": secret_reason, "the pid": "424242"}
    for who, label in ((world.a.member, "A's member"), (world.a.admin, "A's admin")):
        client = Client()
        client.force_login(who)
        response = client.get(url)
        expect(response.status_code == 200, f"{label} cannot open the page ({response.status_code}): proves nothing")
        page = response.content.decode()
        expect('id="own-figures"' in page and "123.0 MU/min" in page, f"{label} does not see its own reservation")
        seen = [what for what, text in leaks.items() if text in page]
        expect(not seen, f"{label} sees {', '.join(seen)}")
        expect("Queue depth by class" not in page, f"{label} sees the queue depth by class")
    operator = Client()
    operator.force_login(world.operator)
    whole = operator.get(url).content.decode()
    # The operator's page shows the totals (not per-tenant rows): the same texts are there to be hidden.
    missing = [what for what, text in leaks.items() if text not in whole and what != "B's reservation"]
    expect(not missing, f"the operator's page lacks {', '.join(missing)}: the case proves nothing")
    outsider = Client()
    outsider.force_login(world.b.member)
    # B reserves too, so B sees its own figures and not A's.
    b_page = outsider.get(url).content.decode()
    expect("4,567.0 MU/min" in b_page and "123.0 MU/min" not in b_page, "B's page shows A's reservation")
    return "A's member and admin see their 123 MU/min only: no B reservation, total, demand reason, pid or queues"


# -- replica placement on shared endpoints --------------------------------------------------------------------------
def _failed_kubernetes_replica(endpoint, *, pod: str, host: str, pid: int) -> Replica:
    """A replica whose placement (pod, address, actuator, pid) is what a reserving tenant must not learn."""
    replica = Replica.objects.create(
        endpoint=endpoint,
        name=pod,
        url=f"http://{host}:8000",
        actuator="kubernetes",
        actuator_ref=pod,
        state=ReplicaState.STARTING,
    )
    replica_transition(replica=replica, to_state=ReplicaState.FAILED, reason=f"pid {pid} exited on {host}")
    return replica


@security_case(
    "isolation.replica_placement_hidden",
    "tenant A lists a shared endpoint's replicas to learn their addresses, actuator, pod names and pids",
)
def replica_placement_hidden(world: SecurityWorld) -> str:
    shared = _endpoint(world, "shared-replicas", owner=None)
    CapacityReservation.objects.create(tenant=world.a.tenant, endpoint=shared, mu_per_min=10.0)
    pod = f"infercap-ep-{shared.pk}-5d8f9c-x2x9q"
    replica = _failed_kubernetes_replica(shared, pod=pod, host="10.42.7.19", pid=31337)
    secrets_ = (pod, "10.42.7.19", "31337", "kubernetes")
    for who, label in ((world.a.member, "A's member"), (world.a.keys["read"], "A's read key")):
        api = world.api(who)
        listed = api.get(reverse("replica-list"), {"endpoint": shared.pk})
        detail = api.get(reverse("replica-detail", args=[replica.pk]))
        expect(listed.status_code == 200 and detail.status_code == 200, f"{label} cannot read them: proves nothing")
        expect(detail.json()["state"] == ReplicaState.FAILED, f"{label} does not see the replica's state")
        for response in (listed, detail):
            seen = [s for s in secrets_ if s in response.content.decode()]
            expect(not seen, f"{label} sees {seen}")
        probe = api.get(reverse("replica-list"), {"endpoint": shared.pk, "actuator": "kubernetes"})
        expect(probe.json()["results"] == [], f"{label}: ?actuator=kubernetes matches the replica")
    operator = world.api(world.operator).get(reverse("replica-detail", args=[replica.pk])).json()
    expect(operator["url"] == "http://10.42.7.19:8000", "the operator does not see the URL: proves nothing")
    return "A's member and read key see state and health as replica-<id>; no URL, actuator, pod name or pid"


@security_case(
    "console.replica_placement_hidden",
    "tenant A opens the console page of a shared endpoint, or listens on its console socket, to learn where the "
    "replicas run: pod names, addresses, actuator, pids",
)
def console_replica_placement_hidden(world: SecurityWorld) -> str:
    shared = _endpoint(world, "shared-console-replicas", owner=None)
    CapacityReservation.objects.create(tenant=world.a.tenant, endpoint=shared, mu_per_min=10.0)
    pod = f"infercap-ep-{shared.pk}-7c4b1d-q8w2z"
    sent: list[tuple[list[str], dict]] = []
    # The receivers' real events, captured where they would go to the channel layer (the case's transaction is
    # rolled back, so on-commit callbacks are run here).
    with mock.patch.object(live, "_send", lambda groups, message: sent.append((groups, message))):
        with TestCase.captureOnCommitCallbacks(execute=True):
            replica = _failed_kubernetes_replica(shared, pod=pod, host="10.42.9.23", pid=27183)
    secrets_ = (pod, "10.42.9.23", "pid 27183", "kubernetes")
    url = reverse("console:endpoint", args=[shared.pk])
    for who, label in ((world.a.member, "A's member"), (world.a.admin, "A's admin")):
        client = Client()
        client.force_login(who)
        response = client.get(url)
        expect(response.status_code == 200, f"{label} cannot open the page ({response.status_code}): proves nothing")
        page = response.content.decode()
        expect(f"replica-{replica.pk}<" in page, f"{label} does not see the replica under its neutral name")
        seen = [text for text in secrets_ if text in page]
        expect(not seen, f"{label}'s page shows {seen}")
    a_events = [m["payload"] for groups, m in sent if live.tenant_group(world.a.tenant.pk) in groups]
    expect(
        [e["state"] for e in a_events if e.get("replica_id") == replica.pk] == ["starting", "failed"],
        f"A's socket does not hear the replica's states ({a_events}): proves nothing",
    )
    seen = [text for text in secrets_ if text in repr(a_events)]
    expect(not seen, f"A's socket hears {seen}")
    operators = [m["payload"] for groups, m in sent if live.OPERATORS_GROUP in groups]
    expect({e["replica"] for e in operators} == {pod}, "the operators do not hear the pod name: proves nothing")
    operator = Client()
    operator.force_login(world.operator)
    expect(pod in operator.get(url).content.decode(), "the operator's page lacks the pod name: proves nothing")
    return "A's member and admin see replica-<id> and its state; page and socket name no pod, IP, actuator or pid"


@security_case(
    "isolation.shared_launch_options_hidden",
    "tenant A reads a shared endpoint's launch options to learn its actuator, Deployment, namespace and CPU placement",
)
def shared_launch_options_hidden(world: SecurityWorld) -> str:
    placement = {
        "actuator": "kubernetes",
        "deployment": f"{world.tag}-prod-70b-east",
        "namespace": f"{world.tag}-gpu-pool",
        "cpuset": "cpus 41,43,47",
    }
    tuning = {"max_model_len": 8192}
    shared = _endpoint(world, "shared-options", owner=None, launch_options={**placement, **tuning})
    CapacityReservation.objects.create(tenant=world.a.tenant, endpoint=shared, mu_per_min=10.0)
    for who, label in (
        (world.a.member, "A's member"),
        (world.a.admin, "A's admin"),
        (world.a.keys["read"], "A's read key"),
    ):
        api = world.api(who)
        listed = api.get(reverse("endpoint-list"), {"page_size": 500})
        detail = api.get(reverse("endpoint-detail", args=[shared.pk]))
        expect(listed.status_code == 200 and detail.status_code == 200, f"{label} cannot read it: proves nothing")
        expect(detail.json()["launch_options"] == tuning, f"{label} reads {detail.json()['launch_options']}")
        for response in (listed, detail):
            seen = [key for key, value in placement.items() if str(value) in response.content.decode()]
            expect(not seen, f"{label} reads the {', '.join(seen)}")
    client = Client()
    client.force_login(world.a.member)
    page = client.get(reverse("console:endpoint", args=[shared.pk])).content.decode()
    seen = [key for key, value in placement.items() if str(value) in page]
    expect(not seen, f"A's console page shows the {', '.join(seen)}")
    operator = world.api(world.operator).get(reverse("endpoint-detail", args=[shared.pk])).json()
    expect(operator["launch_options"] == {**placement, **tuning}, "the operator does not read them: proves nothing")
    return "A's member, admin and read key read max_model_len only; no actuator, Deployment, namespace or cpuset"


# -- rollout surges --------------------------------------------------------------------------------------------------
@security_case(
    "capacity.rollout_surge_quota",
    "at a full quota, tenant A changes its endpoint's launch options so that a rollout surges replicas beyond it",
)
def rollout_surge_quota(world: SecurityWorld) -> str:
    tenant = world.a.tenant
    endpoint = _endpoint(world, "surge", owner=tenant, launch_options={"actuator": "local"}, max_replicas=2)
    for n in range(2):  # rows only: the local actuator's replicas, running as far as the rollout can tell
        Replica.objects.create(
            endpoint=endpoint, name=f"local-bench-{n}", actuator="local", state=ReplicaState.READY, url=""
        )
    held = live_usage(tenant.pk).serving_replicas
    tenant.quota_max_replicas = held  # full: every replica the quota allows is running
    tenant.save(update_fields=["quota_max_replicas"])
    versions = EndpointVersion.objects.filter(endpoint=endpoint).count()
    url = reverse("endpoint-detail", args=[endpoint.pk])
    change = {"launch_options": {"actuator": "local", "speed": 3.0}}
    for who, label in ((world.a.admin, "admin"), (world.a.keys["write"], "write key")):
        response = world.api(who).patch(url, change, format="json")
        expect(response.status_code == 400, f"{label}: the change answered {response.status_code}")
        message = str(response.json().get("max_surge"))
        expect("quota" in message, f"{label}: refused without naming the quota: {response.content[:160]}")
    expect(not Rollout.objects.filter(endpoint=endpoint).exists(), "a rollout was started")
    expect(EndpointVersion.objects.filter(endpoint=endpoint).count() == versions, "a version was left behind")
    # One replica of room: the same change starts a rollout whose surge is capped to it.
    tenant.quota_max_replicas = held + 1
    tenant.save(update_fields=["quota_max_replicas"])
    response = world.api(world.a.admin).patch(url, change, format="json")
    expect(
        response.status_code == 200, f"with room for one the change failed ({response.status_code}): proves nothing"
    )
    rollout = Rollout.objects.get(endpoint=endpoint)
    expect(rollout.max_surge == 1, f"the rollout surges {rollout.max_surge} with room for 1")
    # An operator starting one on the tenant's endpoint is held to the same quota.
    rollouts.rollback_rollout(rollout=rollout, user=world.operator, reason="bench")
    Rollout.objects.filter(pk=rollout.pk).update(state="rolled_back")
    tenant.quota_max_replicas = held
    tenant.save(update_fields=["quota_max_replicas"])
    v3 = rollouts.create_version(
        endpoint=endpoint, user=world.operator, launch_options={"actuator": "local", "speed": 4.0}
    )
    started = world.api(world.operator).post(
        reverse("rollout-list"), {"endpoint": endpoint.pk, "to_version": v3.pk, "max_surge": 4}, format="json"
    )
    expect(
        started.status_code == 400 and "max_surge" in started.json(), f"the operator's start: {started.status_code}"
    )
    return (
        f"at a full quota ({held} replicas) the tenant's change is 400 on max_surge, nothing left behind; with room "
        "for one the rollout surges 1; an operator's start at a full quota is 400 too"
    )
