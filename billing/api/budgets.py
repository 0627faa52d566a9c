"""/api/v1/slo-budgets/: each visible SLO's error budget left, burn rate per window, projected exhaustion, alerts."""

from django.http import Http404
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import viewsets
from rest_framework.response import Response

from billing.api.schemas import SLOBudgetSerializer
from billing.selectors import slo_budgets


@extend_schema_view(
    list=extend_schema(responses=SLOBudgetSerializer(many=True)),
    retrieve=extend_schema(responses=SLOBudgetSerializer),
)
class SLOBudgetViewSet(viewsets.ViewSet):
    """Read-only; figures come from the last burn-rate evaluation (every minute)."""

    lookup_value_regex = r"\d+"
    serializer_class = SLOBudgetSerializer

    def list(self, request):
        return Response([b.as_dict() for b in slo_budgets(request.user)])

    def retrieve(self, request, pk=None):
        budgets = slo_budgets(request.user, slo_ids=[int(pk)])
        if not budgets:
            raise Http404
        return Response(budgets[0].as_dict())


def register(router) -> None:
    router.register("slo-budgets", SLOBudgetViewSet, basename="slo-budget")
