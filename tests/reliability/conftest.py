"""One running platform (proxy, Celery worker + beat, three simulated replicas, PostgreSQL and Redis
behind cuttable relays) shared by the fault-injection tests of this package.

The platform's processes read the test database, so the data it needs is committed outside the
per-test transactions; the fixture removes what it created at the end.
"""

import pytest

from benchmarks.harness.reliability.harness import Platform


def _say(message: str) -> None:
    print(f"[reliability] {message}")


@pytest.fixture(scope="module")
def platform(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        # pytest-django creates the test database only when a collected test asks for `db`; these tests share
        # committed data with other processes instead, so when they run alone they create it themselves.
        from django.db import connection
        from django.test.utils import setup_databases, teardown_databases

        own_setup = None
        if not connection.settings_dict["NAME"].startswith("test_"):
            own_setup = setup_databases(verbosity=0, interactive=False)
        try:
            with Platform(progress=_say) as running:
                yield running
            from endpoints.models import Endpoint
            from tenants.models import Tenant

            Endpoint.objects.filter(pk=running.seeded.endpoint_id).delete()
            Tenant.objects.filter(pk=running.seeded.tenant_id).delete()
        finally:
            if own_setup is not None:
                teardown_databases(own_setup, verbosity=0)


@pytest.fixture
def db_access(django_db_blocker):
    """Query the committed data the platform's processes write (not inside a test transaction)."""
    with django_db_blocker.unblock():
        yield
