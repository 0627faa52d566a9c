"""REST API authentication with a tenant API key (``Authorization: Bearer ick_…``) holding a read or write scope, or
with an operator token (``Bearer ico_…``).
A bad key counts as a failed authentication of the client's address; past the limit the address is refused with 429
before any key is looked up (tenants.throttling)."""

from rest_framework import authentication, exceptions

from tenants.keys import ApiKeyPrincipal, authenticate_api_key
from tenants.operator_tokens import (
    SAFE_METHODS,
    authenticate_operator_token,
    looks_like_operator_token,
    scope_held,
    scope_needed,
)
from tenants.services import operator_token_used
from tenants.throttling import auth_failed, auth_failures_blocked_for_s, auth_throttled, client_address


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


class OperatorTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer ico_…``: an operator token (docs/security.md, "Operator tokens"). The request acts as
    the token's owner, an active operator, within the token's scopes; every write is audited as the owner. Any other
    bearer credential is left to the API key authenticator after it."""

    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header.startswith(f"{self.keyword} "):
            return None
        raw = header[len(self.keyword) + 1 :].strip()
        if not looks_like_operator_token(raw):
            return None
        address = client_address(request)
        wait_s = auth_failures_blocked_for_s(address=address)
        if wait_s:
            raise auth_throttled(wait_s)
        token = authenticate_operator_token(raw)
        if token is None:
            auth_failed(address=address)
            raise exceptions.AuthenticationFailed("invalid, revoked or expired operator token")
        view = (getattr(request, "parser_context", None) or {}).get("view")
        needed = scope_needed(method=request.method, view=view)
        if not scope_held(token, needed):
            raise exceptions.PermissionDenied(f"this operator token lacks the `{needed}` scope")
        user = token.user
        user.operator_token = token  # read by the audit trail and by the views that refuse credentials
        operator_token_used(
            token=token, method=request.method, path=request.path, write=request.method not in SAFE_METHODS
        )
        return user, token

    def authenticate_header(self, request) -> str:
        return self.keyword
