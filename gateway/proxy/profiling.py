"""A CPU profile of one proxy worker, for operators hunting the request path's cost: with
``INFERCAP_PROXY_PROFILE=FILE`` the worker runs cProfile on its event loop thread from start-up and writes the stats
(``pstats`` format, the totals so far) to FILE every ``WRITE_EVERY_S`` and at a normal exit. (uvicorn ends on
SIGTERM by raising the signal again once it has shut down, so no exit hook runs then: the last periodic write is
what a stopped worker leaves.) Off unless set: the profiler slows every call, so its
figures say where the time goes, not how much there is (``bench proxy --opt profile=FILE`` reads them back and sums
them per module; docs/request-path.md#what-it-costs-measured)."""

from __future__ import annotations

import asyncio
import atexit
import cProfile
import logging
import os

log = logging.getLogger(__name__)

ENV = "INFERCAP_PROXY_PROFILE"
WRITE_EVERY_S = 2.0


def start_from_env() -> cProfile.Profile | None:
    path = os.environ.get(ENV)
    if not path:
        return None
    profile = cProfile.Profile()
    profile.enable()
    atexit.register(_dump, profile, path)
    log.warning("proxy: profiling this worker into %s (slower while it runs)", path)
    return profile


async def keep_writing(profile: cProfile.Profile) -> None:
    """Write the totals so far every ``WRITE_EVERY_S`` (a background task of the worker)."""
    path = os.environ[ENV]
    while True:
        await asyncio.sleep(WRITE_EVERY_S)
        _dump(profile, path)
        profile.enable()


def _dump(profile: cProfile.Profile, path: str) -> None:
    profile.disable()
    try:
        profile.dump_stats(path + ".tmp")
        os.replace(path + ".tmp", path)  # a reader never sees half a file
    except OSError as exc:
        log.warning("proxy: profile not written to %s: %s", path, exc)
