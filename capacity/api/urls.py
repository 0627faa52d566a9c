"""REST API routes of the capacity app."""
from rest_framework.routers import SimpleRouter

router = SimpleRouter()

urlpatterns = router.urls
