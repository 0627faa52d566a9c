"""URL map: console, REST API (/api/v1/), OpenAPI schema and docs, admin, health. The proxy (/v1/) is in asgi."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import JsonResponse
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from capacity.api.metrics import platform_metrics
from tenants.throttling import ThrottledAdminAuthenticationForm, ThrottledAuthenticationForm, login_view_throttled

# Both login pages count failed attempts per username and address (tenants.throttling); a locked-out attempt is 429.
admin.site.login_form = ThrottledAdminAuthenticationForm


def healthz(request):
    return JsonResponse({"status": "ok"})


urlpatterns = [
    # Before admin.site.urls, which would otherwise answer /admin/login/ (reversing "admin:login" is unchanged).
    path("admin/login/", login_view_throttled(admin.site.login)),
    path("admin/", admin.site.urls),
    path(
        "accounts/login/",
        login_view_throttled(auth_views.LoginView.as_view(authentication_form=ThrottledAuthenticationForm)),
        name="login",
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
