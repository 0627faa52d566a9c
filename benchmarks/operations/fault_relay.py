"""A TCP relay in front of a real replica that a bench can make fail as a replica does: refuse connections (a
stopped server) or reset a streamed answer after a number of SSE events (a crash mid-stream). The real engine has
no fault injection of its own; the simulator's ``/admin/faults`` does this from inside.

    relay = FaultRelay(engine_port)          # http://127.0.0.1:{relay.port} reaches the engine
    relay.refuse()                           # new connections refused, open ones reset
    relay.reset_streams(after_events=20)     # an answer that sends its 20th ``data:`` event is cut there
    relay.restore()                          # plain forwarding again
    relay.close()
"""

from __future__ import annotations

import socket
import struct
import threading

from simulator.process import free_port

_RST = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a reset, as a crashed peer's kernel does


class _Connection:
    """One client connection and its upstream; ``events``: ``data:`` events the upstream sent since the client's
    last bytes (a new request on a kept-alive connection starts the count again)."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client, self.upstream = client, upstream
        self.events = 0

    def reset(self) -> None:
        # shutdown first: a close() alone waits for the other thread's recv() on the socket, and the peer would see
        # nothing until its idle timeout
        for s in (self.client, self.upstream):
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RST)
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for s in (self.client, self.upstream):
            s.close()


class FaultRelay:
    def __init__(self, target_port: int, *, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self.reset_after_events: int | None = None
        self.resets = 0  # streams cut so far
        self._lock = threading.Lock()
        self._conns: list[_Connection] = []
        self._listener: socket.socket | None = None
        self._listen()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def refuse(self) -> None:
        """Refuse new connections and reset the open ones, as a stopped server would."""
        if self._listener is not None:
            try:
                self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept(), so close() frees the port now
            except OSError:
                pass
            self._listener.close()
            self._listener = None
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            conn.reset()

    def reset_streams(self, *, after_events: int) -> None:
        self.reset_after_events = after_events

    def restore(self) -> None:
        self.reset_after_events = None
        if self._listener is None:
            self._listen()

    def close(self) -> None:
        self.refuse()

    def _listen(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            conn = _Connection(client, upstream)
            with self._lock:
                self._conns.append(conn)
            threading.Thread(target=self._requests, args=(conn,), daemon=True).start()
            threading.Thread(target=self._answers, args=(conn,), daemon=True).start()

    def _requests(self, conn: _Connection) -> None:
        try:
            while data := conn.client.recv(65536):
                conn.events = 0
                conn.upstream.sendall(data)
        except OSError:
            pass
        self._forget(conn)

    def _answers(self, conn: _Connection) -> None:
        try:
            while data := conn.upstream.recv(65536):
                events, limit = data.count(b"data: "), self.reset_after_events
                if limit is not None and conn.events + events >= limit:
                    conn.client.sendall(_through_event(data, limit - conn.events))
                    self.resets += 1
                    conn.reset()
                    break
                # counted before it is sent: once the client has it, it may send its next request, whose count
                # starts at 0 in the other thread and must not then get this answer's events added
                conn.events += events
                conn.client.sendall(data)
        except OSError:
            pass
        self._forget(conn)

    def _forget(self, conn: _Connection) -> None:
        for s in (conn.client, conn.upstream):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        with self._lock:
            if conn in self._conns:
                self._conns.remove(conn)


def _through_event(data: bytes, keep: int) -> bytes:
    """``data`` up to its ``keep``-th SSE event, the next one's ``data:`` and what follows dropped."""
    start = -1
    for _ in range(keep + 1):
        start = data.find(b"data: ", start + 1)
        if start < 0:
            return data
    return data[:start]
