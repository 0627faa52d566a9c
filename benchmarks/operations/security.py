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

from django.conf import settings

from benchmarks.harness.security.registry import cases_run, cases_select
from benchmarks.harness.security.world import world_create
from benchmarks.harness.throwaway_database import throwaway_database
from tenants.throttling import auth_failures_forget

# --smoke: one case on the test client, one through a real proxy (the registry's two ways of running a case).
SMOKE = {"cases": "accounts.key_cannot_create_user,hardening.proxy_invalid_keys"}


def run(*, quick: bool, plot: str | None = None, live: bool = False, progress=print, **opts) -> dict:
    names = [n.strip() for n in str(opts.get("cases", "")).split(",") if n.strip()] or None
    cases = cases_select(quick=quick, names=names)
    if any(c.needs_proxy for c in cases) and (settings.BACKENDS.embedded_database or settings.BACKENDS.embedded_redis):
        raise RuntimeError("bench security starts a proxy, which needs PostgreSQL and Redis (DATABASE_URL, REDIS_URL)")
    with throwaway_database("security", progress):
        results = _cases_run(cases, progress)
    failures = [r for r in results if not r.passed]
    return {
        "security.cases": len(results),
        "security.failures": len(failures),
        "security.failed": [r.name for r in failures],
        "security.results": [r.as_dict() for r in results],
    }


def _cases_run(cases: list, progress) -> list:
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
        return cases_run(cases, world, progress=progress)
    finally:
        request_log.setLevel(request_log_level)
        if world is not None:
            world.close()
