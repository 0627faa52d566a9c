"""The README's API walkthrough runs as written: every ``sh`` and ``python`` block of its section, in order, against a
live server (web and proxy in one uvicorn, as ``make run`` serves them) with simulated replicas, a beat stand-in
ticking the autoscaler, and a simulated vLLM server to attach. A block that no longer works fails here."""

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.db import connections

from capacity.runtimes.processes import ROOT, database_url, free_port, sim_replica_argv
from tests.autoscaling.conftest import reap_local_replicas  # noqa: F401 - a fixture: no replica process left
from tests.proxy.conftest import spawn_proxy
from workers.tasks.autoscaling import horizontal_all

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

SECTION = "## Operating through the API: a walkthrough"
BLOCK = re.compile(r"^```(sh|python)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
SERVED_NAME = "walkthrough-chat"


def walkthrough_blocks() -> list[tuple[str, str]]:
    readme = (Path(ROOT) / "README.md").read_text()
    start = readme.index(SECTION)
    end = readme.find("\n## ", start + len(SECTION))
    return BLOCK.findall(readme[start : end if end != -1 else None])


def test_the_section_has_every_step():
    blocks = walkthrough_blocks()
    text = "\n".join(code for _, code in blocks)
    assert blocks[0][0] == "sh" and "create_operator_token" in blocks[0][1]
    for step in ("/hardware-profiles/", "/endpoints/", "/scale/", "/replicas/", "OpenAI(", "/usage/", "/statements/"):
        assert step in text, step


class Beat:
    """The Celery beat's horizontal tick, every half second, in a thread (the test server runs no worker)."""

    def __init__(self) -> None:
        self.stop, self.errors = threading.Event(), []
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        try:
            while not self.stop.wait(0.5):
                try:
                    horizontal_all()  # eager in the test settings: each endpoint's tick runs here
                except Exception as exc:  # noqa: BLE001 - recorded, the test reports it
                    self.errors.append(repr(exc))
        finally:
            connections.close_all()

    def __enter__(self) -> "Beat":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(30)


@pytest.mark.usefixtures("reap_local_replicas")
def test_the_walkthrough_runs_as_written(procs, clean_redis, monkeypatch):
    base = spawn_proxy(procs)
    vllm_port = free_port()
    procs.spawn(sim_replica_argv(vllm_port, speed=20.0, served_model_name=SERVED_NAME), port=vllm_port)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.test",
        "DATABASE_URL": database_url(),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "INFERCAP_URL": base,
        "VLLM_URL": f"http://127.0.0.1:{vllm_port}",
    }
    namespace: dict = {"__name__": "walkthrough"}
    with Beat() as beat:
        for number, (language, code) in enumerate(walkthrough_blocks(), 1):
            if language == "sh":
                done = subprocess.run(
                    ["bash", "-euo", "pipefail", "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                    timeout=120,
                )  # fmt: skip
                assert done.returncode == 0, f"block {number}:\n{code}\n{done.stdout}\n{done.stderr[-3000:]}"
                if token := re.search(r"token \(shown once\): (\S+)", done.stdout):
                    env["INFERCAP_TOKEN"] = token.group(1)
            else:
                for name in ("INFERCAP_URL", "INFERCAP_TOKEN", "VLLM_URL"):
                    monkeypatch.setenv(name, env[name])
                try:
                    exec(compile(code, f"README walkthrough block {number}", "exec"), namespace)  # noqa: S102
                except Exception as exc:
                    raise AssertionError(f"block {number} failed:\n{code}") from exc
    assert not beat.errors, beat.errors
    namespace["api"].close()
