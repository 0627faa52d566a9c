"""Developer and demo settings: DEBUG on, a throwaway secret, the embedded default when nothing is configured."""

import os
import sys

from .base import *  # noqa: F401,F403
from .base import BACKENDS

# The lab's app, for its ``bench`` command (benchmarks/); the product never imports it.
INSTALLED_APPS = [*INSTALLED_APPS, "benchmarks"]  # noqa: F405

DEBUG = True
SECRET_KEY = SECRET_KEY or "local-only-insecure-key-never-use-in-production"  # noqa: F405
EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"  # reset links land in the terminal

if (BACKENDS.embedded_database or BACKENDS.embedded_redis) and not os.environ.get("INFERCAP_QUIET"):
    # Say once per process which backends are in use, so nobody mistakes the demo for production.
    os.environ["INFERCAP_QUIET"] = "1"
    print(f"infercap: {BACKENDS.describe()}", file=sys.stderr)

# The proxy's /metrics needs a bearer token (production: INFERCAP_METRICS_TOKEN, else it answers 404).
INFERCAP["METRICS_TOKEN"] = os.environ.get("INFERCAP_METRICS_TOKEN") or "local-metrics-token"  # noqa: F405
