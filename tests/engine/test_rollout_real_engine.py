"""The local actuator runs the ``vllm`` runtime for real, and a rollout between two model builds fails no request.

The actuator starts v1's vLLM replica from the engine interpreter with the platform's command line and
environment, marks it ready once ``GET /health`` answers 200 and records its cold start; under steady traffic
through the real proxy a rollout then starts v2's surge replica beside it, both builds serve, and the old replica
is drained and stopped with its whole process group. Two engine starts (~50-110 s each here): the package's
engines cannot be the old version, since the rollout stops its replica.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import httpx
import pytest

from capacity.autoscaling.actuators.local import pid_alive
from capacity.autoscaling.services import reconcile
from capacity.runtimes.processes import ENGINE_MODEL_DIR, ENGINE_PY, engine_installed
from endpoints.models import Endpoint, Replica, ReplicaState, RolloutState
from endpoints.rollouts import services
from endpoints.rollouts.selectors import version_stats
from tenants.models import CapacityReservation
from tests.autoscaling.conftest import clean_store, reap_local_replicas  # noqa: F401
from tests.engine.engine import INSTALL_HINT, STARTUP_TIMEOUT_S, build_model
from tests.factories import ModelProfileFactory
from tests.proxy.conftest import spawn_proxy
from tests.rollouts.test_rollout_e2e import SteadyTraffic, alive_count, drive, finished
from tests.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# The second build: the same recipe from another seed (other weights and tokenizer merges), built beside the first
# under INFERCAP["VLLM_MODELS_DIR"], where the local actuator looks a model profile's name up.
V2_MODEL_DIR = ENGINE_MODEL_DIR.parent / f"{ENGINE_MODEL_DIR.name}-seed1"
LOCAL_VLLM = {"actuator": "local", "cpu_kvcache_gib": 1, "autoscale": False}


@pytest.fixture
def engine_available():
    """The engine environment, without starting the session engine (this test starts its own replicas)."""
    if os.environ.get("INFERCAP_SKIP_ENGINE") == "1":
        pytest.skip("INFERCAP_SKIP_ENGINE=1: the real vLLM engine tests are skipped")
    if not engine_installed():
        pytest.fail(f"the real vLLM engine is not installed: {INSTALL_HINT}", pytrace=False)
    build_model(ENGINE_MODEL_DIR)
    build_model(V2_MODEL_DIR, seed=1)


@pytest.mark.usefixtures("engine_available", "clean_store", "reap_local_replicas")
def test_a_rollout_between_two_real_model_builds_fails_no_request(procs, tenant_a):
    started = time.monotonic()
    v1_profile = ModelProfileFactory(name=ENGINE_MODEL_DIR.name, parameters_b=0.003, weights_gb=0.01)
    v2_profile = ModelProfileFactory(name=V2_MODEL_DIR.name, parameters_b=0.003, weights_gb=0.01)
    Endpoint.objects.filter(pk=tenant_a.endpoint.pk).update(
        runtime="vllm",
        model_profile=v1_profile,
        launch_options=LOCAL_VLLM,
        min_replicas=0,
        max_replicas=2,
        desired_replicas=1,
        ttft_slo_ms=60_000,
        tpot_slo_ms=2_000,
    )
    endpoint = Endpoint.objects.get(pk=tenant_a.endpoint.pk)
    # room for steady traffic: the tenant's reservation must not be what limits it
    CapacityReservation.objects.filter(endpoint=endpoint).update(mu_per_min=1e6, rpm_limit=None, tpm_limit=None)
    v1 = services.ensure_current_version(endpoint)
    wait_for(
        lambda: reconcile(endpoint=endpoint) is not None and _ready(endpoint, v1) == 1,
        STARTUP_TIMEOUT_S,
        1.0,
        message="v1's real vLLM replica ready",
    )
    (old,) = Replica.objects.filter(endpoint=endpoint, version=v1, state=ReplicaState.READY)
    v1_ready_s = time.monotonic() - started
    cold_start_s = _launched_as_the_platform_launches(old, v1_ready_s)
    base = spawn_proxy(procs)

    v2 = services.create_version(endpoint=endpoint, model_profile=v2_profile.pk, note="the seed-1 build")
    rollout = services.start_rollout(endpoint=endpoint, to_version=v2, max_surge=1)
    rollout_started = time.monotonic()
    alive, percents = [alive_count(endpoint)], []
    with SteadyTraffic(base, endpoint.name, tenant_a.raw_key, clients=2, max_tokens=8, pause_s=0.1) as traffic:
        wait_for(lambda: len(traffic.results) >= 5, 60, message="traffic flowing on v1")
        drive(
            rollout,
            endpoint,
            until=finished,
            timeout=STARTUP_TIMEOUT_S + 60,
            alive=alive,
            on_tick=lambda r: percents.append(r.traffic_percent),
        )
        # traffic goes on to the new build alone for a few more answers
        served_before = len(traffic.results)
        wait_for(lambda: len(traffic.results) >= served_before + 4, 60, message="traffic flowing on v2")
    rollout_s = time.monotonic() - rollout_started

    rollout.refresh_from_db()
    endpoint.refresh_from_db()
    assert rollout.state == RolloutState.SUCCEEDED, (rollout.reason, list(rollout.events.values_list("message")))
    # Every request through the rollout was answered in full
    assert traffic.failed == 0, f"{traffic.failed} of {len(traffic.results)} failed: {traffic.errors}"
    assert max(alive) == 2, alive  # max_surge 1: the new replica started beside the old one, not after it
    # The endpoint serves v2 from a replica launched from the second build
    assert endpoint.current_version == v2 and endpoint.model_profile_id == v2_profile.pk
    (new,) = Replica.objects.filter(endpoint=endpoint, version=v2, state=ReplicaState.READY)
    argv = Path(f"/proc/{new.actuator_ref}/cmdline").read_bytes().decode().split("\0")
    assert argv[argv.index("--model") + 1] == str(V2_MODEL_DIR)
    assert argv[argv.index("--served-model-name") + 1] == endpoint.name
    # The old replica was drained, then stopped; its engine process is gone
    old.refresh_from_db()
    assert old.state == ReplicaState.STOPPED
    assert list(old.transitions.values_list("to_state", flat=True)) == ["starting", "ready", "draining", "stopped"]
    assert not pid_alive(int(old.actuator_ref))
    # The API server and its engine-core child (the whole process group), the port closed.
    wait_for(lambda: not _group_alive(int(old.actuator_ref)), 15, message="the old engine's process group gone")
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{old.url}/health", timeout=2)
    # Both builds served requests during the rollout (usage records join through Replica.version)
    stats = wait_for(
        lambda: (s := version_stats(endpoint=endpoint, since=rollout.created_at)) and len(s) == 2 and s, 15
    )
    assert stats[v1.pk].requests > 0 and stats[v2.pk].requests > 0, stats
    assert stats[v1.pk].errors == 0 and stats[v2.pk].errors == 0, stats
    print(
        "\n"
        + json.dumps(
            {
                "test": "rollout between two real vLLM builds",
                "requests": len(traffic.results),
                "failed": traffic.failed,
                "served_by_version": {f"v{v.number}": stats[v.pk].requests for v in (v1, v2)},
                "traffic_percent_seen": sorted(set(percents)),
                "v1_ready_s": round(v1_ready_s, 1),
                "v1_cold_start_s": round(cold_start_s, 1),
                "rollout_s": round(rollout_s, 1),
                "test_s": round(time.monotonic() - started, 1),
            }
        )
    )


def _launched_as_the_platform_launches(replica: Replica, ready_after_s: float) -> float:
    """The replica runs real vLLM in module form from the engine interpreter, offline and without the platform's
    settings, serves the endpoint's name, and its ready transition recorded its cold start; returns it."""
    pid = int(replica.actuator_ref)
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    assert argv[:5] == [str(ENGINE_PY), "-m", "vllm.entrypoints.openai.api_server", "--model", str(ENGINE_MODEL_DIR)]
    environ = dict(
        item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0") if item
    )
    assert environ["HF_HUB_OFFLINE"] == "1" and environ["VLLM_NO_USAGE_STATS"] == "1"
    assert "DATABASE_URL" not in environ and "DJANGO_SETTINGS_MODULE" not in environ
    reason = replica.transitions.get(to_state=ReplicaState.READY).reason
    cold_start_s = float(re.fullmatch(r"health check passed: cold start ([\d.]+) s", reason).group(1))
    assert 5 < cold_start_s <= ready_after_s + 1, (cold_start_s, ready_after_s)
    models = httpx.get(f"{replica.url}/v1/models", timeout=10).json()
    assert [card["id"] for card in models["data"]] == [replica.endpoint.name]
    return cold_start_s


def _group_alive(pgid: int) -> bool:
    """Whether any process of the group still runs (zombies awaiting their reaper do not count)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _ready(endpoint: Endpoint, version) -> int:
    return Replica.objects.filter(endpoint=endpoint, version=version, state=ReplicaState.READY).count()
