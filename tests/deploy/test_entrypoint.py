"""The image's entrypoint empties PROMETHEUS_MULTIPROC_DIR before the server starts, and each web worker marks its
dead siblings' live gauges (config/entrypoint.py, config/metrics_dir.py)."""

import subprocess
import sys

from capacity.runtimes.processes import ROOT
from config.metrics_dir import metrics_dir_ready, metrics_dir_reset


def test_the_entrypoint_creates_and_empties_the_directory_then_runs_the_command(tmp_path):
    directory = tmp_path / "prometheus"
    directory.mkdir()
    (directory / "counter_4242.db").write_bytes(b"last run")
    run = subprocess.run(
        [sys.executable, "-m", "config.entrypoint", "sh", "-c", 'ls "$PROMETHEUS_MULTIPROC_DIR"; exit 3'],
        cwd=ROOT, env={"PATH": "/usr/bin:/bin", "PROMETHEUS_MULTIPROC_DIR": str(directory)},
        capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 3 and run.stdout == "", "the command ran, in an empty directory"
    fresh = tmp_path / "new" / "prometheus"
    subprocess.run([sys.executable, "-m", "config.entrypoint", "true"], cwd=ROOT, check=True,
                   env={"PATH": "/usr/bin:/bin", "PROMETHEUS_MULTIPROC_DIR": str(fresh)})  # fmt: skip
    assert fresh.is_dir()


def test_a_worker_creates_a_missing_directory_and_forgets_dead_workers_gauges(tmp_path, monkeypatch):
    directory = tmp_path / "prometheus"
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
    metrics_dir_ready()
    assert directory.is_dir()
    gone = subprocess.Popen(["true"])
    gone.wait()
    (directory / f"gauge_livesum_{gone.pid}.db").write_bytes(b"")
    (directory / f"counter_{gone.pid}.db").write_bytes(b"")
    metrics_dir_ready()
    assert sorted(p.name for p in directory.iterdir()) == [f"counter_{gone.pid}.db"], "counters keep their counts"
    metrics_dir_reset()
    assert list(directory.iterdir()) == []
