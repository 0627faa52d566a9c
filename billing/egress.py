"""Which addresses the platform may send tenant-controlled HTTP requests to (webhooks): public ones only.

Pure code (no Django): the host is resolved and *every* address it resolves to must be globally routable, so a
name pointing at loopback, link-local metadata (169.254.169.254), private, carrier-grade NAT (100.64/10) or any
other special range is refused, however it is spelled (decimal ``2130706433``, ``[::ffff:127.0.0.1]``, a DNS
name). The caller then connects to one of the checked addresses, never to the name again, so DNS cannot change
the answer between the check and the connection (rebinding).
"""

from __future__ import annotations

import ipaddress
import socket

# IPv6 prefixes that carry an IPv4 address in their last 32 bits, which a translator on the path may reach
# (NAT64 well-known prefix, RFC 6052); the embedded address must be public too.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class EgressRefused(ValueError):
    """The host may not be contacted: it does not resolve, or resolves to an address that is not public."""


def resolve_host(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to, as the operating system's resolver answers now (literals included).

    Module-level so tests and the security bench can replace it with a resolver they control.
    """
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses: list[str] = []
    for *_, sockaddr in infos:
        if sockaddr[0] not in addresses:
            addresses.append(sockaddr[0])
    return addresses


def address_is_public(address: str) -> bool:
    """True only for a globally routable unicast address (IPv4-mapped and NAT64 IPv6 judged by their IPv4)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if embedded is None and ip in _NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None and not address_is_public(str(embedded)):
            return False
    return ip.is_global and not (ip.is_multicast or ip.is_reserved or ip.is_unspecified)


def public_addresses(host: str, port: int) -> list[str]:
    """The addresses of ``host``, all checked public; raises ``EgressRefused`` if any one is not (or none)."""
    host = host.strip("[]")
    if not host:
        raise EgressRefused("the URL has no host")
    try:
        addresses = resolve_host(host, port)
    except (OSError, UnicodeError) as exc:
        raise EgressRefused(f"{host} does not resolve") from exc
    if not addresses:
        raise EgressRefused(f"{host} does not resolve")
    internal = [a for a in addresses if not address_is_public(a)]
    if internal:
        # One internal answer is enough to refuse: an attacker can mix a public and an internal record.
        raise EgressRefused(f"{host} resolves to {internal[0]}, which is not a public address")
    return addresses
