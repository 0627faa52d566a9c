"""REST API routes of the capacity app: every module in this package with a ``register(router)`` adds its views."""

from rest_framework.routers import SimpleRouter

from config.discovery import import_submodules

router = SimpleRouter()
extra_urlpatterns: list = []
for module in import_submodules(__package__):
    if hasattr(module, "register"):
        module.register(router)
    extra_urlpatterns += getattr(module, "urlpatterns", [])

urlpatterns = extra_urlpatterns + router.urls
