"""Celery tasks: thin wrappers that take ids, load, and call a service. One module per control loop."""

from config.discovery import import_submodules

import_submodules(__name__)
