"""WebSocket URL patterns of the console, imported by config.routing."""

from django.urls import path

from console.consumers import ConsoleConsumer

websocket_urlpatterns = [path("ws/console/", ConsoleConsumer.as_asgi())]
