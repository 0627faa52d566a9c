"""Response shapes of the computed (non-model) billing views, for the OpenAPI schema and its clients."""

from rest_framework import serializers

from capacity.models import HardwareProfile


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


class StatementPartSerializer(serializers.Serializer):
    """The part of a statement line served by one hardware profile (billing/statements.py)."""

    profile_id = serializers.IntegerField()
    profile = serializers.CharField(help_text="hardware profile name")
    capacity_type = serializers.ChoiceField(choices=HardwareProfile.CapacityType.choices)
    share = serializers.FloatField(help_text="fraction of the line's cost: the tenant's MU on this profile / its MU")
    used_mu = serializers.FloatField()
    requests = serializers.IntegerField()
    good_output_tokens = serializers.IntegerField()
    reserved_usd = serializers.FloatField(help_text="micro-dollars; the parts sum to the line's reserved_usd")
    overage_usd = serializers.FloatField(help_text="total_usd − reserved_usd of this part")
    total_usd = serializers.FloatField(help_text="micro-dollars; the parts sum to the line's total_usd exactly")


class StatementHardwareSerializer(serializers.Serializer):
    profile_id = serializers.IntegerField()
    profile = serializers.CharField()
    capacity_type = serializers.ChoiceField(choices=HardwareProfile.CapacityType.choices)
    used_mu = serializers.FloatField()
    requests = serializers.IntegerField()
    good_output_tokens = serializers.IntegerField()
    total_usd = serializers.FloatField()


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
    by_hardware = StatementPartSerializer(many=True, help_text="the line's cost by the hardware that served it")


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
    by_hardware = StatementHardwareSerializer(many=True, help_text="the lines' parts summed per hardware profile")
    lines = StatementLineSerializer(many=True)


class CostFiguresSerializer(serializers.Serializer):
    """GPU-hours, dollars and the work served of one part of a cost line (billing/cost_split.py: CostFigures)."""

    gpu_hours = serializers.FloatField(
        help_text="billed replica-hours on this profile × its GPUs per replica; a MIG slice-hour counts its share of "
        "a GPU (a 1g.10gb slice 1/7)"
    )
    usd = serializers.FloatField(
        help_text="billed replica-hours × GPUs per replica × this profile's usd_per_gpu_hour (a MIG profile's price "
        "is per slice-hour)"
    )
    requests = serializers.IntegerField()
    good_requests = serializers.IntegerField(help_text="requests that met every latency SLO")
    output_tokens = serializers.IntegerField()
    good_output_tokens = serializers.IntegerField(help_text="output tokens of good requests")
    used_mu = serializers.FloatField()
    good_tokens_per_usd = serializers.FloatField(allow_null=True, help_text="goodput per dollar")
    usd_per_1m_good_tokens = serializers.FloatField(allow_null=True)


class ProfileCostSerializer(CostFiguresSerializer):
    """One hardware profile's part of a cost line or of the fleet."""

    profile_id = serializers.IntegerField()
    profile = serializers.CharField(help_text="hardware profile name")
    capacity_type = serializers.ChoiceField(choices=HardwareProfile.CapacityType.choices)


class CapacityTypeCostSerializer(CostFiguresSerializer):
    """All profiles of one capacity type together."""

    capacity_type = serializers.ChoiceField(choices=HardwareProfile.CapacityType.choices)


class HardwareBreakdownSerializer(serializers.Serializer):
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    scope = serializers.ChoiceField(choices=["fleet", "tenant"], help_text="operators: the fleet; tenants: their own")
    by_profile = ProfileCostSerializer(many=True)
    by_capacity_type = CapacityTypeCostSerializer(many=True)


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
    by_hardware = ProfileCostSerializer(many=True, help_text="this line per hardware profile; sums to the line")
