"""The directory prometheus_client's multiprocess mode writes to (``PROMETHEUS_MULTIPROC_DIR``), made ready.

Its documentation asks for an existing directory, emptied before the server starts (a restarted container keeps
its ``emptyDir``, whose files would be summed into the new run), and for a dead worker's live gauges to be marked
dead (uvicorn restarts a worker that exits). ``config.entrypoint`` empties it once per container start; each
web worker creates it if missing and marks the workers that are gone."""

from __future__ import annotations

import os
import re
from pathlib import Path

from prometheus_client import multiprocess

_PID = re.compile(r"_(\d+)\.db$")


def metrics_dir() -> Path | None:
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")
    return Path(path) if path else None


def metrics_dir_reset() -> None:
    """Create the directory and remove a previous run's files: call before any process of the server starts."""
    directory = metrics_dir()
    if directory is None:
        return
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.db"):
        stale.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        pass
    return True


def metrics_dir_ready() -> None:
    """Create the directory if missing (a process started without the entrypoint) and mark the live gauges of
    processes that are gone as dead, so a restarted worker's predecessor stops counting."""
    directory = metrics_dir()
    if directory is None:
        return
    directory.mkdir(parents=True, exist_ok=True)
    dead = {int(m[1]) for f in directory.glob("gauge_live*.db") if (m := _PID.search(f.name))} - {os.getpid()}
    if not dead:
        return
    for pid in dead:
        if not _alive(pid):
            multiprocess.mark_process_dead(pid, str(directory))
