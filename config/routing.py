"""Channels routing tables. The proxy and console modules register themselves here."""
from channels.routing import URLRouter
from django.urls import re_path

from console.routing import websocket_urlpatterns as console_websocket_urlpatterns

websocket_urlpatterns: list = [*console_websocket_urlpatterns]


def http_application(django_asgi_app):
    """HTTP: /v1/ and /metrics go to the proxy once it exists; everything else to Django."""
    return URLRouter([re_path(r"", django_asgi_app)])
