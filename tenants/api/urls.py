"""REST API routes of the tenants app."""
from rest_framework.routers import SimpleRouter

router = SimpleRouter()

urlpatterns = router.urls
