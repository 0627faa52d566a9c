"""The shipped package booted as deployed: the prod overlay's web/proxy, worker and beat started with their own
command lines and environment (production settings) against the test PostgreSQL and Redis, then probed as the
kubelet probes them and used as an operator uses them; the Dockerfile's CMD and HEALTHCHECK the same way
(benchmarks/operations/production_boot.py says what is mapped from a pod to this machine)."""

import pytest

from benchmarks.operations import production_boot
from workers import manifests

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(manifests.kubectl() is None, reason="kubectl (kustomize) not installed"),
]


def test_the_shipped_package_boots_and_serves_with_the_production_settings(clean_redis):
    result = production_boot.run(progress=lambda line: None)
    assert result["failed"] == [], "\n".join(result["failed"])
    assert result["checks"] >= 12
