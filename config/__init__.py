"""Project configuration: settings, URLs, the ASGI entry point and the Celery app."""

from .celery_app import app as celery_app

__all__ = ("celery_app",)
