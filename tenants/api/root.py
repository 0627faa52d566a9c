"""/api/v1/: an index of every resource, so the browsable API and curious clients can find their way."""

import importlib

from django.urls import NoReverseMatch, path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.reverse import reverse
from rest_framework.views import APIView

APPS = ("tenants", "endpoints", "capacity", "billing")


class ApiRootView(APIView):
    """Links to every /api/v1/ resource (the OpenAPI schema at /api/schema/ has the details)."""

    permission_classes = [AllowAny]  # only names and links; every resource checks its own access

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def get(self, request):
        links = {}
        for app in APPS:
            urls = importlib.import_module(f"{app}.api.urls")
            for prefix, _, basename in urls.router.registry:
                links[prefix] = reverse(f"{basename}-list", request=request)
            for pattern in urls.extra_urlpatterns:
                if pattern.name and not pattern.pattern.converters:
                    try:
                        links[str(pattern.pattern).strip("/")] = reverse(pattern.name, request=request)
                    except NoReverseMatch:
                        continue
        links["schema"] = reverse("schema", request=request)
        links["docs"] = reverse("api-docs", request=request)
        return Response(dict(sorted(links.items())))


urlpatterns = [path("", ApiRootView.as_view(), name="api-root")]
