"""/api/v1/key-spend/: what each visible API key spent in its budget period, beside its budget (docs/security.md,
"Budgets"); ``?api_key=<id>`` for one. A tenant sees its own keys only, as /api/v1/api-keys/ shows them."""

from django.urls import path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.generics import GenericAPIView
from rest_framework.response import Response

from billing.spend import key_spend
from tenants.selectors import api_keys_visible_to


class KeySpendSerializer(serializers.Serializer):
    api_key = serializers.IntegerField()
    prefix = serializers.CharField()
    name = serializers.CharField()
    tenant = serializers.IntegerField()
    period = serializers.ChoiceField(choices=["day", "month"])
    period_start = serializers.DateTimeField()
    spend_usd = serializers.FloatField()
    budget_usd = serializers.FloatField(allow_null=True)
    budget_left_usd = serializers.FloatField(allow_null=True)


class KeySpendView(GenericAPIView):
    serializer_class = KeySpendSerializer

    def get_queryset(self):
        return api_keys_visible_to(self.request.user).order_by("pk")

    @extend_schema(
        parameters=[OpenApiParameter("api_key", OpenApiTypes.INT, description="one key's id")],
        responses=KeySpendSerializer(many=True),
    )
    def get(self, request):
        keys = self.get_queryset()
        wanted = request.query_params.get("api_key")
        if wanted is not None:
            if not wanted.isdigit():
                raise ValidationError({"api_key": ["a key id"]})
            keys = keys.filter(pk=int(wanted))
        page = self.paginate_queryset(keys)
        rows = [spent.as_dict() for spent in key_spend(page if page is not None else keys)]
        return self.get_paginated_response(rows) if page is not None else Response(rows)


urlpatterns = [path("key-spend/", KeySpendView.as_view(), name="key-spend")]
