"""REST API routes of the billing app."""
from rest_framework.routers import SimpleRouter

router = SimpleRouter()

urlpatterns = router.urls
