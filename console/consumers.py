"""The console's WebSocket: pushes replica, alert and decision events, and queue depth of watched endpoints.

A socket joins exactly one group, chosen from the authenticated user (operators, or its own tenant), so a
tenant's socket can never be subscribed to another tenant's events; queue-depth watches are checked
against the same visibility rules as the pages.
"""

import asyncio
import logging

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from console.live import OPERATORS_GROUP, tenant_group
from console.selectors import queue_depth
from endpoints.selectors import endpoints_owned_by

logger = logging.getLogger(__name__)

QUEUE_POLL_S = 2.0
MAX_WATCHED = 50


class ConsoleConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        user = self.scope.get("user")
        self.group = None
        self.watch_task = None
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        if user.is_operator:
            self.group = OPERATORS_GROUP
        elif user.tenant_id:
            self.group = tenant_group(user.tenant_id)
        else:
            await self.close(code=4403)
            return
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self.send_json({"kind": "hello", "payload": {"user": user.username}})

    async def disconnect(self, code):
        if self.watch_task:
            self.watch_task.cancel()
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content, **kwargs):
        if not isinstance(content, dict) or not isinstance(content.get("watch"), list):
            await self.send_json({"kind": "error", "payload": {"detail": 'expected {"watch": [endpoint ids]}'}})
            return
        requested = [i for i in content["watch"][:MAX_WATCHED] if isinstance(i, int) and not isinstance(i, bool)]
        allowed = await self._visible_ids(requested)
        if self.watch_task:
            self.watch_task.cancel()
        self.watch_task = asyncio.create_task(self._poll_queues(allowed)) if allowed else None
        await self.send_json({"kind": "watching", "payload": {"endpoint_ids": allowed}})

    async def console_event(self, event):
        await self.send_json({"kind": event["kind"], "payload": event["payload"]})

    async def console_close(self, event):
        """The user's tenant was suspended (``console.live.tenant_sockets_close``)."""
        await self.close(code=event.get("code", 4403))

    @database_sync_to_async
    def _visible_ids(self, ids: list[int]) -> list[int]:
        # Queue depth sums every tenant's queued requests: only operators and an endpoint's owner may watch it (a
        # tenant reserving on a shared endpoint sees its own figures, not its neighbours' queues).
        return sorted(endpoints_owned_by(self.scope["user"]).filter(pk__in=ids).values_list("pk", flat=True))

    async def _poll_queues(self, endpoint_ids: list[int]) -> None:
        last: dict[int, dict] = {}
        while True:
            for endpoint_id in endpoint_ids:
                try:
                    depth = await asyncio.to_thread(queue_depth, endpoint_id)
                except Exception:
                    logger.warning("queue depth poll failed", exc_info=True)
                    continue
                if depth != last.get(endpoint_id):
                    last[endpoint_id] = depth
                    await self.send_json({"kind": "queue", "payload": {"endpoint_id": endpoint_id, "queued": depth}})
            await asyncio.sleep(QUEUE_POLL_S)
