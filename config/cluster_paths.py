"""The paths the cluster itself calls, answered before Django checks the Host header or redirects to https.

The kubelet probes a pod at its IP over plain HTTP, and Prometheus scrapes ``/metrics/platform`` the same way
(the Dockerfile's HEALTHCHECK calls 127.0.0.1): none of them sends a host in ``DJANGO_ALLOWED_HOSTS`` or comes
through the TLS-terminating ingress. These views build no URL from the host, so answering them whatever the Host
leaves ``ALLOWED_HOSTS`` and ``SECURE_SSL_REDIRECT`` in force for every other path (docs/security.md).
"""

from django.urls import resolve

# /healthz: the liveness and startup probes; /metrics/platform: the books as gauges, behind the metrics token.
CLUSTER_PATHS = frozenset({"/healthz", "/metrics/platform"})


class ClusterPathsMiddleware:
    """First in ``MIDDLEWARE``: a cluster path goes straight to its view, skipping the middleware that reads the
    host (``CommonMiddleware``, ``SecurityMiddleware``'s https redirect) and tracing (probes every few seconds)."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        if request.path_info not in CLUSTER_PATHS:
            return self.get_response(request)
        match = resolve(request.path_info)
        return match.func(request, *match.args, **match.kwargs)
