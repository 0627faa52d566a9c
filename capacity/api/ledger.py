"""GET /api/v1/capacity/ledger: have / sold / used per endpoint and in total (operators), reserved vs used per
tenant (operators see every tenant, anyone else only their own tenant's rows). For operators each endpoint's
``whole_replicas_free`` is how many more whole replicas of its TP size fit in the free GPUs (``total.free_gpus``): a
Kubernetes cluster's GPU nodes as the room task last read them, or this host's as the local actuator allots them; null
where the free GPUs are not known (no GPU, or the cluster's nodes could not be read). ``pools`` gives the same for
the endpoint's other pools, each on its own profile and nodes: a disaggregated endpoint's prefill pool, its spot pool,
the profile a scale-up falls back to (docs/placement.md, "In the ledger")."""

from django.urls import path
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from capacity.autoscaling.actuators.free_gpus import free_gpus
from capacity.ledger import capacity_ledger
from endpoints.selectors import endpoints_visible_to
from tenants.selectors import principal_is_operator, principal_tenant_id


class LedgerView(APIView):
    @extend_schema(
        parameters=[OpenApiParameter("endpoint", int, description="only this endpoint (id)")], responses={200: dict}
    )
    def get(self, request):
        principal = request.user
        endpoints = endpoints_visible_to(principal)
        endpoint_id = request.query_params.get("endpoint")
        if endpoint_id is not None:
            if not endpoint_id.isdigit():
                raise ValidationError({"endpoint": ["must be an endpoint id"]})
            endpoints = endpoints.filter(pk=int(endpoint_id))
        if principal_is_operator(principal):
            ledger = capacity_ledger(endpoints=endpoints, free_gpus=free_gpus())
        else:
            tenant_id = principal_tenant_id(principal)
            if tenant_id is None:
                return Response({"at": None, "endpoints": [], "tenants": [], "total": {}})
            ledger = capacity_ledger(endpoints=endpoints, tenant_id=tenant_id)
        return Response(ledger.as_dict())


urlpatterns = [path("capacity/ledger", LedgerView.as_view(), name="capacity-ledger")]
