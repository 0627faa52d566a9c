"""/api/v1/statements/?start=…&end=…[&tenant=ID]: a tenant's reserved MU, used MU and overage for a period."""

from datetime import timedelta

from django.http import Http404
from django.urls import path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.api.costs import parse_range
from billing.api.schemas import StatementSerializer
from billing.statements import statement_for
from tenants.selectors import principal_is_operator, principal_tenant_id, tenants_visible_to


class StatementView(APIView):
    """Tenants get their own statement; operators name the tenant. Defaults to the last 30 days."""

    serializer_class = StatementSerializer

    @extend_schema(
        parameters=[
            OpenApiParameter("start", OpenApiTypes.DATETIME, description="ISO date or datetime; default 30 days ago"),
            OpenApiParameter("end", OpenApiTypes.DATETIME, description="ISO date or datetime; default now"),
            OpenApiParameter("tenant", OpenApiTypes.INT, description="required for operators"),
        ],
        responses=StatementSerializer,
    )
    def get(self, request):
        start, end = parse_range(request.query_params, default=timedelta(days=30))
        tenant_id = request.query_params.get("tenant")
        if principal_is_operator(request.user):
            if not tenant_id:
                raise ValidationError({"tenant": ["operators must say which tenant"]})
        else:
            tenant_id = tenant_id or principal_tenant_id(request.user)
        if not str(tenant_id).isdigit():
            raise ValidationError({"tenant": ["a tenant id"]})
        tenant = tenants_visible_to(request.user).filter(pk=int(tenant_id)).first()
        if tenant is None:
            raise Http404
        return Response(statement_for(tenant=tenant, start=start, end=end).as_dict())


urlpatterns = [path("statements/", StatementView.as_view(), name="statement")]
