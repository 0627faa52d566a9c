"""REST API v1: each app contributes its routes from its own ``api/urls.py``."""

from django.urls import include, path

urlpatterns = [
    path("", include("tenants.api.urls")),
    path("", include("endpoints.api.urls")),
    path("", include("capacity.api.urls")),
    path("", include("billing.api.urls")),
]
