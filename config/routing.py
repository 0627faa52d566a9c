"""Channels routing tables. The proxy and console modules register themselves here."""

from channels.routing import URLRouter
from django.urls import re_path

from console.routing import websocket_urlpatterns as console_websocket_urlpatterns
from gateway.proxy.app import application
from gateway.proxy.auth_throttle import throttle_failed_authentications

websocket_urlpatterns: list = [*console_websocket_urlpatterns]


_PROXY_PATHS = frozenset({"/metrics", "/health", "/ping", "/version"})
# Failed authentications on /v1/ per client address: 429 before the key is looked at (gateway/proxy/auth_throttle.py).
proxy_app = throttle_failed_authentications(application)


def http_application(django_asgi_app):
    """HTTP: /v1/, /metrics and vLLM's probes (/health, /ping, /version) go to the proxy (a plain ASGI app, no
    Django request cycle on the hot path); everything else to Django."""
    django_router = URLRouter([re_path(r"", django_asgi_app)])

    async def dispatch(scope, receive, send):
        path = scope.get("path", "")
        # A prefix test instead of URL resolution: the proxy's added latency budget is about a millisecond.
        if path.startswith("/v1/") or path in _PROXY_PATHS:
            return await proxy_app(scope, receive, send)
        return await django_router(scope, receive, send)

    return dispatch
