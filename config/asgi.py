"""ASGI entry point: Channels routes HTTP (the OpenAI-compatible proxy under /v1/, Django for the rest)
and WebSockets (the console's live updates)."""

import os

# Unset means production (fail closed); development sets config.settings.local explicitly (make run does).
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.production")

from config import tracing  # noqa: E402
from config.metrics_dir import metrics_dir_ready  # noqa: E402

# Before the proxy's metrics first write there (config/metrics_dir.py).
metrics_dir_ready()

# Off unless the environment turns it on (INFERCAP_TRACING=1 or OTEL_TRACES_EXPORTER; config/tracing.py).
tracing.configure_from_env()

from django.core.asgi import get_asgi_application  # noqa: E402

# The console's CSS/JS come from the app itself (WhiteNoise's middleware: config/settings/base.py).
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from config.routing import http_application, websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": http_application(django_asgi_app),
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
