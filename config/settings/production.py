"""Production settings: every secret from the environment, no usable default, hardened headers."""

from django.core.exceptions import ImproperlyConfigured

from .base import *  # noqa: F401,F403
from .base import BACKENDS, SECRET_KEY
from .env import env_bool, env_int

# These are also the settings used when DJANGO_SETTINGS_MODULE is unset, so each refusal says how to develop.
_FOR_DEVELOPMENT = "(for development, set DJANGO_SETTINGS_MODULE=config.settings.local)"

if not SECRET_KEY or len(SECRET_KEY) < 50 or len(set(SECRET_KEY)) < 5 or SECRET_KEY.startswith("django-insecure"):
    raise ImproperlyConfigured(
        f"DJANGO_SECRET_KEY must be set to a random string of at least 50 characters {_FOR_DEVELOPMENT}"
    )
if env_bool("DJANGO_DEBUG", False):
    raise ImproperlyConfigured(
        f"DJANGO_DEBUG must be off in production: it shows settings and code {_FOR_DEVELOPMENT}"
    )
if BACKENDS.embedded_database or BACKENDS.embedded_redis:
    raise ImproperlyConfigured(f"production needs DATABASE_URL (PostgreSQL) and REDIS_URL {_FOR_DEVELOPMENT}")

DEBUG = False
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", True)
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
SECURE_HSTS_SECONDS = env_int("DJANGO_SECURE_HSTS_SECONDS", 31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = True
SECURE_HSTS_PRELOAD = True
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
