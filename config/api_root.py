"""/api/v1/: an index of every resource, so the browsable API and curious clients can find their way."""

from django.urls import NoReverseMatch
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.reverse import reverse
from rest_framework.views import APIView

from billing.api import urls as billing_urls
from capacity.api import urls as capacity_urls
from endpoints.api import urls as endpoints_urls
from tenants.api import urls as tenants_urls

APPS_URLS = (tenants_urls, endpoints_urls, capacity_urls, billing_urls)


class ApiRootView(APIView):
    """Links to every /api/v1/ resource (the OpenAPI schema at /api/schema/ has the details)."""

    permission_classes = [AllowAny]  # only names and links; every resource checks its own access

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def get(self, request):
        links = {}
        for urls in APPS_URLS:
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
