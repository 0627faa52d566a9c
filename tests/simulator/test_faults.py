"""Fault injection on real replica processes: hang, crash, slow, error rate, startup delay (flag and admin call)."""

import time

import httpx
import pytest

from simulator.process import ReplicaStartError, start_replica
from simulator.tokens import filler_text

pytestmark = pytest.mark.e2e


# One pooled client: creating an httpx client per call costs a TLS context, noise that timing checks do not need.
_client = httpx.Client()


@pytest.fixture(scope="module", autouse=True)
def _close_client():
    yield
    _client.close()


def complete(url: str, *, max_tokens: int = 10, timeout: float = 10.0, prompt: str = "hello") -> httpx.Response:
    return _client.post(
        f"{url}/v1/completions", timeout=timeout, json={"model": "tiny", "prompt": prompt, "max_tokens": max_tokens}
    )


@pytest.fixture(scope="module")
def replica():
    with start_replica(profile="tiny", speed=0.5) as proc:
        yield proc


def test_slow_factor_stretches_latency_and_is_settable_at_runtime(replica):
    def timed() -> float:
        started = time.perf_counter()
        assert complete(replica.url, max_tokens=100).status_code == 200
        return time.perf_counter() - started

    normal = timed()
    assert replica.set_faults(slow_factor=4)["slow_factor"] == 4
    slow = timed()
    replica.set_faults(slow_factor=1)
    assert slow > 2.5 * normal, (normal, slow)


def test_error_rate_fails_that_share_of_requests_in_vllms_error_shape(replica):
    replica.set_faults(error_rate=1.0, error_status=503)
    failed = complete(replica.url)
    assert failed.status_code == 503
    assert failed.json()["error"] == {
        "message": "simulated engine error (fault injection)",
        "type": "ServiceUnavailableError",
        "param": None,
        "code": 503,
    }
    replica.set_faults(error_rate=0.5, error_status=500)
    with httpx.Client(timeout=10) as client:
        body = {"model": "tiny", "prompt": "x", "max_tokens": 1}
        statuses = [client.post(f"{replica.url}/v1/completions", json=body).status_code for _ in range(40)]
        assert 8 <= statuses.count(500) <= 32 and statuses.count(200) + statuses.count(500) == 40
        replica.set_faults(error_rate=0.0)
        assert all(client.post(f"{replica.url}/v1/completions", json=body).status_code == 200 for _ in range(5))


def test_bad_admin_settings_are_refused_and_change_nothing(replica):
    before = replica.faults()
    for bad in ({"error_rate": 2}, {"slow_factor": 0}, {"nonsense": 1}, {"hang": "maybe"}):
        with pytest.raises(ValueError):
            replica.set_faults(**bad)
    assert replica.faults() == before
    assert httpx.post(f"{replica.url}/admin/faults", content=b"[1]").status_code == 400


def test_hang_midstream_stops_the_stream_and_release_resumes_it(replica):
    with httpx.stream(
        "POST",
        f"{replica.url}/v1/completions",
        timeout=httpx.Timeout(10, read=0.8),
        json={
            "model": "tiny",
            "prompt": "hang me",
            "max_tokens": 400,
            "stream": True,
        },
    ) as response:
        chunks = response.iter_lines()
        assert next(chunks).startswith("data: ")
        replica.set_faults(hang=True)
        assert httpx.get(f"{replica.url}/health", timeout=2).status_code == 200  # a wedged engine still says healthy
        with pytest.raises(httpx.ReadTimeout):
            for _ in chunks:
                pass
    with pytest.raises(httpx.ReadTimeout):  # new requests are accepted and never answered
        complete(replica.url, timeout=0.8)
    replica.set_faults(hang_health=True)
    with pytest.raises(httpx.ReadTimeout):
        httpx.get(f"{replica.url}/health", timeout=0.8)
    replica.set_faults(hang=False, hang_health=False)
    assert complete(replica.url).status_code == 200


def test_hang_by_flag_accepts_connections_but_never_answers():
    with start_replica(profile="tiny", faults={"hang": True}) as proc:
        with pytest.raises(httpx.ReadTimeout):
            complete(proc.url, timeout=0.8)
        assert proc.alive()


def test_crash_by_admin_call_exits_the_process():
    proc = start_replica(profile="tiny")
    try:
        assert complete(proc.url).status_code == 200
        proc.crash()
        assert proc.wait_exit(10) == 75
        with pytest.raises(httpx.ConnectError):
            complete(proc.url, timeout=2)
    finally:
        proc.stop()


def test_crash_after_seconds_set_by_admin_call():
    with start_replica(profile="tiny") as proc:
        proc.set_faults(crash_after_s=0.5)
        assert proc.alive()
        assert proc.wait_exit(10) == 75


def test_crash_after_requests_by_flag_drops_the_request_that_triggers_it():
    with start_replica(profile="tiny", faults={"crash_after_requests": 2}) as proc:
        assert complete(proc.url).status_code == 200
        with pytest.raises(httpx.TransportError):
            complete(proc.url, timeout=5)
        assert proc.wait_exit(10) == 75


def test_startup_delay_refuses_connections_until_the_cold_start_is_over():
    started = time.monotonic()
    with start_replica(profile="tiny", faults={"startup_delay_s": 1.5}, wait=False) as proc:
        assert not proc.healthy(timeout=0.3)
        proc.wait_healthy(timeout_s=20)
        assert time.monotonic() - started >= 1.5
        assert complete(proc.url).status_code == 200


def test_manage_py_run_replica_serves_and_stops_on_sigterm():
    with start_replica(
        profile="tiny", speed=5, served_model_name="my-endpoint", via_manage=True, timeout_s=60
    ) as proc:
        response = httpx.post(
            f"{proc.url}/v1/chat/completions",
            timeout=10,
            json={"model": "my-endpoint", "messages": [{"role": "user", "content": filler_text(20)}], "max_tokens": 3},
        )
        assert response.status_code == 200 and response.json()["model"] == "my-endpoint"
        proc.stop()
        assert proc.proc.returncode == 0
        assert "READY http://127.0.0.1:" in proc.log()


def test_bad_launch_options_fail_fast_with_the_reason():
    with pytest.raises(ReplicaStartError, match="unknown simulator profile"):
        start_replica(profile="no-such-profile", timeout_s=20)


def test_a_replica_does_not_outlive_the_process_that_started_it(tmp_path):
    import os
    import subprocess
    import sys

    script = tmp_path / "parent.py"
    script.write_text(
        "import os\n"
        "from simulator.process import start_replica\n"
        "print(start_replica(profile='tiny').pid, flush=True)\n"
        "os._exit(0)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=root,
        env={**os.environ, "PYTHONPATH": root},
    )
    pid = int(out.stdout.strip())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().split()[2] == "Z":  # exited, waiting to be reaped by init
                    break
        except FileNotFoundError:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, 9)
        raise AssertionError("the replica outlived its parent")
