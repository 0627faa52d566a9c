"""``bench deploy``'s ``make_run_soak``: `make run` as a newcomer runs it, under completions for minutes.

`make run`'s two commands (``migrate``, then ``run_platform``) on the local settings and the embedded default, in
a fresh var directory (no PostgreSQL or Redis); ``setup-run`` is left out, as it would reinstall this
environment from the run lock. Clients stream and fetch completions through its proxy with the demo key the banner
prints, and every answer is checked (status, each event parsed, text, a finish reason, usage, ``[DONE]``). The
figures: the minutes soaked, the answers that were wrong (``errors``, goal 0), the control loops' restarts by
``run_platform``'s supervision (``worker_restarts``, goal 0), the autoscaler's decisions recorded meanwhile (the
loops did run) and the processes left behind once it was stopped with Ctrl-C's signal (goal 0).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from capacity.runtimes.processes import free_port, processes_marked, stop_marked

ROOT = Path(__file__).resolve().parents[2]
# run_platform's supervision says this when it restarts a child (workers/management/commands/run_platform.py).
RESTART_LINE = re.compile(r"\[infercap\] (.+) exited \((-?\d+)\); restarting it")
PROMPTS = ("Hello!", "Say something about capacity.", "Count to ten.", "What is a model unit?", "Tell me a story.")


def run(*, minutes: float, progress, clients: int = 2) -> dict:
    var_dir = Path(tempfile.mkdtemp(prefix="infercap-soak-"))
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "REDIS_URL", "INFERCAP_QUIET", "DJANGO_SETTINGS_MODULE", "PORT"}
    }
    # The var directory is also the mark by which the processes it leaves behind are found (processes_marked):
    # every child of run_platform inherits it.
    env |= {
        "DJANGO_SETTINGS_MODULE": "config.settings.local",
        "INFERCAP_VAR_DIR": str(var_dir),
        "PYTHONUNBUFFERED": "1",
    }
    manage = [sys.executable, str(ROOT / "manage.py")]
    progress(f"make run soak: migrate the embedded database in {var_dir}")
    migrate = subprocess.run(
        [*manage, "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    if migrate.returncode != 0:
        raise RuntimeError(f"make run's migrate failed: {migrate.stderr[-2000:]}")
    port = free_port()
    platform = subprocess.Popen(
        [*manage, "run_platform", "--port", str(port)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        start_new_session=True,
    )  # fmt: skip
    log = _Log(platform, var_dir / "run_platform.log")
    try:
        api_key = log.wait_for_key(timeout_s=600)
        progress(f"make run soak: platform up on port {port}; {clients} clients for {minutes:g} min")
        base = f"http://127.0.0.1:{port}"
        traffic = _Traffic(base, api_key, clients=clients)
        started = time.monotonic()
        decisions_before = _decisions(var_dir)
        traffic.start()
        while time.monotonic() - started < minutes * 60:
            time.sleep(min(30.0, max(0.1, minutes * 60 - (time.monotonic() - started))))
            if platform.poll() is not None:
                break
            progress(
                f"make run soak: {(time.monotonic() - started) / 60:.1f} min, {traffic.requests} answers, "
                f"{traffic.errors} wrong, {len(log.restarts)} restarts"
            )
        traffic.stop()
        soaked_min = (time.monotonic() - started) / 60
        decisions = _decisions(var_dir) - decisions_before
        platform_exited = platform.poll() is not None
    finally:
        if platform.poll() is None:
            platform.send_signal(signal.SIGINT)  # Ctrl-C: run_platform stops its children, replicas included
            try:
                platform.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(platform.pid, signal.SIGKILL)
                platform.wait()
        log.close()
    left = processes_marked(f"INFERCAP_VAR_DIR={var_dir}")
    stop_marked(left)
    figures = {
        "minutes": round(soaked_min, 2),
        "requests": traffic.requests,
        "errors": traffic.errors + int(platform_exited),
        "worker_restarts": len(log.restarts),
        "restarted": log.restarts[:5],
        "autoscaler_decisions": decisions,
        "processes_left": len(left),
        "stderr_tracebacks": log.tracebacks,
        "error_samples": traffic.samples,
        "clients": clients,
        "load_average_1m": round(os.getloadavg()[0], 1),
    }
    progress(f"make run soak: {figures}")
    if figures["errors"] or figures["worker_restarts"] or platform_exited:
        figures["log"] = str(log.path)  # kept for reading
    else:
        shutil.rmtree(var_dir, ignore_errors=True)
    return figures


class _Log:
    """run_platform's stdout and stderr, copied to a file; notes the API key, restarts and tracebacks."""

    def __init__(self, proc: subprocess.Popen, path: Path) -> None:
        self.path, self.restarts, self.tracebacks = path, [], 0
        self._file = path.open("a")
        self._key: str | None = None
        self._lock = threading.Lock()
        self._readers = [
            threading.Thread(target=self._read, args=(stream,), daemon=True) for stream in (proc.stdout, proc.stderr)
        ]
        for reader in self._readers:
            reader.start()
        self._proc = proc

    def _read(self, stream) -> None:
        for line in stream:
            with self._lock:
                self._file.write(line)
                self._file.flush()
            if line.strip().startswith("API key"):
                self._key = line.split()[2]
            if found := RESTART_LINE.search(line):
                self.restarts.append(f"{found[1]} ({found[2]})")
            if line.startswith("Traceback"):
                self.tracebacks += 1

    def wait_for_key(self, *, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while self._key is None:
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"run_platform printed no banner; its log: {self.path}")
            time.sleep(0.2)
        return self._key

    def close(self) -> None:
        for reader in self._readers:
            reader.join(timeout=10)
        self._file.close()


