"""Who may see what in the console: operators see everything, tenant users only their tenant's objects.

Every view resolves objects through these helpers, so a tenant asking for another tenant's object gets 404
(never 403, which would confirm that the object exists).
"""

from functools import wraps

from django.contrib.auth.decorators import login_required
from django.http import Http404

from endpoints.models import Endpoint
from endpoints.selectors import endpoints_visible_to
from tenants.models import Tenant


def endpoint_for(user, endpoint_id: int) -> Endpoint:
    endpoint = endpoints_visible_to(user).filter(pk=endpoint_id).first()
    if endpoint is None:
        raise Http404("No such endpoint")
    return endpoint


def tenant_ids_seeing(endpoint: Endpoint) -> set[int]:
    """Tenants whose users may see events about this endpoint (the owner and every reservation holder)."""
    ids = set(endpoint.reservations.values_list("tenant_id", flat=True))
    if endpoint.owner_tenant_id:
        ids.add(endpoint.owner_tenant_id)
    return ids


def user_tenant(user) -> Tenant:
    if user.tenant_id is None:
        raise Http404("This page belongs to a tenant")
    return user.tenant


def operator_required(view):
    """Tenant users get 404 on operator pages, like on any object that is not theirs."""

    @login_required
    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if not request.user.is_operator:
            raise Http404("Operators only")
        return view(request, *args, **kwargs)

    return wrapper


def tenant_admin_required(view):
    @login_required
    @wraps(view)
    def wrapper(request, *args, **kwargs):
        user = request.user
        if user.tenant_id is None or not (user.is_tenant_admin or user.is_operator):
            raise Http404("Tenant admins only")
        return view(request, *args, **kwargs)

    return wrapper
