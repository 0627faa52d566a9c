"""/api/v1/api-keys/: create (the full key is in that one response only), list by prefix, revoke."""

import math

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response

from tenants.api.base import (
    ScopedCreateReadUpdateViewSet,
    ScopedPrimaryKeyRelatedField,
    default_tenant,
    principal_from,
)
from tenants.keys import CONTROL_LIMITS, control_excess, key_grant_excess
from tenants.models import ApiKey, ApiKeyScope, BudgetPeriod, PriorityClass, Tenant
from tenants.operator_tokens import token_of
from tenants.selectors import api_keys_visible_to, principal_is_api_key, tenants_visible_to
from tenants.services import api_key_create, api_key_revoke, api_key_update

# A model name as endpoints and adapters take them (endpoints.models.model_name_validator, one layer up).
MODEL_NAME = r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,99}$"


class ApiKeySerializer(serializers.ModelSerializer):
    tenant = ScopedPrimaryKeyRelatedField(scope=tenants_visible_to, queryset=Tenant.objects.all(), required=False)
    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=ApiKeyScope.choices), allow_empty=False, required=False
    )
    is_usable = serializers.SerializerMethodField()
    allowed_models = serializers.ListField(
        child=serializers.RegexField(MODEL_NAME, max_length=100),
        max_length=100,
        required=False,
        help_text="model names (endpoints or adapters) this key may call; empty: every one its tenant may",
    )

    class Meta:
        model = ApiKey
        fields = [
            "id", "tenant", "name", "prefix", "scopes", "max_priority", "expires_at", "revoked_at", "is_usable",
            "rpm_limit", "tpm_limit", "mu_per_min_limit", "allowed_models", "budget_usd", "budget_period",
            "created_at", "last_used_at",
        ]  # fmt: skip
        read_only_fields = ["id", "prefix", "revoked_at", "created_at", "last_used_at"]

    def validate_allowed_models(self, value: list[str]) -> list[str]:
        return sorted(set(value))

    def validate_mu_per_min_limit(self, value):
        if value is not None and not math.isfinite(value):
            raise serializers.ValidationError("must be a finite number")
        return value

    def validate_budget_usd(self, value):
        if value is not None and not math.isfinite(value):
            raise serializers.ValidationError("must be a finite number")
        return value

    def get_is_usable(self, obj: ApiKey) -> bool:
        return obj.is_usable()

    def validate_scopes(self, value: list[str]) -> list[str]:
        return sorted(set(value))

    def validate_expires_at(self, value):
        if value is not None and value <= timezone.now():
            raise serializers.ValidationError("must be in the future")
        return value

    def validate(self, attrs):
        if self.instance is not None and "tenant" in attrs and attrs["tenant"] != self.instance.tenant:
            raise serializers.ValidationError({"tenant": ["a key cannot move to another tenant"]})
        principal = principal_from(self)
        if principal_is_api_key(principal):
            attrs = self._within_holder(principal.api_key, attrs)
        if (token := token_of(principal)) is not None:
            # An operator token outlives itself through no key it mints (docs/security.md, "Operator tokens").
            if self.instance is None:
                attrs.setdefault("expires_at", token.expires_at)
            expires_at = attrs.get("expires_at", self.instance.expires_at if self.instance else None)
            if expires_at is None or expires_at > token.expires_at:
                raise serializers.ValidationError(
                    {"expires_at": [f"your token expires at {token.expires_at.isoformat()}; this key no later"]}
                )
        return default_tenant(self, attrs)

    def _within_holder(self, holder: ApiKey, attrs: dict) -> dict:
        """A key hands out no more than it holds, so a leaked key cannot mint a stronger one or outlive itself."""
        if self.instance is None:
            # Unsaid limits default to the holder's own, never to the model defaults above them.
            if PriorityClass.rank(holder.max_priority) > PriorityClass.rank(PriorityClass.STANDARD):
                attrs.setdefault("max_priority", holder.max_priority)
            if holder.expires_at is not None:
                attrs.setdefault("expires_at", holder.expires_at)
        current = self.instance
        if self.instance is None:
            # A key minted by a key starts with its holder's controls unless it asks for tighter ones.
            for field in (*CONTROL_LIMITS, "allowed_models", "budget_usd", "budget_period"):
                if getattr(holder, field) not in (None, []):
                    attrs.setdefault(field, getattr(holder, field))
        excess = key_grant_excess(
            holder=holder,
            scopes=attrs.get("scopes", current.scopes if current else [ApiKeyScope.INFERENCE]),
            max_priority=attrs.get("max_priority", current.max_priority if current else PriorityClass.STANDARD),
            expires_at=attrs.get("expires_at", current.expires_at if current else None),
        )
        excess |= control_excess(holder=holder, controls=_controls(attrs, current))
        if excess:
            raise serializers.ValidationError({field: [message] for field, message in excess.items()})
        return attrs


def _controls(attrs: dict, current: ApiKey | None) -> dict:
    """The controls a key would have after this write: the new values, else its current ones."""
    fields = (*CONTROL_LIMITS, "allowed_models", "budget_usd", "budget_period")
    return {f: attrs.get(f, getattr(current, f) if current is not None else None) for f in fields} | {
        "budget_period": attrs.get("budget_period", current.budget_period if current else BudgetPeriod.MONTH)
    }


class ApiKeyCreatedSerializer(ApiKeySerializer):
    key = serializers.CharField(read_only=True, help_text="the full secret; shown in this response only")

    class Meta(ApiKeySerializer.Meta):
        fields = [*ApiKeySerializer.Meta.fields, "key"]


class ApiKeyViewSet(ScopedCreateReadUpdateViewSet):
    model = ApiKey
    serializer_class = ApiKeySerializer
    filterset_fields = ["tenant", "max_priority"]
    ordering_fields = ["created_at", "name", "last_used_at"]

    def visible_queryset(self, principal):
        return api_keys_visible_to(principal)

    @extend_schema(request=ApiKeySerializer, responses={201: ApiKeyCreatedSerializer})
    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        key, raw = api_key_create(actor=request.user, **serializer.validated_data)
        body = ApiKeyCreatedSerializer(key, context=self.get_serializer_context()).data
        body["key"] = raw
        return Response(body, status=201, headers={"Cache-Control": "no-store"})

    def may_change(self, principal, obj) -> bool:
        holder = principal.api_key if principal_is_api_key(principal) else None
        if holder is not None and (
            key_grant_excess(
                holder=holder, scopes=obj.scopes, max_priority=obj.max_priority, expires_at=obj.expires_at
            )
            or control_excess(holder=holder, controls=_controls({}, obj))
        ):
            # Else a weak key could lift a stronger key's expiry, or revoke the keys production runs on.
            raise PermissionDenied("your key cannot change or revoke a key that holds more than it does")
        return True

    def update_object(self, instance, data):
        data.pop("tenant", None)
        return api_key_update(api_key=instance, actor=self.request.user, **data)

    @extend_schema(request=None, responses={200: ApiKeySerializer})
    @action(detail=True, methods=["post"])
    def revoke(self, request, pk=None):
        """Revoke the key at once; it can never be used again (revoking twice is harmless)."""
        key = api_key_revoke(api_key=self.get_object(), actor=request.user)
        return Response(self.get_serializer(key).data)


def register(router) -> None:
    router.register("api-keys", ApiKeyViewSet, basename="api-key")
