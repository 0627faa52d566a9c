"""No process outlives its bench: a bench interrupted mid-run (Ctrl-C's SIGINT, or the SIGTERM of `timeout` or a
CI runner) stops every process it started; the marks that find what is left, even reparented to init."""

import os
import signal
import subprocess
import sys
import time
import types
import uuid
import weakref
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from benchmarks.management.commands import bench as bench_command
from capacity.runtimes.processes import child_django_env, processes_marked, stop_marked
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
MARK = "INFERCAP_TEST_ORPHAN_MARK"


def test_a_marked_process_reparented_to_init_is_found_and_stopped():
    mark = f"{MARK}={uuid.uuid4().hex}"
    # The shell starts a sleeper in the background and exits: the sleeper's parent is no longer us.
    subprocess.run(["sh", "-c", "sleep 300 >/dev/null 2>&1 &"], env={**os.environ, MARK: mark.split("=", 1)[1]})
    # The shell has returned, but its child may still be inside execve, when /proc hides its environment.
    left = wait_for(lambda: processes_marked(mark), timeout=5, message="the sleeper")
    try:
        assert len(left) == 1
        assert Path(f"/proc/{left[0]}/stat").read_text().split()[3] != str(os.getpid())  # not our child
        stop_marked(left)
        assert processes_marked(mark) == []
    finally:
        stop_marked(left, grace_s=0)
    assert processes_marked(f"{MARK}=nobody") == []


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the swallowed interrupt, on purpose
@pytest.mark.parametrize("reports_progress", [True, False])
def test_a_signal_whose_interrupt_python_swallows_still_stops_the_bench_with_130(monkeypatch, reports_progress):
    # A signal that lands while a weakref callback runs raises KeyboardInterrupt there, and Python only prints
    # "Exception ignored in ...": the run would go on with its signals ignored. It stops at its next progress line,
    # and a run that reports none still ends with 130.
    finished = []

    class Owner:
        pass

    def run(*, progress, **options):
        owner = Owner()
        watch = weakref.ref(owner, lambda ref: bench_command._stop_on_signal(signal.SIGTERM, None))  # noqa: F841
        del owner  # the callback runs now, inside the interpreter's weakref machinery
        if reports_progress:
            progress("the next step")
        finished.append(True)
        return {"figure": 1}

    monkeypatch.setitem(bench_command.BENCHMARKS, "swallowed", types.SimpleNamespace(run=run))
    with pytest.raises(CommandError, match="interrupted") as caught:
        call_command("bench", "swallowed")
    assert finished == ([] if reports_progress else [True])
    assert caught.value.returncode == 130
    assert signal.getsignal(signal.SIGTERM) is not bench_command._stop_on_signal  # the handlers were put back


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_bench_leaves_no_process(sig, clean_redis):
    mark = uuid.uuid4().hex
    env = {**os.environ, **child_django_env(), MARK: mark, "PYTHONUNBUFFERED": "1"}
    bench = subprocess.Popen(
        [sys.executable, "manage.py", "bench", "proxy", "--quick", "--opt", "levels=1"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        # Mid-run: its replica and proxy are up and it is measuring ("replicas [...], proxy ..." on stderr).
        log = []
        deadline = time.monotonic() + 240
        for line in bench.stderr:
            log.append(line)
            if "replicas [" in line or time.monotonic() > deadline:
                break
        assert "replicas [" in log[-1], "".join(log)[-3000:]
        started = processes_marked(f"{MARK}={mark}")
        assert len(started) >= 3, started  # the replica, the proxy, the bare pass-through
        bench.send_signal(sig)
        rest = bench.communicate(timeout=120)[1]
        assert processes_marked(f"{MARK}={mark}") == [], "left running"
        assert bench.returncode == 130, "".join(log)[-2000:] + rest[-2000:]
        assert "interrupted" in rest
    finally:
        if bench.poll() is None:
            os.killpg(bench.pid, signal.SIGKILL)
            bench.wait()
        stop_marked(processes_marked(f"{MARK}={mark}"), grace_s=0)
