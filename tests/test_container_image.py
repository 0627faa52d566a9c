"""The Dockerfile, checked where no container runtime exists: multi-stage, a slim final stage without compilers,
a non-root user, the install step CI's own script (scripts/bootstrap.sh run), static files collected and a health
check on a path that answers."""

import json
import re
import shlex
from pathlib import Path

import pytest
from django.core.management import call_command

ROOT = Path(__file__).resolve().parents[1]


def _stages() -> list[list[tuple[str, str]]]:
    """The Dockerfile's stages, each a list of (INSTRUCTION, arguments) with continuation lines joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    stages: list[list[tuple[str, str]]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, args = line.partition(" ")
        instruction = instruction.upper()
        assert instruction in {
            "FROM",
            "RUN",
            "COPY",
            "ENV",
            "WORKDIR",
            "USER",
            "EXPOSE",
            "HEALTHCHECK",
            "ENTRYPOINT",
            "CMD",
        }, line
        if instruction == "FROM":
            stages.append([])
        stages[-1].append((instruction, args.strip()))
    return stages


def _all(stage, instruction: str) -> list[str]:
    return [args for name, args in stage if name == instruction]


def test_the_final_stage_is_slim_without_compilers_and_runs_as_a_user():
    stages = _stages()
    assert len(stages) >= 2
    final = stages[-1]
    base = _all(final, "FROM")[0]
    assert "slim" in base and "python:3.11" in base
    assert not any("apt-get install" in run or "pip install" in run for run in _all(final, "RUN"))
    (user,) = _all(final, "USER")
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "a numeric non-root uid (runAsNonRoot can check it)"
    assert any(f"--uid {uid}" in run for run in _all(final, "RUN")), "the user exists in the image"
    assert any("--from=build /opt/venv" in copy for copy in _all(final, "COPY"))


def test_the_build_stage_installs_with_cis_script_from_the_run_lock_and_collects_static():
    build = _stages()[0]
    runs = _all(build, "RUN")
    assert any("scripts/bootstrap.sh run" in run for run in runs)
    assert any("collectstatic --noinput" in run for run in runs)
    python = re.search(r"python:(\d+\.\d+)", _all(build, "FROM")[0])[1]
    assert f"--python-version {python}" in (ROOT / "Makefile").read_text(), "the locks resolve for the image's Python"


@pytest.mark.django_db
def test_the_health_check_and_command_name_what_the_app_serves(client):
    final = _stages()[-1]
    (healthcheck,) = _all(final, "HEALTHCHECK")
    path = re.search(r"http://127\.0\.0\.1:8000(/\w+)", healthcheck)[1]
    assert client.get(path).status_code == 200
    (cmd,) = _all(final, "CMD")
    argv = shlex.split(cmd.strip("[]").replace(",", " "))
    module, _, attr = argv[1].partition(":")
    assert argv[0] == "uvicorn" and getattr(__import__(module, fromlist=[attr]), attr)
    (entrypoint,) = _all(final, "ENTRYPOINT")
    assert json.loads(entrypoint) == ["python", "-m", "config.entrypoint"], "prepares PROMETHEUS_MULTIPROC_DIR"
    assert "8000" in _all(final, "EXPOSE")


def test_collectstatic_finds_the_consoles_files(tmp_path, settings):
    settings.STATIC_ROOT = tmp_path
    call_command("collectstatic", "--noinput", verbosity=0)
    assert any(tmp_path.rglob("*.css")) and (tmp_path / "rest_framework").is_dir()


def test_the_build_context_leaves_out_local_state():
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".git", ".venv", ".venv-engine", "var"} <= ignored
