"""Test settings: the real PostgreSQL and Redis (DATABASE_URL / REDIS_URL, defaulting to the local servers)."""

import os

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/infercap")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/15")

from .base import *  # noqa: E402,F401,F403

# The lab's app, for its ``bench`` command (benchmarks/); the product never imports it.
INSTALLED_APPS = [*INSTALLED_APPS, "benchmarks"]  # noqa: F405

SECRET_KEY = "test-only-key"
DEBUG = False
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
CELERY_TASK_ALWAYS_EAGER = True
CELERY_TASK_EAGER_PROPAGATES = True
INFERCAP["SNAPSHOT_POLL_S"] = 0.1  # noqa: F405
# High enough that no test trips the API throttles by accident; tests/api/test_throttling.py lowers them.
REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"] = {"principal": "100000/min", "anon": "100000/min"}  # noqa: F405
# Likewise the failed-authentication lock-out: the suite's bad keys all come from the test client's 127.0.0.1.
# The login and lock-out tests lower it.
INFERCAP["LOGIN_THROTTLE"] = {**INFERCAP["LOGIN_THROTTLE"], "failures_per_address": 100000}  # noqa: F405
# The proxy's /metrics needs a bearer token (none configured: 404); tests scrape with this one.
INFERCAP["METRICS_TOKEN"] = "test-metrics-token"  # noqa: F405
