"""A free TCP port, for the processes the platform starts on one host (replicas, the local actuator's)."""

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS has just handed out on ``host``; free until someone binds it (a race the callers accept)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
