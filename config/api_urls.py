"""REST API v1: an index of every resource, then each app's routes from its own ``api/urls.py``."""

from django.urls import include, path

from config.api_root import ApiRootView

urlpatterns = [
    path("", ApiRootView.as_view(), name="api-root"),
    path("", include("tenants.api.urls")),
    path("", include("endpoints.api.urls")),
    path("", include("capacity.api.urls")),
    path("", include("billing.api.urls")),
]
