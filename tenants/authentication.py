"""REST API authentication with a tenant API key (``Authorization: Bearer ick_…``) holding a read or write scope."""

from rest_framework import authentication, exceptions

from tenants.keys import ApiKeyPrincipal, authenticate_api_key


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header.startswith(f"{self.keyword} "):
            return None
        raw = header[len(self.keyword) + 1 :].strip()
        api_key = authenticate_api_key(raw)
        if api_key is None:
            raise exceptions.AuthenticationFailed("invalid, revoked or expired API key")
        scopes = set(api_key.scopes)
        if not scopes & {"read", "write"}:
            raise exceptions.PermissionDenied("this key has no API scope (read or write)")
        return ApiKeyPrincipal(api_key), api_key

    def authenticate_header(self, request) -> str:
        return self.keyword
