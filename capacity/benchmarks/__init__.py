"""Benchmarks of the capacity app, run by ``python manage.py bench NAME``."""
