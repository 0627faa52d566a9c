"""Fixtures for the rollout tests: a clean Redis namespace and no replica process left behind."""

from tests.autoscaling.conftest import clean_store, reap_local_replicas  # noqa: F401
