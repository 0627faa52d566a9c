"""Django REST framework and drf-spectacular."""

from .env import env, env_int

REST_FRAMEWORK = {
    # The bearer authenticators go first: DRF takes the first class's WWW-Authenticate header, so a bad key is a 401.
    # Operator tokens (ico_) before tenant keys (ick_), which refuse any other bearer credential.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tenants.authentication.OperatorTokenAuthentication",
        "tenants.authentication.ApiKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": [
        "config.filters.ScopedFilterBackend",  # foreign keys by plain id: no probing other tenants' ids
        "rest_framework.filters.OrderingFilter",
    ],
    # Per person or key, and per address for anonymous calls; counted in the cache (Redis in production).
    "DEFAULT_THROTTLE_CLASSES": [
        "tenants.throttling.PrincipalRateThrottle",
        "tenants.throttling.AnonymousRateThrottle",
    ],
    "DEFAULT_THROTTLE_RATES": {
        "principal": env("INFERCAP_API_RATE", "1200/min"),
        "anon": env("INFERCAP_API_ANON_RATE", "60/min"),
    },
    # Trusted proxies in front of the web server that append to X-Forwarded-For (an ingress: 1). 0 trusts no header:
    # client addresses are REMOTE_ADDR. Every per-address limit reads it (config/client_address.py; docs/security.md).
    "NUM_PROXIES": env_int("INFERCAP_NUM_PROXIES", 0),
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "config.api.exception_handler",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "infercap API",
    "DESCRIPTION": "Provision endpoints, sell capacity in model units, and read usage, SLOs and cost.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Tags from the path segment after /api/v1/ (endpoints, replicas, capacity, usage, …): one group per resource in
    # the docs, not every path under one "v1" tag.
    "SCHEMA_PATH_PREFIX": r"/api/v[0-9]+",
    # Swagger UI from the installed sidecar package, not a CDN: the docs work offline.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "ENUM_NAME_OVERRIDES": {
        "PriorityClassEnum": "tenants.models.PriorityClass",
        "OperatorTokenScopeEnum": "tenants.models.OperatorTokenScope",
        "ScopesEnum": "tenants.models.ApiKeyScope",  # its name before operator tokens had scopes too
        "ReplicaStateEnum": "endpoints.models.ReplicaState",
        "ReplicaRoleEnum": "endpoints.models.ReplicaRole",  # a replica's pool (not a user's role)
        "UserRoleEnum": "tenants.models.Role",
        "RolloutStateEnum": "endpoints.models.RolloutState",
    },
}
