"""Kept for existing commands: the console's static files are now served by ``config.asgi`` itself."""

from config.asgi import application

__all__ = ["application"]
