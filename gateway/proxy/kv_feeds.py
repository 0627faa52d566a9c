"""One endpoint's live precise prefix index: a ``KVBlockIndex`` fed by one KV-event subscriber per replica whose
engine publishes events (``ReplicaInfo.kv_events_endpoint``), kept in step with the config snapshot.

``sync(replicas)`` runs on the event loop when a snapshot applies: it starts a subscriber (a thread with a ZMQ SUB
socket, ``gateway.kv_events_subscriber``) for a replica that gained an endpoint, stops the one of a replica that
left or changed its endpoint, and forgets that replica's blocks. Nothing here blocks the loop: a stopping thread
is told to stop and joined only at ``close`` (process shutdown). The router reads the index under ``lock``, which
the subscribers take to apply a batch (docs/algorithms.md, the live precise index).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from gateway.kv_events_subscriber import KVEventSubscriber
from gateway.proxy import metrics as m
from gateway.routing.kv_index import KVBlockIndex

log = logging.getLogger(__name__)


class KVFeeds:
    def __init__(
        self, *, name: str = "", clock: Callable[[], float] = time.monotonic, subscriber_factory=KVEventSubscriber
    ) -> None:
        self.name = name  # the endpoint's, for the batch counter
        self.index = KVBlockIndex()
        self.lock = threading.Lock()
        self.clock = clock
        self._factory = subscriber_factory
        self.subscribers: dict[str, KVEventSubscriber] = {}
        self._stopping: list[KVEventSubscriber] = []

    def sync(self, replicas: Iterable) -> None:
        """Follow the snapshot: ``replicas`` are its ``ReplicaInfo``s (id, kv_events_endpoint)."""
        wanted = {str(r.id): r.kv_events_endpoint for r in replicas if r.kv_events_endpoint}
        for rid, subscriber in list(self.subscribers.items()):
            if wanted.get(rid) != subscriber.endpoint:
                self._stop(rid)
        for rid, endpoint in wanted.items():
            if rid not in self.subscribers:
                self._start(rid, endpoint)

    def _start(self, rid: str, endpoint: str) -> None:
        subscriber = self._factory(
            index=self.index,
            replica_id=rid,
            endpoint=endpoint,
            topic="",
            lock=self.lock,
            clock=self.clock,
            on_batch=m.child(m.KV_EVENT_BATCHES, self.name, rid).inc,
        )
        try:
            subscriber.start(wait_s=0.0)
        except Exception:  # noqa: BLE001 - a bad address leaves the replica on the approximate index
            log.exception("replica %s: cannot subscribe to its KV events at %s", rid, endpoint)
            return
        self.subscribers[rid] = subscriber

    def _stop(self, rid: str) -> None:
        subscriber = self.subscribers.pop(rid)
        subscriber.stop(timeout_s=0.0)
        self._stopping.append(subscriber)
        with self.lock:
            self.index.forget(rid)  # a new subscription starts from an empty picture (a sequence from scratch)
        self._stopping = [s for s in self._stopping if s.alive]

    @property
    def active(self) -> bool:
        return bool(self.subscribers)

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop every subscriber and wait for their threads (shutdown)."""
        for rid in list(self.subscribers):
            self._stop(rid)
        for subscriber in self._stopping:
            subscriber.stop(timeout_s=timeout_s)
        self._stopping = [s for s in self._stopping if s.alive]
