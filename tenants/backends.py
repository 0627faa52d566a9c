"""Session authentication that refuses the people of a suspended tenant: at the login form, and on every request of
a session they already hold (console pages, the REST API, the console's WebSocket all load the user through here).
Operators are never refused for a tenant's flag. docs/security.md, "Suspended tenants"."""

from django.contrib.auth.backends import ModelBackend

from tenants.models import User
from tenants.selectors import user_tenant_active


class ActiveTenantBackend(ModelBackend):
    def user_can_authenticate(self, user) -> bool:
        return super().user_can_authenticate(user) and user_tenant_active(user)

    def get_user(self, user_id):
        # The tenant in the same query: the check runs on every request of a session.
        user = User._default_manager.select_related("tenant").filter(pk=user_id).first()
        return user if user is not None and self.user_can_authenticate(user) else None
