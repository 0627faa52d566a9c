"""Shared REST API building blocks: tenant-scoped querysets, role-based write permission, service-backed writes.

Rules, in one place: operators see and change everything; a tenant's admins (and API keys with the write
scope) change their tenant's objects; members (and read-scoped keys) only read. Querysets come from the
apps' selectors, so another tenant's object is simply not found (404), never forbidden (403).
"""

from django.core.exceptions import ObjectDoesNotExist
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import ProtectedError, QuerySet, RestrictedError
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from rest_framework import mixins, permissions, serializers, status, viewsets
from rest_framework.exceptions import APIException, ValidationError

from tenants.selectors import principal_can_write, principal_is_operator, principal_tenant_id


class Conflict(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "the object is still in use"
    default_code = "conflict"


class WRITE:
    """Who may write a resource: operators only, or also the tenant's admins."""

    OPERATORS = "operators"
    TENANT_ADMINS = "tenant_admins"


class ScopedPermission(permissions.BasePermission):
    """Reads: any authenticated principal (the queryset scopes them). Writes: as the view's ``write_access`` says.

    On detail routes the decision waits for the object, so that a foreign object is a 404 before anything else:
    a custom ``detail=True`` action must therefore load its object with ``self.get_object()``.
    """

    message = "your role may only read this resource"

    def has_permission(self, request, view) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False
        if request.method in permissions.SAFE_METHODS:
            return True
        if view.lookup_url_kwarg in view.kwargs or view.lookup_field in view.kwargs:
            return True
        return view.may_write(request.user)

    def has_object_permission(self, request, view, obj) -> bool:
        if request.method in permissions.SAFE_METHODS:
            return True
        return view.may_write(request.user) and view.may_change(request.user, obj)


class ScopedViewSetMixin:
    """Tenant scoping and service-backed writes for a ModelViewSet.

    Subclasses set ``model``, ``write_access`` and implement ``visible_queryset(principal)``; writes go through
    ``create_object`` / ``update_object`` / ``delete_object``, which call the app's services.
    """

    permission_classes = [ScopedPermission]
    write_access = WRITE.TENANT_ADMINS
    model = None

    def visible_queryset(self, principal) -> QuerySet:
        raise NotImplementedError

    def get_queryset(self) -> QuerySet:
        if getattr(self, "swagger_fake_view", False):  # schema generation: no principal
            model = self.model or self.get_serializer_class().Meta.model
            return model.objects.none()
        return self.visible_queryset(self.request.user)

    def may_write(self, principal) -> bool:
        if self.write_access == WRITE.OPERATORS:
            return principal_is_operator(principal)
        return principal_can_write(principal)

    def may_change(self, principal, obj) -> bool:
        """Object-level write check on a visible object (e.g. a shared endpoint a tenant only reserves on)."""
        return True

    # Writes go through services so validation and audit entries are the same for the API, console and admin.
    def create_object(self, data: dict):
        raise NotImplementedError

    def update_object(self, instance, data: dict):
        raise NotImplementedError

    def delete_object(self, instance) -> None:
        raise NotImplementedError

    def perform_create(self, serializer) -> None:
        serializer.instance = self.create_object(dict(serializer.validated_data))

    def perform_update(self, serializer) -> None:
        serializer.instance = self.update_object(serializer.instance, dict(serializer.validated_data))

    def perform_destroy(self, instance) -> None:
        try:
            self.delete_object(instance)
        except (ProtectedError, RestrictedError) as exc:
            found = exc.protected_objects if isinstance(exc, ProtectedError) else exc.restricted_objects
            users = sorted({str(obj) for obj in found})[:5]
            raise Conflict(f"still used by: {', '.join(users)}") from exc


class ScopedModelViewSet(ScopedViewSetMixin, viewsets.ModelViewSet):
    http_method_names = ["get", "post", "put", "patch", "delete", "head", "options"]


class ScopedReadOnlyViewSet(ScopedViewSetMixin, viewsets.ReadOnlyModelViewSet):
    pass


class ScopedCreateReadUpdateViewSet(
    ScopedViewSetMixin,
    mixins.CreateModelMixin,
    mixins.RetrieveModelMixin,
    mixins.UpdateModelMixin,
    mixins.ListModelMixin,
    viewsets.GenericViewSet,
):
    """For resources that are never deleted over the API (API keys are revoked instead)."""


class ScopedPrimaryKeyRelatedField(serializers.PrimaryKeyRelatedField):
    """A foreign key the principal may only point at objects it can see; anything else is "does not exist"."""

    def __init__(self, *, scope, **kwargs):
        self.scope = scope
        super().__init__(**kwargs)

    def get_queryset(self) -> QuerySet:
        request = self.context.get("request")
        if request is None:
            return self.queryset.none()
        return self.scope(request.user)


class IdOrNameRelatedField(ScopedPrimaryKeyRelatedField):
    """A foreign key given by id or by name (``"model_profile": "llama-3-8b"``): a number or a string of digits is an
    id, any other string a name (a profile or endpoint named only with digits is given by id). Scoped like its
    parent: a name the principal may not see is "does not exist", exactly like a missing one. Answers carry ids."""

    default_error_messages = {"does_not_exist_name": 'No object named "{name}".'}

    def __init__(self, *, scope=None, name_field: str = "name", **kwargs):
        self.name_field = name_field
        super().__init__(scope=scope, **kwargs)

    def get_queryset(self) -> QuerySet:
        if self.scope is None:
            return self.queryset.all()
        return super().get_queryset()

    def to_internal_value(self, data):
        if isinstance(data, str) and data and not data.strip().isdigit():
            if "\x00" in data or len(data) > 200:  # no name holds these; PostgreSQL refuses a NUL in a query
                self.fail("does_not_exist_name", name=data[:100].replace("\x00", ""))
            try:
                return self.get_queryset().get(**{self.name_field: data})
            except ObjectDoesNotExist:
                self.fail("does_not_exist_name", name=data[:100])
        return super().to_internal_value(data)


class IdOrNameFieldSchema(OpenApiSerializerFieldExtension):
    """OpenAPI: an id or a name in requests, an id in answers."""

    target_class = IdOrNameRelatedField

    def map_serializer_field(self, auto_schema, direction):
        id_schema = {"type": "integer"}
        if direction == "response":
            return id_schema
        return {"oneOf": [id_schema, {"type": "string", "description": "the object's name"}]}


def principal_from(serializer: serializers.Serializer):
    return serializer.context["request"].user


def default_tenant(serializer: serializers.Serializer, attrs: dict, field: str = "tenant") -> dict:
    """Tenant users act for their own tenant; operators must say which tenant (on create)."""
    # Only an absent field is filled in: an explicit null is the caller's choice, for the resource to judge.
    if serializer.instance is not None or field in attrs:
        return attrs
    tenant_id = principal_tenant_id(principal_from(serializer))
    if tenant_id is None:
        raise ValidationError({field: ["This field is required."]})
    attrs[field] = serializer.fields[field].get_queryset().get(pk=tenant_id)
    return attrs


def as_drf_validation_error(exc: DjangoValidationError) -> ValidationError:
    detail = exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
    return ValidationError(detail=detail)
