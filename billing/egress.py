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

# An allowlist, not ``ipaddress.is_global``: what that knows depends on the Python release (3.11 calls site-local
# fec0::/10, 192.0.0.9 and the 6to4 relay anycast global) and it has no notion of prefixes that embed an IPv4
# address. IPv6 must lie in global unicast (2000::/3) or be NAT64 of a public IPv4; both families then leave out
# every special-purpose block of IANA's registries that is not an ordinary host on the internet.
_IPV6_GLOBAL_UNICAST = ipaddress.ip_network("2000::/3")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")  # well-known prefix (RFC 6052): judged by the embedded IPv4
_SIXTOFOUR = ipaddress.ip_network("2002::/16")  # 6to4 (RFC 3056): judged by the embedded IPv4
_IPV6_REFUSED = [
    ipaddress.ip_network(net)
    for net in (
        "2001::/23",  # IETF protocol assignments: Teredo 2001::/32, benchmarking, ORCHID, AMT, anycast services
        "2001:db8::/32",  # documentation
        "3fff::/20",  # documentation (RFC 9637)
    )
]
_IPV4_REFUSED = [
    ipaddress.ip_network(net)
    for net in (
        "0.0.0.0/8",  # "this network"
        "10.0.0.0/8",
        "100.64.0.0/10",  # carrier-grade NAT (RFC 6598)
        "127.0.0.0/8",
        "169.254.0.0/16",  # link-local: the cloud metadata service
        "172.16.0.0/12",
        "192.0.0.0/24",  # IETF protocol assignments (DS-Lite, PCP and TURN anycast, NAT64 discovery)
        "192.0.2.0/24",  # documentation
        "192.88.99.0/24",  # 6to4 relay anycast (deprecated, RFC 7526)
        "192.168.0.0/16",
        "198.18.0.0/15",  # benchmarking
        "198.51.100.0/24",  # documentation
        "203.0.113.0/24",  # documentation
        "224.0.0.0/4",  # multicast
        "240.0.0.0/4",  # reserved, and the limited broadcast 255.255.255.255
    )
]


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
    """True only for a globally routable unicast address: public IPv4, or IPv6 in global unicast outside the
    special blocks (6to4 and NAT64 judged by the IPv4 they carry); a zone index (``%eth0``) is never public."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv4Address):
        return ip.is_global and not any(ip in net for net in _IPV4_REFUSED)
    if ip.scope_id:
        return False
    if ip in _NAT64:
        return address_is_public(str(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)))
    if ip.sixtofour is not None:
        return address_is_public(str(ip.sixtofour))
    return ip in _IPV6_GLOBAL_UNICAST and not any(ip in net for net in _IPV6_REFUSED)


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
