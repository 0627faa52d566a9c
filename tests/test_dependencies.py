"""The dependency locks (requirements/*.txt, `make lock`) agree with pyproject.toml: every dependency pinned with
hashes, the run lock free of the test tooling, the dev lock holding the run lock at the same versions."""

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+) \\$")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(lock: str) -> dict[str, str]:
    lines = (ROOT / "requirements" / lock).read_text().splitlines()
    pins = {}
    for i, line in enumerate(lines):
        found = PIN.match(line)
        if found:
            assert lines[i + 1].strip().startswith("--hash=sha256:"), f"{lock}: {line} has no hash"
            pins[_canonical(found[1])] = found[2]
    return pins


def _declared(group: str | None) -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = project["dependencies"] if group is None else project["optional-dependencies"][group]
    return {_canonical(Requirement(spec).name) for spec in specs}


def test_every_declared_dependency_is_locked_with_hashes():
    run, dev = _pins("run.txt"), _pins("dev.txt")
    assert _declared(None) <= set(run), "pyproject.toml changed without `make lock`"
    assert _declared(None) | _declared("dev") <= set(dev), "pyproject.toml changed without `make lock`"
    assert "setuptools" in run, "the editable install's build backend is locked too"


def test_the_run_lock_holds_no_test_tooling_and_matches_the_dev_lock():
    run, dev = _pins("run.txt"), _pins("dev.txt")
    assert not {"pytest", "playwright", "ruff", "schemathesis", "hypothesis"} & set(run)
    assert {name: dev.get(name) for name in run} == run


def test_bootstrap_installs_only_from_the_locks_with_hashes_checked():
    script = (ROOT / "scripts" / "bootstrap.sh").read_text()
    installs = [line for line in script.splitlines() if "pip install" in line and not line.lstrip().startswith("#")]
    assert len(installs) == 2
    assert "--require-hashes" in installs[0] and '-r "$lock"' in installs[0]
    assert "--no-deps" in installs[1] and "--no-build-isolation" in installs[1] and "-e ." in installs[1]
