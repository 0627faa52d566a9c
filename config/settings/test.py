"""Test settings: the real PostgreSQL and Redis (DATABASE_URL / REDIS_URL, defaulting to the local servers)."""

import os

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/infercap")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/15")


def _isolate_xdist_worker() -> None:
    """Under pytest-xdist (``make test`` runs two workers) each worker gets its own Redis database (the URL's,
    minus the worker's number) and its own var directory (spool, replica logs); pytest-django gives each its own
    test database. The environment carries the result, so processes the tests start see the same, and a process
    that inherits it does not shift again."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or os.environ.get("INFERCAP_XDIST_WORKER") == worker:
        return
    n = int(worker[2:])
    base, _, db = os.environ["REDIS_URL"].rpartition("/")
    os.environ["REDIS_URL"] = f"{base}/{(int(db or 0) - n) % 16}"
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "var")
    os.environ.setdefault("INFERCAP_VLLM_MODELS_DIR", os.path.join(root, "engine"))
    os.environ["INFERCAP_VAR_DIR"] = os.path.join(root, f"test-{worker}")
    os.environ["INFERCAP_XDIST_WORKER"] = worker


_isolate_xdist_worker()

from .base import *  # noqa: E402,F401,F403

SECRET_KEY = "test-only-key"
DEBUG = False
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
CELERY_TASK_ALWAYS_EAGER = True
CELERY_TASK_EAGER_PROPAGATES = True
INFERCAP["SNAPSHOT_POLL_S"] = 0.1  # noqa: F405
# High enough that no test trips the API throttles by accident; tests/api/test_throttling.py lowers them.
REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"] = {"principal": "100000/min", "anon": "100000/min"}  # noqa: F405
# The proxy's /metrics needs a bearer token (none configured: 404); tests scrape with this one.
INFERCAP["METRICS_TOKEN"] = "test-metrics-token"  # noqa: F405
