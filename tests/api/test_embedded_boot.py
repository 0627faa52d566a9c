"""The embedded default boots: with no DATABASE_URL / REDIS_URL, migrate runs and a real server answers /api/schema/."""

import os
import socket
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
