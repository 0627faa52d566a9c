"""The version of the configuration the proxies serve: a counter in Redis that every change to what a proxy routes
by (keys, tenants, reservations, endpoints, replicas, adapters, profiles) bumps, and a channel that announces each
bump, so every proxy process reloads its snapshot at once instead of at its next poll (docs/request-path.md).

The gateway's signal receivers (``gateway/proxy/signals.py``) bump it on model saves; services whose writes send no
``post_save`` (bulk updates, rollout steps) bump it themselves."""

import logging

from django.conf import settings

log = logging.getLogger(__name__)

VERSION_KEY = "infercap:config:version"
VERSION_CHANNEL = "infercap:config:changed"
_redis_client = None


def _redis():
    global _redis_client
    if _redis_client is None and settings.REDIS_URL:
        # Deferred: every Django process loads the gateway's receivers (GatewayConfig.ready), and redis (~0.1 s to
        # import) is needed only by one that saves a model the proxy reads.
        import redis

        _redis_client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=0.5, socket_timeout=0.5)
    return _redis_client


def bump_config_version() -> None:
    """Best effort: when Redis is down the proxies fall back to periodic reloads."""
    client = _redis()
    if client is None:
        return
    try:
        client.publish(VERSION_CHANNEL, client.incr(VERSION_KEY))
    except Exception as exc:  # noqa: BLE001 - an edit must not fail because the cache is down
        log.warning("could not bump proxy config version: %s", exc)
