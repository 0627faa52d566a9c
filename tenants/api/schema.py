"""OpenAPI description of API key and operator token authentication (drf-spectacular finds extensions by subclassing)."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "tenants.authentication.ApiKeyAuthentication"
    name = "apiKey"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A tenant API key (ick_…) with the read or write scope.",
        }


class OperatorTokenAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "tenants.authentication.OperatorTokenAuthentication"
    name = "operatorToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An operator token (ico_…): acts as its operator within its scopes (read, write, tokens); "
            "minted at /api/v1/operator-tokens/ or by `manage.py create_operator_token`.",
        }
