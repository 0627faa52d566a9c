"""The address a request came from, for per-client limits: the peer's, or behind trusted proxies (an ingress, a load
balancer) the one the outermost of them appended to X-Forwarded-For. Pure: the web throttles and the proxy share it.
"""


def client_address_from(*, remote_addr: str, forwarded_for: str | None, num_proxies: int) -> str:
    """DRF's rule for ``NUM_PROXIES``: 0 trusts no header (the peer's address); N > 0 takes the N-th entry from the
    right, the one the first trusted proxy appended. Entries to its left are whatever the client sent."""
    if num_proxies <= 0 or not forwarded_for:
        return remote_addr
    entries = [entry.strip() for entry in forwarded_for.split(",")]
    return entries[-min(num_proxies, len(entries))] or remote_addr
