"""Bump the proxy config version when anything in its snapshot changes, so every proxy process reloads
within one poll interval. Connected from ``EndpointsConfig.ready``."""

import logging

from django.conf import settings
from django.db import transaction
from django.db.models.signals import post_delete, post_save

from capacity.models import CapacityBenchmark, ModelProfile
from endpoints.models import Adapter, Endpoint, Replica
from gateway.proxy.snapshot import VERSION_KEY
from tenants.models import ApiKey, CapacityReservation, Tenant

log = logging.getLogger(__name__)

# Health probes save these fields every few seconds; they do not change what the proxy routes to.
_PROBE_ONLY_FIELDS = frozenset({"last_probe_at", "last_probe_ok", "consecutive_probe_failures", "last_used_at"})
# Published on every bump: proxies subscribed to it reload at once instead of at their next poll.
VERSION_CHANNEL = "infercap:config:changed"
_redis_client = None


def _redis():
    global _redis_client
    if _redis_client is None and settings.REDIS_URL:
        # Deferred: every Django process loads this module (EndpointsConfig.ready), and redis (~0.1 s to import)
        # is needed only by one that saves a model the proxy reads.
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


def _changed(sender, instance=None, update_fields=None, **kwargs) -> None:
    if update_fields and frozenset(update_fields) <= _PROBE_ONLY_FIELDS:
        return
    transaction.on_commit(bump_config_version)


def connect() -> None:
    for model in (ApiKey, Tenant, CapacityReservation, Endpoint, Replica, Adapter, ModelProfile, CapacityBenchmark):
        uid = f"infercap-proxy-config-{model._meta.label_lower}"
        post_save.connect(_changed, sender=model, dispatch_uid=uid + "-save")
        post_delete.connect(_changed, sender=model, dispatch_uid=uid + "-delete")
