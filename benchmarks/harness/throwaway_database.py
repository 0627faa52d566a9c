"""A bench's own test database and Django test environment, unless the run already has them (under pytest)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from django.db import connection
from django.test.utils import setup_databases, setup_test_environment, teardown_databases, teardown_test_environment


@contextmanager
def throwaway_database(label: str, progress: Callable[[str], None]) -> Iterator[None]:
    """Run the block on ``test_<name>_<label>_<pid>``, created here and dropped after, unless the current database
    already is a test one; and in Django's test environment (the test client needs ``testserver`` allowed and
    in-memory mail), set up here unless the test runner already did."""
    own_environment = test_environment_setup()
    own_databases = None
    try:
        if not connection.settings_dict["NAME"].startswith("test_"):
            # Its own name, so it never clobbers the test database of a pytest run on the same server.
            connection.settings_dict.setdefault("TEST", {})["NAME"] = (
                f"test_{connection.settings_dict['NAME']}_{label}_{os.getpid()}"
            )
            progress(f"creating the throwaway database {connection.settings_dict['TEST']['NAME']}")
            own_databases = setup_databases(verbosity=0, interactive=False)
        yield
    finally:
        if own_databases is not None:
            connection.close()
            teardown_databases(own_databases, verbosity=0)
        if own_environment:
            teardown_test_environment()


def test_environment_setup() -> bool:
    """Set up Django's test environment; False when the test runner already has (it then tears it down)."""
    try:
        setup_test_environment()
    except RuntimeError:  # already set up by the test runner
        return False
    return True
