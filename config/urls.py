"""URL map: console, REST API (/api/v1/), OpenAPI schema and docs, admin, health. The proxy (/v1/) is in asgi."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import JsonResponse
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from capacity.api.metrics import platform_metrics
from config.throttling import ThrottledAdminAuthenticationForm, ThrottledAuthenticationForm

# Both login pages count failed attempts per username and address (config.throttling).
admin.site.login_form = ThrottledAdminAuthenticationForm


def healthz(request):
    return JsonResponse({"status": "ok"})


urlpatterns = [
    path("admin/", admin.site.urls),
    path(
        "accounts/login/", auth_views.LoginView.as_view(authentication_form=ThrottledAuthenticationForm), name="login"
    ),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/v1/", include("config.api_urls")),
    path("healthz", healthz, name="healthz"),
    # The books as Prometheus gauges (have/sold/used MU, autoscaler, cost); /metrics itself is the proxy's.
    path("metrics/platform", platform_metrics, name="platform-metrics"),
    path("console/", include("console.urls")),
    path("", RedirectView.as_view(url="/console/", permanent=False)),
]
