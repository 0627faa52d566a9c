"""The version of the configuration the proxies serve: counters in Redis that every change to what a proxy routes
by (keys, tenants, reservations, endpoints, replicas, adapters, profiles) bumps, and a channel that announces each
bump, so every proxy process reloads its snapshot at once instead of at its next poll (docs/request-path.md).

A bump says what changed, so a proxy redoes only that part: ``KEYS`` (a key or a tenant written: the proxies read
the keys changed since their last read), ``CONFIG`` (anything else: everything but the key table is rebuilt, and the
changed keys read as for ``KEYS``), ``ALL`` (a key or tenant deleted, which leaves no row to read: everything is
read again). ``VERSION_KEY`` moves on every bump; ``CONFIG_KEY`` and ``ALL_KEY`` on theirs, in the same MULTI.

The gateway's signal receivers (``gateway/proxy/signals.py``) bump it on model saves; services whose writes send no
``post_save`` (bulk updates, rollout steps) bump it themselves."""

import logging

from django.conf import settings

log = logging.getLogger(__name__)

VERSION_KEY = "infercap:config:version"
CONFIG_KEY = "infercap:config:version:config"
ALL_KEY = "infercap:config:version:all"
VERSION_CHANNEL = "infercap:config:changed"
KEYS, CONFIG, ALL = "keys", "config", "all"
_KIND_KEYS = {KEYS: (), CONFIG: (CONFIG_KEY,), ALL: (ALL_KEY,)}
_redis_client = None


def _redis():
    global _redis_client
    if _redis_client is None and settings.REDIS_URL:
        # Deferred: every Django process loads the gateway's receivers (GatewayConfig.ready), and redis (~0.1 s to
        # import) is needed only by one that saves a model the proxy reads.
        import redis

        _redis_client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=0.5, socket_timeout=0.5)
    return _redis_client


def bump_config_version(kind: str = CONFIG) -> None:
    """Best effort: when Redis is down the proxies fall back to periodic reloads. ``kind``: what changed (above);
    the default, ``CONFIG``, is right for any change but a key's or tenant's."""
    if kind not in _KIND_KEYS:
        raise ValueError(f"unknown config change kind {kind!r}; one of {', '.join(_KIND_KEYS)}")
    client = _redis()
    if client is None:
        return
    try:
        pipe = client.pipeline(transaction=True)
        for key in _KIND_KEYS[kind]:
            pipe.incr(key)
        pipe.incr(VERSION_KEY)
        version = pipe.execute()[-1]
        client.publish(VERSION_CHANNEL, version)
    except Exception as exc:  # noqa: BLE001 - an edit must not fail because the cache is down
        log.warning("could not bump proxy config version: %s", exc)
