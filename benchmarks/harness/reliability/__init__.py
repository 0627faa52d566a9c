"""Fault injection for the reliability bench and tests: a TCP relay that can cut a dependency, and a
harness that runs the platform's real processes (proxy, Celery worker and beat, simulated replicas)."""
