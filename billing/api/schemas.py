"""Response shapes of the computed (non-model) billing views, for the OpenAPI schema and its clients."""

from rest_framework import serializers


class SLOBudgetSerializer(serializers.Serializer):
    slo_id = serializers.IntegerField()
    name = serializers.CharField()
    endpoint = serializers.CharField()
    tenant = serializers.CharField(allow_null=True)
    sli = serializers.CharField()
    objective = serializers.FloatField()
    period_days = serializers.IntegerField()
    evaluated_at = serializers.DateTimeField(allow_null=True)
    budget_remaining = serializers.FloatField(allow_null=True, help_text="fraction of the period's budget left")
    burn_rates = serializers.DictField(child=serializers.FloatField(), help_text='window ("5m" … "3d") → burn rate')
    exhausts_at = serializers.DateTimeField(allow_null=True)
    firing = serializers.ListField(child=serializers.CharField())
    health = serializers.ChoiceField(choices=["page", "ticket", "ok", "unknown"])


class StatementLineSerializer(serializers.Serializer):
    endpoint_id = serializers.IntegerField()
    endpoint = serializers.CharField()
    reserved_mu_per_min = serializers.FloatField()
    reserved_mu = serializers.FloatField()
    used_mu = serializers.FloatField()
    overage_mu = serializers.FloatField()
    reserved_usd = serializers.FloatField()
    overage_usd = serializers.FloatField()
    requests = serializers.IntegerField()
    output_tokens = serializers.IntegerField()
    good_output_tokens = serializers.IntegerField()
    total_usd = serializers.FloatField()


class StatementSerializer(serializers.Serializer):
    tenant_id = serializers.IntegerField()
    tenant = serializers.CharField()
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    reserved_usd_per_1k_mu = serializers.FloatField()
    overage_usd_per_1k_mu = serializers.FloatField()
    reserved_mu = serializers.FloatField()
    used_mu = serializers.FloatField()
    overage_mu = serializers.FloatField()
    total_usd = serializers.FloatField()
    lines = StatementLineSerializer(many=True)


class CostLineSerializer(serializers.Serializer):
    endpoint_id = serializers.IntegerField()
    endpoint = serializers.CharField()
    tenant_id = serializers.IntegerField(allow_null=True)
    tenant = serializers.CharField(allow_null=True)
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    gpu_hours = serializers.FloatField()
    usd = serializers.FloatField()
    requests = serializers.IntegerField()
    input_tokens = serializers.IntegerField()
    cached_tokens = serializers.IntegerField()
    output_tokens = serializers.IntegerField()
    good_output_tokens = serializers.IntegerField()
    used_mu = serializers.FloatField()
    capacity_mu = serializers.FloatField()
    utilization = serializers.FloatField(allow_null=True)
    idle_usd = serializers.FloatField()
    good_tokens_per_usd = serializers.FloatField(allow_null=True)
    usd_per_1m_good_tokens = serializers.FloatField(allow_null=True)
