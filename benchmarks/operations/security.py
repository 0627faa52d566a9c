"""``bench security [--quick]``: run the registered attack cases (``benchmarks.harness.security.cases``) against the real
platform and check that each one is refused.

The REST API is driven through Django's test client with the real authentication (session logins, Bearer keys);
cases that need the proxy get a real proxy process (production settings) in front of simulated replicas. Everything
runs on a throwaway database (``test_<name>``, created and dropped here) unless the current one already is a test
database (under pytest). Options: ``--opt cases=webhooks.,isolation.api_key_scopes`` (names or ``area.`` prefixes).
The last line is JSON: ``security.cases``, ``security.failures`` (goal 0) and ``security.results``, one entry per
case with ``name``, ``passed`` and a one-line ``detail``.
"""

from __future__ import annotations

import logging
import os

from django.conf import settings
from django.db import connection
from django.test.utils import setup_databases, setup_test_environment, teardown_databases, teardown_test_environment

from benchmarks.harness.security.registry import cases_run, cases_select
from benchmarks.harness.security.world import world_create
from tenants.throttling import auth_failures_forget


def run(*, quick: bool, plot: str | None = None, live: bool = False, progress=print, **opts) -> dict:
    names = [n.strip() for n in str(opts.get("cases", "")).split(",") if n.strip()] or None
    cases = cases_select(quick=quick, names=names)
    if any(c.needs_proxy for c in cases) and (settings.BACKENDS.embedded_database or settings.BACKENDS.embedded_redis):
        raise RuntimeError("bench security starts a proxy, which needs PostgreSQL and Redis (DATABASE_URL, REDIS_URL)")
    own_environment = _test_environment_setup()
    own_databases = None
    if not connection.settings_dict["NAME"].startswith("test_"):
        # Its own name, so it never clobbers the test database of a pytest run on the same server.
        connection.settings_dict.setdefault("TEST", {})["NAME"] = (
            f"test_{connection.settings_dict['NAME']}_security_{os.getpid()}"
        )
        progress(f"creating the throwaway database {connection.settings_dict['TEST']['NAME']}")
        own_databases = setup_databases(verbosity=0, interactive=False)
    world = None
    # Every refused attack is a 4xx that Django would log as a warning: the case lines say it once.
    request_log = logging.getLogger("django.request")
    request_log_level = request_log.level
    request_log.setLevel(logging.ERROR)
    try:
        world = world_create()
        # Cases send bad keys from the test client's address; counts an earlier run left (in Redis) must not add up.
        auth_failures_forget(address="127.0.0.1")
        progress(f"world {world.tag}: operator, tenants A and B; {len(cases)} case(s)")
        results = cases_run(cases, world, progress=progress)
    finally:
        request_log.setLevel(request_log_level)
        if world is not None:
            world.close()
        if own_databases is not None:
            connection.close()
            teardown_databases(own_databases, verbosity=0)
        if own_environment:
            teardown_test_environment()
    failures = [r for r in results if not r.passed]
    return {
        "security.cases": len(results),
        "security.failures": len(failures),
        "security.failed": [r.name for r in failures],
        "security.results": [r.as_dict() for r in results],
    }


def _test_environment_setup() -> bool:
    """Django's test client needs the test environment (``testserver`` allowed, in-memory mail); pytest has it."""
    try:
        setup_test_environment()
    except RuntimeError:  # already set up by the test runner
        return False
    return True
