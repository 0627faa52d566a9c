"""Benchmarks of the endpoints app (``python manage.py bench sim|proxy|routing``)."""
