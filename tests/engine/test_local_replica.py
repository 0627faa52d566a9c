"""The local actuator runs the ``vllm`` runtime for real: it starts a vLLM replica of an endpoint from the engine
interpreter, marks it ready once ``GET /health`` answers 200 (recording its cold start), the replica serves the
endpoint's name, and stopping it leaves no engine process behind. This is the test session's second engine start
(~50-110 s here); everything else shares the session engine."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest

from capacity.autoscaling.actuators.local import LocalActuator, pid_alive
from endpoints.models import Replica, ReplicaState
from endpoints.runtimes.processes import ENGINE_MODEL_DIR, ENGINE_PY
from tests.engine.engine import STARTUP_TIMEOUT_S, build_model
from tests.factories import EndpointFactory, ModelProfileFactory
from tests.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_the_local_actuator_starts_a_real_vllm_replica_records_its_cold_start_and_stops_it(engine):
    build_model(ENGINE_MODEL_DIR)  # (built already when the session engine started here)
    endpoint = EndpointFactory(
        name="tiny-local",
        runtime="vllm",
        # The profile names the tests' model directory under INFERCAP["VLLM_MODELS_DIR"] (var/engine).
        model_profile=ModelProfileFactory(name=ENGINE_MODEL_DIR.name, parameters_b=0.003, weights_gb=0.01),
        launch_options={"actuator": "local", "cpu_kvcache_gib": 1},
    )
    actuator = LocalActuator()
    launched_at = time.monotonic()
    (replica,) = actuator.launch(endpoint, 1)
    pid = int(replica.actuator_ref)
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        assert argv[:5] == [
            str(ENGINE_PY),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(ENGINE_MODEL_DIR),
        ]
        environ = dict(
            item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0") if item
        )
        assert environ["HF_HUB_OFFLINE"] == "1" and environ["VLLM_NO_USAGE_STATS"] == "1"
        assert "DATABASE_URL" not in environ and "DJANGO_SETTINGS_MODULE" not in environ

        ready_after_s = _sync_until_ready(actuator, endpoint, replica, launched_at)
        reason = replica.transitions.get(to_state=ReplicaState.READY).reason
        cold_start_s = float(re.fullmatch(r"health check passed: cold start ([\d.]+) s", reason).group(1))
        assert 5 < cold_start_s <= ready_after_s + 1, (cold_start_s, ready_after_s)

        # It serves under the endpoint's name: what the proxy sends as `model`.
        models = httpx.get(f"{replica.url}/v1/models", timeout=10).json()
        assert [card["id"] for card in models["data"]] == ["tiny-local"]
        answer = httpx.post(
            f"{replica.url}/v1/completions",
            json={"model": "tiny-local", "prompt": "hello", "max_tokens": 3, "ignore_eos": True},
            timeout=120,
        )
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 3
    finally:
        actuator.terminate([Replica.objects.get(pk=replica.pk)], reason="test done")

    # Stopped: the API server and its engine-core child (the whole process group), the port closed.
    assert not pid_alive(pid)
    wait_for(lambda: not _group_alive(pid), 15, message="the engine's process group gone (engine core included)")
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{replica.url}/health", timeout=2)
    states = list(Replica.objects.get(pk=replica.pk).transitions.values_list("to_state", flat=True))
    assert states == ["starting", "ready", "draining", "stopped"]
    print(f"\nreal vLLM replica: cold start {cold_start_s:.1f} s (ready seen after {ready_after_s:.1f} s)")


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


def _sync_until_ready(actuator, endpoint, replica, launched_at: float) -> float:
    """The actuator's sync, as the autoscaler's tick runs it, until the replica is ready; seconds since launch."""
    deadline = launched_at + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        actuator.sync(endpoint)
        replica.refresh_from_db()
        if replica.state == ReplicaState.READY:
            return time.monotonic() - launched_at
        if replica.state in (ReplicaState.FAILED, ReplicaState.STOPPED):
            raise AssertionError(
                f"the replica {replica.state}: {replica.failure_reason}\n{_log_tail(endpoint, replica)}"
            )
        time.sleep(1.0)
    raise AssertionError(f"not ready after {STARTUP_TIMEOUT_S} s\n{_log_tail(endpoint, replica)}")


def _log_tail(endpoint, replica) -> str:
    from django.conf import settings

    log = Path(settings.INFERCAP["SPOOL_DIR"]).parent / "replicas" / f"endpoint-{endpoint.pk}-{replica.name}.log"
    return log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
