"""REST API authentication with a tenant API key (``Authorization: Bearer ick_…``) holding a read or write scope.
A bad key counts as a failed authentication of the client's address; past the limit the address is refused with 429
before any key is looked up (config.throttling)."""

from rest_framework import authentication, exceptions

from config.throttling import auth_failed, auth_failures_blocked_for_s, auth_throttled, client_address
from tenants.keys import ApiKeyPrincipal, authenticate_api_key


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header.startswith(f"{self.keyword} "):
            return None
        raw = header[len(self.keyword) + 1 :].strip()
        address = client_address(request)
        wait_s = auth_failures_blocked_for_s(address=address)
        if wait_s:
            # A right key too: answering it would let a guesser learn which guess was right.
            raise auth_throttled(wait_s)
        api_key = authenticate_api_key(raw)
        if api_key is None:
            auth_failed(address=address)
            raise exceptions.AuthenticationFailed("invalid, revoked or expired API key")
        scopes = set(api_key.scopes)
        if not scopes & {"read", "write"}:
            raise exceptions.PermissionDenied("this key has no API scope (read or write)")
        return ApiKeyPrincipal(api_key), api_key

    def authenticate_header(self, request) -> str:
        return self.keyword
