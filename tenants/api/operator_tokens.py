"""/api/v1/operator-tokens/: operators mint (the full token is in that one response only), list by prefix and revoke
their REST API tokens. Operators only, by session or by a token holding the ``tokens`` scope; a tenant's people and
keys list nothing and get 403 on a mint (docs/security.md, "Operator tokens")."""

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, permissions, serializers, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response

from tenants.models import OperatorToken, OperatorTokenScope
from tenants.operator_tokens import DEFAULT_LIFETIME, lifetime_error, token_grant_excess, token_of
from tenants.selectors import principal_is_operator
from tenants.services import operator_token_create, operator_token_revoke


class OperatorsOnly(permissions.BasePermission):
    """Anyone signed in may list (a tenant's people and keys see an empty list, as with every scoped resource);
    only operators mint and revoke."""

    message = "operator tokens are for operators only"

    def has_permission(self, request, view) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False
        return request.method in permissions.SAFE_METHODS or principal_is_operator(request.user)


class OperatorTokenSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="user.username", read_only=True, help_text="the operator the token acts as")
    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=OperatorTokenScope.choices),
        allow_empty=False,
        help_text="read: GET the API; write: change through it (reads too); tokens: list, mint and revoke tokens",
    )
    expires_at = serializers.DateTimeField(
        required=False, help_text=f"empty: {DEFAULT_LIFETIME.days} days from now; at most a year ahead"
    )
    is_usable = serializers.SerializerMethodField()

    class Meta:
        model = OperatorToken
        fields = [
            "id", "name", "owner", "prefix", "scopes", "expires_at", "revoked_at", "is_usable", "created_at",
            "last_used_at",
        ]  # fmt: skip
        read_only_fields = ["id", "prefix", "revoked_at", "created_at", "last_used_at"]

    def get_is_usable(self, obj: OperatorToken) -> bool:
        return obj.is_usable()

    def validate_scopes(self, value: list[str]) -> list[str]:
        return sorted(set(value))

    def validate_expires_at(self, value):
        if error := lifetime_error(value):
            raise serializers.ValidationError(error)
        return value

    def validate(self, attrs):
        holder = token_of(self.context["request"].user)
        if holder is not None:
            # A token mints only within its own grant; an unsaid expiry is its own when that comes sooner.
            if "expires_at" not in attrs:
                attrs["expires_at"] = holder.expires_at
            excess = token_grant_excess(holder=holder, scopes=attrs["scopes"], expires_at=attrs["expires_at"])
            if excess:
                raise serializers.ValidationError({field: [message] for field, message in excess.items()})
        return attrs


class OperatorTokenCreatedSerializer(OperatorTokenSerializer):
    token = serializers.CharField(read_only=True, help_text="the full secret; shown in this response only")

    class Meta(OperatorTokenSerializer.Meta):
        fields = [*OperatorTokenSerializer.Meta.fields, "token"]


class OperatorTokenViewSet(
    mixins.CreateModelMixin, mixins.RetrieveModelMixin, mixins.ListModelMixin, viewsets.GenericViewSet
):
    """Tokens act as the operator who minted them (the caller; a service account mints its own, or is given its
    first by ``manage.py create_operator_token``). Never changed: revoke one and mint another."""

    permission_classes = [OperatorsOnly]
    operator_token_scope = OperatorTokenScope.TOKENS  # tenants.operator_tokens.scope_needed
    serializer_class = OperatorTokenSerializer
    queryset = OperatorToken.objects.none()
    filterset_fields = ["name"]
    ordering_fields = ["created_at", "name", "last_used_at", "expires_at"]

    def get_queryset(self):
        if not principal_is_operator(self.request.user):
            return OperatorToken.objects.none()
        return OperatorToken.objects.select_related("user")

    @extend_schema(request=OperatorTokenSerializer, responses={201: OperatorTokenCreatedSerializer})
    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        owner = request.user  # the person, or the owner of the token that asks
        token, raw = operator_token_create(user=owner, actor=request.user, **serializer.validated_data)
        body = OperatorTokenCreatedSerializer(token, context=self.get_serializer_context()).data
        body["token"] = raw
        return Response(body, status=201, headers={"Cache-Control": "no-store"})

    @extend_schema(request=None, responses={200: OperatorTokenSerializer})
    @action(detail=True, methods=["post"])
    def revoke(self, request, pk=None):
        """Revoke the token at once: its next request is a 401 (revoking twice is harmless)."""
        token = self.get_object()
        holder = token_of(request.user)
        if holder is not None and token_grant_excess(holder=holder, scopes=token.scopes, expires_at=token.expires_at):
            # Else a weak token could revoke the ones automation runs on.
            raise PermissionDenied("your token cannot revoke a token that holds more than it does")
        return Response(self.get_serializer(operator_token_revoke(token=token, actor=request.user)).data)


def register(router) -> None:
    router.register("operator-tokens", OperatorTokenViewSet, basename="operator-token")
