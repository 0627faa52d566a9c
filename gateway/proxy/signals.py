"""Bump the proxy config version when anything in its snapshot changes, so every proxy process reloads
at once (``endpoints/config_version.py``). Connected from ``GatewayConfig.ready``."""

from functools import partial

from django.db import transaction
from django.db.models.signals import post_delete, post_save

from capacity.models import CapacityBenchmark, ModelProfile
from endpoints.config_version import ALL, CONFIG, KEYS, bump_config_version
from endpoints.models import Adapter, Endpoint, Replica
from tenants.models import ApiKey, CapacityReservation, Tenant

# Health probes save these fields every few seconds; they do not change what the proxy routes to.
_PROBE_ONLY_FIELDS = frozenset({"last_probe_at", "last_probe_ok", "consecutive_probe_failures", "last_used_at"})
# A key or tenant saved: the proxies read the keys changed since their last read (by ``changed_at``). Deleted: no
# row is left to read, so they read everything again.
_KEY_MODELS = (ApiKey, Tenant)


def _changed(sender, instance=None, update_fields=None, **kwargs) -> None:
    if update_fields and frozenset(update_fields) <= _PROBE_ONLY_FIELDS:
        return
    transaction.on_commit(partial(bump_config_version, KEYS if sender in _KEY_MODELS else CONFIG))


def _deleted(sender, instance=None, **kwargs) -> None:
    transaction.on_commit(partial(bump_config_version, ALL if sender in _KEY_MODELS else CONFIG))


def connect() -> None:
    for model in (ApiKey, Tenant, CapacityReservation, Endpoint, Replica, Adapter, ModelProfile, CapacityBenchmark):
        uid = f"infercap-proxy-config-{model._meta.label_lower}"
        post_save.connect(_changed, sender=model, dispatch_uid=uid + "-save")
        post_delete.connect(_deleted, sender=model, dispatch_uid=uid + "-delete")
