"""The shipped web server bounds how long a request's headers and body may take, over a real socket: clients that
trickle them, or open a connection and send nothing, are answered 408 and disconnected within the bound, while a
slow client inside it and a kept-alive connection are served."""

import socket
import time

import pytest

from benchmarks.harness.security.cases.hardening import (
    SHIPPED_COMMANDS,
    ThreadedServer,
    shipped_uvicorn_params,
    slow_clients,
)
from config.http_server import BoundedHttpToolsProtocol

BOUND_S = 1.0


@pytest.fixture
def server():
    bounded = type("Bounded", (BoundedHttpToolsProtocol,), {"header_timeout_s": BOUND_S, "body_timeout_s": BOUND_S})
    running = ThreadedServer(shipped_uvicorn_params("Dockerfile"), bounded)
    yield running
    running.close()


@pytest.mark.parametrize("shipped", sorted(SHIPPED_COMMANDS))
def test_every_shipped_command_runs_the_bounded_protocol(shipped):
    assert shipped_uvicorn_params(shipped)["http"] == "config.http_server:BoundedHttpToolsProtocol"


def test_the_default_bounds():
    assert BoundedHttpToolsProtocol.header_timeout_s == 10.0
    assert BoundedHttpToolsProtocol.body_timeout_s == 30.0


def test_trickling_and_silent_clients_are_disconnected_within_the_bound(server):
    closed = slow_clients(server.port, trickling=10, watch_s=BOUND_S + 3)
    assert all(after is not None and BOUND_S - 0.3 <= after <= BOUND_S + 1.0 for after in closed.values()), closed


def test_the_timed_out_client_is_told_408():
    bounded = type("Bounded", (BoundedHttpToolsProtocol,), {"header_timeout_s": 0.5})
    running = ThreadedServer(shipped_uvicorn_params("Dockerfile"), bounded)
    try:
        with socket.create_connection(("127.0.0.1", running.port), timeout=5) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
            answer = sock.recv(4096)
            assert answer.startswith(b"HTTP/1.1 408 ")
            assert sock.recv(4096) == b""
    finally:
        running.close()


def _request(sock: socket.socket, pieces: list[bytes], pause_s: float) -> bytes:
    for piece in pieces:
        sock.sendall(piece)
        time.sleep(pause_s)
    return sock.recv(4096)


def test_a_slow_client_within_the_bound_and_a_kept_alive_connection_are_served(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        slow = [b"POST / HTTP/1.1\r\n", b"Host: x\r\n", b"Content-Length: 4\r\n\r\n", b"ab", b"cd"]
        assert _request(sock, slow, pause_s=BOUND_S / 8).startswith(b"HTTP/1.1 200 ")
        # The next request on the same connection gets a fresh bound, even after a pause longer than it.
        time.sleep(BOUND_S * 0.6)
        again = _request(sock, [b"GET / HTTP/1.1\r\nHost: x\r\n", b"\r\n"], pause_s=BOUND_S * 0.6)
        assert again.startswith(b"HTTP/1.1 200 ")
