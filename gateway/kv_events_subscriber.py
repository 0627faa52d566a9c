"""Subscribes to a vLLM replica's KV-cache events (ZMQ SUB) and feeds the router's precise prefix index.

vLLM started with ``--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint":
"tcp://*:5557", "topic": "kv"}'`` publishes ``(topic, seq, msgpack payload)`` per scheduler step that changed
its prefix cache (``gateway.routing.kv_events``). ``KVEventSubscriber`` connects a SUB socket to it, decodes
each message and applies it to a ``KVBlockIndex`` under ``lock`` (the router reads the index under the same lock
when it runs in another thread). The index itself decides what a gap, a replay or a restarted publisher means
(docs/algorithms.md, the precise prefix index). A malformed message is counted and skipped, never fatal.

A socket monitor tells the thread when the publisher's connection drops (the engine stopped: ZMQ reconnects by
itself when it is back, and a SUB socket says nothing of it otherwise); the index then stops trusting the replica
until its next batch, which says whether a new engine with an empty cache or the same one is publishing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import msgpack
import zmq
from zmq.utils.monitor import recv_monitor_message

from gateway.routing.kv_events import BadEventBatch, batch_from, seq_from
from gateway.routing.kv_index import KVBlockIndex

log = logging.getLogger(__name__)


class KVEventSubscriber:
    def __init__(
        self,
        *,
        index: KVBlockIndex,
        replica_id: str,
        endpoint: str,
        topic: str = "",
        lock: threading.Lock | None = None,
        clock: Callable[[], float] = time.monotonic,
        poll_ms: int = 100,
        on_batch: Callable[[], None] | None = None,
    ):
        self.index, self.replica_id, self.endpoint, self.topic = index, replica_id, endpoint, topic
        self.lock = lock or threading.Lock()
        self.clock = clock
        self.poll_ms = poll_ms
        self.on_batch = on_batch  # called after each applied batch (the proxy counts them per replica)
        self.received = 0
        self.malformed = 0
        self.disconnects = 0  # times the publisher's connection dropped
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._connected = threading.Event()

    def handle(self, frames: list[bytes]) -> bool:
        """Apply one ``(topic, seq, payload)`` message; False (and counted) when it is not a KV event batch."""
        if len(frames) != 3:
            self.malformed += 1
            return False
        _topic, seq_frame, payload = frames
        try:
            batch = batch_from(msgpack.unpackb(payload, raw=False, strict_map_key=False))
        except (BadEventBatch, ValueError, TypeError, msgpack.UnpackException) as exc:
            self.malformed += 1
            log.warning("replica %s: skipping a malformed KV event message: %s", self.replica_id, exc)
            return False
        with self.lock:
            self.index.apply(self.replica_id, seq_from(seq_frame), batch, self.clock())
        self.received += 1
        if self.on_batch is not None:
            self.on_batch()
        return True

    def on_monitor_event(self, event: int) -> None:
        """A ZMQ socket-monitor event: a dropped connection makes the replica's events untrusted until its next
        batch (``KVBlockIndex.disconnected``)."""
        if event == zmq.EVENT_DISCONNECTED:
            self.disconnects += 1
            with self.lock:
                self.index.disconnected(self.replica_id)
            log.info("replica %s: its KV event publisher disconnected", self.replica_id)

    def _read_monitor(self, monitor: zmq.Socket) -> None:
        try:
            event = recv_monitor_message(monitor)["event"]
        except (zmq.ZMQError, ValueError, KeyError, IndexError) as exc:  # never fatal, as a malformed batch
            log.warning("replica %s: unreadable ZMQ monitor event: %s", self.replica_id, exc)
            return
        self.on_monitor_event(event)

    def start(self, wait_s: float = 5.0) -> None:
        """Start the thread; wait up to ``wait_s`` for its socket to connect (0: return at once, as the proxy
        does on its event loop)."""
        self._thread = threading.Thread(target=self._run, name=f"kv-events-{self.replica_id}", daemon=True)
        self._thread.start()
        if wait_s > 0:
            self._connected.wait(wait_s)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)  # 0: told to stop; it leaves within ``poll_ms``

    def _run(self) -> None:
        context = zmq.Context.instance()
        socket = context.socket(zmq.SUB)
        monitor = None
        try:
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt_string(zmq.SUBSCRIBE, self.topic)
            monitor = socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            socket.connect(self.endpoint)
            self._connected.set()
            poller = zmq.Poller()
            poller.register(socket, zmq.POLLIN)
            poller.register(monitor, zmq.POLLIN)
            while not self._stop.is_set():
                ready = dict(poller.poll(self.poll_ms))
                if monitor in ready:  # before the data: a new engine's first batch must find the drop noted
                    self._read_monitor(monitor)
                if socket in ready:
                    self.handle(socket.recv_multipart())
        finally:
            if monitor is not None:
                socket.disable_monitor()
                monitor.close(0)
            socket.close(0)