class _Traffic:
    """Clients alternating streamed and whole completions, one at a time each; every answer checked."""

    def __init__(self, base: str, api_key: str, *, clients: int) -> None:
        self.base, self.headers = base, {"Authorization": f"Bearer {api_key}"}
        self.requests = self.errors = 0
        self.samples: list[str] = []
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(clients)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout=120)

    def _client(self, index: int) -> None:
        rng = random.Random(index)
        with httpx.Client(base_url=self.base, headers=self.headers, timeout=60) as client:
            n = 0
            while not self._stopping.is_set():
                body = {
                    "model": "demo-chat",
                    "max_tokens": rng.randint(8, 48),
                    "messages": [{"role": "user", "content": rng.choice(PROMPTS)}],
                }
                try:
                    problem = _streamed(client, body) if n % 2 == 0 else _whole(client, body)
                except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
                    problem = f"{type(exc).__name__}: {exc}"
                with self._lock:
                    self.requests += 1
                    if problem:
                        self.errors += 1
                        if len(self.samples) < 5:
                            self.samples.append(problem[:300])
                n += 1
                self._stopping.wait(0.2)


def _streamed(client: httpx.Client, body: dict) -> str | None:
    body = body | {"stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            return f"stream: HTTP {response.status_code}: {response.read()[:200]!r}"
        data = [line[5:].strip() for line in response.iter_lines() if line.startswith("data:")]
    if not data or data[-1] != "[DONE]":
        return f"stream: no [DONE] at the end ({data[-1:]})"
    events = [json.loads(item) for item in data[:-1]]
    if any("error" in event for event in events):
        return f"stream: an error event: {next(e for e in events if 'error' in e)}"
    text = "".join(c["delta"].get("content") or "" for e in events for c in e.get("choices", []))
    finish = [c["finish_reason"] for e in events for c in e.get("choices", []) if c.get("finish_reason")]
    usage = [e["usage"] for e in events if e.get("usage")]
    if not text or finish not in (["stop"], ["length"]) or not usage or usage[-1]["completion_tokens"] < 1:
        return f"stream: text {text[:40]!r}, finish {finish}, usage {usage}"
    return None


def _whole(client: httpx.Client, body: dict) -> str | None:
    response = client.post("/v1/chat/completions", json=body)
    if response.status_code != 200:
        return f"whole: HTTP {response.status_code}: {response.text[:200]}"
    answer = response.json()
    choice = answer["choices"][0]
    if not choice["message"]["content"] or choice["finish_reason"] not in ("stop", "length"):
        return f"whole: {choice}"
    if answer["usage"]["completion_tokens"] < 1:
        return f"whole: usage {answer['usage']}"
    return None


def _decisions(var_dir: Path) -> int:
    """The autoscaler's decisions recorded so far (the embedded database, read only)."""
    try:
        with sqlite3.connect(f"file:{var_dir / 'infercap.sqlite3'}?mode=ro", uri=True, timeout=20) as db:
            return db.execute("SELECT COUNT(*) FROM capacity_autoscalerdecision").fetchone()[0]
    except sqlite3.Error:
        return 0
