"""The embedded default boots: with no DATABASE_URL / REDIS_URL, migrate runs and a real server answers /api/schema/."""

import os
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _embedded_env(var_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "INFERCAP_QUIET"}}
    env.update(INFERCAP_VAR_DIR=str(var_dir), DJANGO_SETTINGS_MODULE="config.settings.local", PYTHONUNBUFFERED="1")
    return env


def test_embedded_default_migrates_and_serves_the_schema(tmp_path):
    env = _embedded_env(tmp_path / "var")
    migrate = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert migrate.returncode == 0, migrate.stderr[-3000:]
    # It says which backends it chose, so nobody mistakes the demo for production.
    assert "SQLite (embedded)" in migrate.stderr and "embedded" in migrate.stderr.split("broker", 1)[-1]
    assert (tmp_path / "var" / "infercap.sqlite3").exists()
    make_key = (
        "from tenants.services import api_key_create, tenant_create;"
        "t = tenant_create(name='Boot', slug='boot');"
        "print(api_key_create(tenant=t, name='boot', scopes=['read'])[1])"
    )
    shell = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", make_key],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shell.returncode == 0, shell.stderr[-3000:]
    raw_key = shell.stdout.strip().splitlines()[-1]

    # Bind here and hand the socket over, so the port is ours from the start (no race for a "free" port).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "config.asgi:application", "--fd", str(sock.fileno()), "--log-level", "warning"],
        cwd=ROOT, env=env, pass_fds=[sock.fileno()], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    sock.close()
    try:
        deadline, response = time.monotonic() + 90, None
        while time.monotonic() < deadline and server.poll() is None:
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/api/schema/", timeout=10)
                break
            except httpx.TransportError:
                time.sleep(0.3)
        assert server.poll() is None, server.stdout.read()[-3000:]
        assert response is not None and response.status_code == 200, response
        assert response.text.startswith("openapi:") and "/api/v1/endpoints/" in response.text
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).json() == {"status": "ok"}
        # The API itself answers on the embedded database: anonymous callers are refused, a tenant key is served.
        assert httpx.get(f"http://127.0.0.1:{port}/api/v1/endpoints/", timeout=10).status_code == 401
        auth = {"Authorization": f"Bearer {raw_key}"}
        me = httpx.get(f"http://127.0.0.1:{port}/api/v1/me/", headers=auth, timeout=10)
        assert me.status_code == 200 and me.json()["tenant"]["slug"] == "boot", me.text
        listed = httpx.get(f"http://127.0.0.1:{port}/api/v1/api-keys/", headers=auth, timeout=10)
        assert listed.status_code == 200 and listed.json()["results"][0]["prefix"] == raw_key[:12]
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=5)


def _processes_of(var_dir: Path) -> set[int]:
    """Live processes started for this platform (they inherit its INFERCAP_VAR_DIR), whoever their parent is."""
    marker = f"INFERCAP_VAR_DIR={var_dir}".encode() + b"\0"
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (
                marker in (entry / "environ").read_bytes()
                and b"Z" not in (entry / "stat").read_bytes().split(b")")[-1][:3]
            ):
                found.add(int(entry.name))
        except OSError:
            continue
    return found


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds the platform's processes through /proc")
def test_run_platform_serves_a_completion_and_a_plain_kill_stops_every_process(tmp_path):
    """The README's first command, end to end: the platform comes up on the embedded default, prints a key that
    streams a completion through the proxy, and a SIGTERM (what `kill` or a container stop sends) stops the web
    server, the Celery worker and beat, and the simulated replicas the worker started."""
    from capacity.runtimes.processes import free_port

    var_dir = tmp_path / "var"
    env = _embedded_env(var_dir)
    migrate = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert migrate.returncode == 0, migrate.stderr[-3000:]
    port = free_port()
    log = tmp_path / "run_platform.log"
    with log.open("w") as out:
        platform = subprocess.Popen(
            [sys.executable, "manage.py", "run_platform", "--port", str(port), "--replicas", "1"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while "stops everything" not in log.read_text() and platform.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        text = log.read_text()
        assert "stops everything" in text, text[-4000:]
        assert f"http://127.0.0.1:{port}/console/" in text and "curl -N" in text
        key = next(word for word in text.split() if word.startswith("ick_"))
        body = {"model": "demo-chat", "stream": True, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
        response = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60,
        )  # fmt: skip
        assert response.status_code == 200, response.text
        assert response.text.rstrip().endswith("data: [DONE]")
        # The worker's control loops run on the embedded database too: the autoscaler's beat ticks store decisions
        # (a PostgreSQL-only query there once failed every tick while completions still streamed).
        deadline, decided = time.monotonic() + 60, 0
        while not decided and time.monotonic() < deadline:
            time.sleep(1.0)
            with sqlite3.connect(var_dir / "infercap.sqlite3", timeout=10) as db:
                decided = db.execute(
                    "SELECT count(*) FROM capacity_autoscalerdecision WHERE tick LIKE 'h-%'"
                ).fetchone()[0]
        assert decided, log.read_text()[-4000:]
        assert "Traceback" not in log.read_text(), log.read_text()[-4000:]
        started = _processes_of(var_dir) - {platform.pid}
        assert len(started) >= 3, started  # web, the Celery worker (and its pool), a replica

        platform.send_signal(subprocess.signal.SIGTERM)
        assert platform.wait(timeout=90) == 0, log.read_text()[-3000:]
        assert "[infercap] stopped" in log.read_text()
        # Each child exits on its own after the SIGTERM; on a loaded CI machine the Celery pool took over 15 s once.
        deadline = time.monotonic() + 45
        while _processes_of(var_dir) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _processes_of(var_dir), log.read_text()[-3000:]
    finally:
        if platform.poll() is None:
            os.killpg(platform.pid, subprocess.signal.SIGKILL)
        for pid in _processes_of(var_dir):
            try:
                os.kill(pid, subprocess.signal.SIGKILL)
            except OSError:
                pass
