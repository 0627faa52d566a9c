"""The fault relay ``bench metering --live`` puts in front of a real engine: it forwards, cuts a stream after N SSE
events (the count starting again with each request on a kept-alive connection), refuses connections and comes
back."""

import socket
import threading
import time

import pytest

from benchmarks.operations.fault_relay import FaultRelay

EVENTS = 50


@pytest.fixture
def upstream():
    """A server that answers every request on a connection with ``EVENTS`` SSE events."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)

    def answer(conn: socket.socket) -> None:
        try:
            while conn.recv(1000):
                for i in range(EVENTS):
                    conn.sendall(b'data: {"i": %d}\n\n' % i)
                    time.sleep(0.002)
        except OSError:
            pass

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


def read_events(conn: socket.socket, *, until: int = EVENTS) -> int:
    """Events read until the relay closes the connection, or ``until`` of them."""
    seen = b""
    conn.settimeout(5)
    while seen.count(b"data: ") < until:
        try:
            data = conn.recv(65536)
        except ConnectionResetError:
            break
        if not data:
            break
        seen += data
    return seen.count(b"data: ")


def test_forwards_then_cuts_each_stream_after_n_events_then_refuses_and_comes_back(upstream):
    relay = FaultRelay(upstream)
    try:
        kept_alive = socket.create_connection(("127.0.0.1", relay.port))
        kept_alive.sendall(b"GET / HTTP/1.1\r\n\r\n")
        assert read_events(kept_alive) == EVENTS

        relay.reset_streams(after_events=20)
        kept_alive.sendall(b"GET / HTTP/1.1\r\n\r\n")  # a second request on the same connection: counted afresh
        assert read_events(kept_alive) == 20

        relay.restore()
        open_one = socket.create_connection(("127.0.0.1", relay.port))
        time.sleep(0.1)
        relay.refuse()
        assert read_events(open_one) == 0  # the open connection is closed, not left hanging
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", relay.port), timeout=2)

        relay.restore()
        again = socket.create_connection(("127.0.0.1", relay.port))
        again.sendall(b"GET / HTTP/1.1\r\n\r\n")
        assert read_events(again) == EVENTS
    finally:
        relay.close()
