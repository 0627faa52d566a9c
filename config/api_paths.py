"""REST paths as Django REST users type them: with or without the trailing slash, and JSON when nothing is there.

The API's canonical paths mix both forms (routers end in a slash, ``capacity/ledger`` does not), and clients try
either. A path under ``/api/`` that resolves only in its other form is served under that form in place, with no
redirect (a redirect would drop a POST's body and CommonMiddleware's APPEND_SLASH refuses to make one for a POST);
a path that resolves in neither form gets a JSON 404 instead of Django's HTML page (``api_not_found``).
"""

from django.http import JsonResponse
from django.urls import Resolver404, get_resolver

API_PREFIX = "/api/"


def _resolves(path: str, urlconf) -> bool:
    try:
        get_resolver(urlconf).resolve(path)
    except Resolver404:
        return False
    return True


class ApiPathsMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        path = request.path_info
        if path.startswith(API_PREFIX) and len(path) > len(API_PREFIX):
            urlconf = getattr(request, "urlconf", None)
            if not _resolves(path, urlconf):
                other = path[:-1] if path.endswith("/") else path + "/"
                if _resolves(other, urlconf):
                    request.path_info = other
                    request.path = request.path[: len(request.path) - len(path)] + other
                else:
                    return api_not_found(request)
        return self.get_response(request)


def api_not_found(request) -> JsonResponse:
    """The API's 404 for a path that names no resource, shaped as its other errors are (``detail``)."""
    return JsonResponse({"detail": f"No API resource at {request.path}; the index is at /api/v1/."}, status=404)
