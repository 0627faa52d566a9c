"""A resolver the security bench and tests control: names mapped here resolve to the given addresses for every
caller in this process (the webhook guard, httpx's own connections), anything else goes to the real resolver.

    with FakeDNS({"hooks.example": ["93.184.216.34"]}) as dns:
        ...                                            # registered: hooks.example is public
        dns.names["hooks.example"] = ["127.0.0.1"]     # rebound before delivery
"""

from __future__ import annotations

import socket
from unittest import mock


class FakeDNS:
    def __init__(self, names: dict[str, list[str]] | None = None) -> None:
        self.names: dict[str, list[str]] = {k.lower(): v for k, v in (names or {}).items()}
        self.lookups: list[str] = []
        self._real = socket.getaddrinfo
        self._patch = mock.patch.object(socket, "getaddrinfo", self._getaddrinfo)

    def _getaddrinfo(self, host, port, family=0, type=0, proto=0, flags=0):
        name = host.decode() if isinstance(host, bytes) else host
        if isinstance(name, str) and name.lower() in self.names:
            self.lookups.append(name.lower())
            if not self.names[name.lower()]:
                raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
            out = []
            for address in self.names[name.lower()]:
                if ":" in address:
                    out.append((socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, int(port or 0), 0, 0)))
                else:
                    out.append((socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, int(port or 0))))
            return out
        return self._real(host, port, family, type, proto, flags)

    def __enter__(self) -> FakeDNS:
        self._patch.start()
        return self

    def __exit__(self, *exc) -> None:
        self._patch.stop()
