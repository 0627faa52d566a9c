"""/api/v1/cost-reports/: stored hourly and daily cost reports, their CSV export, and live figures over any range."""

from dataclasses import asdict, fields
from datetime import UTC, datetime, timedelta

from django.http import HttpResponse
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from billing.api.schemas import CostLineSerializer, HardwareBreakdownSerializer
from billing.cost import NOT_STORED, CostLine, cost_csv
from billing.models import CostReport
from billing.selectors import cost_breakdown_for, cost_lines_for, cost_reports_visible_to
from tenants.api.base import ScopedReadOnlyViewSet

MAX_RANGE = timedelta(days=400)


def parse_moment(value: str, name: str) -> datetime:
    """ISO 8601 date or datetime; naive values are UTC."""
    moment = parse_datetime(value)
    if moment is None:
        day = parse_date(value)
        moment = datetime(day.year, day.month, day.day) if day else None
    if moment is None:
        raise ValidationError({name: [f"not an ISO 8601 date or datetime: {value!r}"]})
    return moment if timezone.is_aware(moment) else moment.replace(tzinfo=UTC)


def parse_range(params, *, default: timedelta) -> tuple[datetime, datetime]:
    end = parse_moment(params["end"], "end") if params.get("end") else timezone.now()
    start = parse_moment(params["start"], "start") if params.get("start") else end - default
    if end <= start:
        raise ValidationError({"end": ["must be after start"]})
    if end - start > MAX_RANGE:
        raise ValidationError({"start": [f"ranges are limited to {MAX_RANGE.days} days"]})
    return start, end


class CostReportSerializer(serializers.ModelSerializer):
    endpoint_name = serializers.CharField(source="endpoint.name", read_only=True)
    tenant_slug = serializers.CharField(source="tenant.slug", read_only=True, default=None, allow_null=True)

    class Meta:
        model = CostReport
        fields = [
            "id", "granularity", "start", "end", "endpoint", "endpoint_name", "tenant", "tenant_slug", "gpu_hours",
            "usd", "requests", "input_tokens", "cached_tokens", "output_tokens", "good_output_tokens", "used_mu",
            "capacity_mu", "utilization", "idle_usd", "good_tokens_per_usd", "usd_per_1m_good_tokens",
        ]  # fmt: skip
        read_only_fields = fields


def _as_line(report: CostReport) -> CostLine:
    values = {f.name: getattr(report, f.name) for f in fields(CostLine) if f.name not in NOT_STORED}
    return CostLine(endpoint=report.endpoint.name, tenant=report.tenant.slug if report.tenant_id else None, **values)


class CostReportViewSet(ScopedReadOnlyViewSet):
    """``?granularity=hour|day&start=…&end=…&endpoint=…&tenant=…``; ``export/`` answers the same rows as CSV.

    ``live/`` lines and ``by-hardware/`` carry the split by hardware profile and capacity type, computed from replica
    lifetimes and usage records (the stored rows do not hold it)."""

    model = CostReport
    serializer_class = CostReportSerializer
    filterset_fields = ["granularity", "endpoint", "tenant"]
    ordering_fields = ["start", "usd", "utilization"]

    def visible_queryset(self, principal):
        queryset = cost_reports_visible_to(principal)
        params = self.request.query_params
        if params.get("start"):
            queryset = queryset.filter(start__gte=parse_moment(params["start"], "start"))
        if params.get("end"):
            queryset = queryset.filter(start__lt=parse_moment(params["end"], "end"))
        if params.get("granularity") and params["granularity"] not in CostReport.Granularity.values:
            raise ValidationError({"granularity": ["hour or day"]})
        return queryset

    @action(detail=False, methods=["get"])
    def export(self, request):
        rows = self.filter_queryset(self.get_queryset())[:100_000]
        response = HttpResponse(cost_csv(_as_line(r) for r in rows), content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = 'attachment; filename="infercap-cost-reports.csv"'
        return response

    @extend_schema(responses=CostLineSerializer(many=True), filters=False)
    @action(detail=False, methods=["get"], pagination_class=None)
    def live(self, request):
        """Cost lines computed now over ``?start=&end=`` (default: the last 24 h); ``?format=csv`` for CSV."""
        start, end = parse_range(request.query_params, default=timedelta(days=1))
        lines = cost_lines_for(request.user, start=start, end=end)
        if request.query_params.get("as") == "csv":
            return HttpResponse(cost_csv(lines), content_type="text/csv; charset=utf-8")
        return Response([{**asdict(line), "start": start, "end": end} for line in lines])

    @extend_schema(responses=HardwareBreakdownSerializer, filters=False)
    @action(detail=False, methods=["get"], url_path="by-hardware", pagination_class=None)
    def by_hardware(self, request):
        """Per hardware profile and per capacity type over ``?start=&end=`` (default: the last 24 h): GPU-hours,
        dollars, good requests and tokens, goodput per dollar. Operators: the fleet; tenants: their own lines."""
        start, end = parse_range(request.query_params, default=timedelta(days=1))
        return Response(asdict(cost_breakdown_for(request.user, start=start, end=end)))


def register(router) -> None:
    router.register("cost-reports", CostReportViewSet, basename="cost-report")
