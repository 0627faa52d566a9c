"""Live events for the console: group names, publishing on commit, and the shared Redis client.

A tenant's socket joins only its own tenant group, operators join the operators group; an event is
sent to the operators group and to the groups of the tenants allowed to see its object, so isolation
is decided here, once, on the sending side.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from functools import lru_cache

import redis
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction

logger = logging.getLogger(__name__)

OPERATORS_GROUP = "console.operators"


def tenant_group(tenant_id: int) -> str:
    return f"console.tenant.{tenant_id}"


def groups_for(tenant_ids, *, operators: bool = True) -> list[str]:
    return ([OPERATORS_GROUP] if operators else []) + [tenant_group(t) for t in sorted(set(tenant_ids))]


def publish(*, kind: str, payload: dict, tenant_ids, operators: bool = True) -> None:
    """Send after the surrounding transaction commits, so no socket hears of a row that was rolled back.

    ``operators=False`` is for the second, redacted form of an event whose full form the operators already get."""
    groups = groups_for(tenant_ids, operators=operators)
    if not groups:
        return
    message = {"type": "console.event", "kind": kind, "payload": payload}
    transaction.on_commit(lambda: _send(groups, message))


def tenant_sockets_close(tenant_id: int) -> None:
    """Close every console socket of a tenant's people once the transaction commits (its suspension): a socket is
    authenticated only when it opens, so one already open would otherwise keep hearing events."""
    message = {"type": "console.close", "code": SUSPENDED_CLOSE_CODE}
    transaction.on_commit(lambda: _send([tenant_group(tenant_id)], message))


SUSPENDED_CLOSE_CODE = 4403


def _send(groups: list[str], message: dict) -> None:
    layer = get_channel_layer()
    if layer is None:
        return

    async def send_all() -> None:
        for group in groups:
            try:
                await layer.group_send(group, message)
            except Exception:  # a down channel layer must never fail the write that triggered the event
                logger.warning("console event to %s not delivered", group, exc_info=True)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        async_to_sync(send_all)()
        return
    # Sync ORM code running on an event loop's thread (allowed with DJANGO_ALLOW_ASYNC_UNSAFE, e.g. next to
    # Playwright) cannot block on that loop: send from a short-lived thread with its own loop instead.
    sender = threading.Thread(target=async_to_sync(send_all), name="console-event-send", daemon=True)
    sender.start()
    sender.join(timeout=5)


@lru_cache(maxsize=1)
def redis_client():
    """Synchronous Redis client for reads (queue depth); None on the embedded default without Redis."""
    if not settings.REDIS_URL:
        return None
    return redis.Redis.from_url(settings.REDIS_URL, decode_responses=True, socket_timeout=0.5)
