"""Settings shared by every environment; integrations live in their own small modules below."""

import warnings
from pathlib import Path

from .backends import resolve_backends
from .env import env, env_bool, env_int

BASE_DIR = Path(__file__).resolve().parent.parent.parent
VAR_DIR = Path(env("INFERCAP_VAR_DIR", str(BASE_DIR / "var")))

SECRET_KEY = env("DJANGO_SECRET_KEY", "")
DEBUG = env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = [h for h in env("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver").split(",") if h]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "tenants",
    "endpoints",
    "gateway",
    "capacity",
    "billing",
    "workers",
    "console",
]

MIDDLEWARE = [
    # The kubelet's probes and Prometheus' scrape, whatever their Host and over plain HTTP (config/cluster_paths.py).
    "config.cluster_paths.ClusterPathsMiddleware",
    # X-Request-Id taken or made, on the response and in every log line of the request (config/request_log.py).
    "config.request_log.RequestIdMiddleware",
    # A span per view while tracing is on; a pass-through otherwise (config/tracing.py).
    "config.tracing.TracingMiddleware",
    # /api/ paths answer with or without their trailing slash; one that names nothing is a JSON 404 (config/api_paths.py).
    "config.api_paths.ApiPathsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

AUTH_USER_MODEL = "tenants.User"
# ModelBackend that also refuses the people of a suspended tenant, at login and on every request of their sessions.
AUTHENTICATION_BACKENDS = ["tenants.backends.ActiveTenantBackend"]
ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"] if (BASE_DIR / "static").exists() else []
# The console's CSS and JS, served by WhiteNoise from the web process itself: what collectstatic gathered (the image
# does, with gzip and Brotli copies served by Accept-Encoding) or, where nothing was collected (a laptop), from the
# apps' own directories. Names carry no content hash (no manifest a forgotten collectstatic could break), so the
# files are cached an hour, not forever; a CDN in front may keep them longer.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = not STATIC_ROOT.is_dir()
WHITENOISE_MAX_AGE = 3600
if WHITENOISE_USE_FINDERS:  # nothing collected is the laptop's normal case, not a misconfiguration to warn of
    warnings.filterwarnings("ignore", message="No directory at", module="whitenoise.base")
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/console/"
LOGOUT_REDIRECT_URL = "/accounts/login/"
# Password reset links (POST /api/v1/users/{id}/reset-password/, "forgot password") go out by mail.
EMAIL_BACKEND = env("DJANGO_EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST = env("DJANGO_EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("DJANGO_EMAIL_PORT", 25)
DEFAULT_FROM_EMAIL = env("DJANGO_DEFAULT_FROM_EMAIL", "infercap@localhost")

BACKENDS = resolve_backends(database_url=env("DATABASE_URL", ""), redis_url=env("REDIS_URL", ""), var_dir=VAR_DIR)
DATABASES = {"default": BACKENDS.database}
CACHES = {"default": BACKENDS.cache}
CHANNEL_LAYERS = {"default": BACKENDS.channel_layer}
REDIS_URL = BACKENDS.redis_url

from .celery import celery_settings  # noqa: E402

globals().update(celery_settings(BACKENDS))
from .drf import *  # noqa: E402,F401,F403
from .logging import *  # noqa: E402,F401,F403

# infercap knobs (documented in README "Configuration")
INFERCAP = {
    # How stale a proxy's config snapshot may get before it re-reads the version stamp.
    "SNAPSHOT_POLL_S": float(env("INFERCAP_SNAPSHOT_POLL_S", "0.5")),
    # Sold MU/min may exceed an endpoint's capacity by this ratio before a sale is refused.
    "OVERCOMMIT_LIMIT": float(env("INFERCAP_OVERCOMMIT_LIMIT", "1.5")),
    # Raw usage records older than this are deleted in batches once rolled up.
    "USAGE_RETENTION_DAYS": env_int("INFERCAP_USAGE_RETENTION_DAYS", 30),
    # When Redis cannot be reached the limiter admits ("open") or refuses ("closed").
    "RATE_LIMIT_FAIL_MODE": env("INFERCAP_RATE_LIMIT_FAIL_MODE", "open"),
    "SPOOL_DIR": str(VAR_DIR / "spool"),
    # Real vLLM replicas (capacity.runtimes.vllm): the engine interpreter, run in module form (empty: .venv-engine's
    # from `make engine` when it exists, else the `vllm` console script), and where a model profile's name may
    # name a directory of weights (var/engine/tiny-llama is the tests' tiny model).
    "VLLM_PYTHON": env("INFERCAP_VLLM_PYTHON", ""),
    "VLLM_MODELS_DIR": env("INFERCAP_VLLM_MODELS_DIR", str(VAR_DIR / "engine")),
    # LoRA adapters (docs/lora-serving.md): the operator-approved directory every adapter's artifact lies under (adapters
    # name a path relative to it), and the share of MU an adapter request costs above its base endpoint's.
    "LORA_ROOT": env("INFERCAP_LORA_ROOT", str(VAR_DIR / "lora")),
    "LORA_MU_OVERHEAD": float(env("INFERCAP_LORA_MU_OVERHEAD", "0.1")),
    # Disaggregated endpoints' shared-storage KV hand-off (docs/disaggregation.md): a prompt's KV no decode replica
    # consumed is removed by the minutely sweep once it is this many seconds old.
    "KV_HANDOFF_TTL_S": float(env("INFERCAP_KV_HANDOFF_TTL_S", "300")),
    # Console and admin logins: locked for the rest of the window after this many failures per username and
    # address, or per address across usernames (tenants.throttling).
    "LOGIN_THROTTLE": {
        "failures_per_user_address": env_int("INFERCAP_LOGIN_FAILURES", 5),
        "failures_per_address": env_int("INFERCAP_LOGIN_FAILURES_PER_ADDRESS", 50),
        "window_s": env_int("INFERCAP_LOGIN_WINDOW_S", 900),
    },
    # Per-tenant provisioning quota defaults (tenants.quotas); an operator raises one tenant's in the admin or API.
    "TENANT_QUOTA": {
        "max_endpoints": env_int("INFERCAP_QUOTA_MAX_ENDPOINTS", 10),
        "max_replicas": env_int("INFERCAP_QUOTA_MAX_REPLICAS", 16),
        "max_gpus": env_int("INFERCAP_QUOTA_MAX_GPUS", 16),
        "max_warm_pool": env_int("INFERCAP_QUOTA_MAX_WARM_POOL", 4),
    },
    # Which actuator starts and stops an endpoint's replicas unless its launch options name one (local, kubernetes,
    # static); the worker's manifest sets kubernetes. The API server: this URL (e.g. kubectl proxy), else as kubectl
    # finds it: the pod's service account, then this kubeconfig, $KUBECONFIG or ~/.kube/config (exec plugins too).
    "AUTOSCALE_ACTUATOR": env("INFERCAP_ACTUATOR", "local"),
    "KUBERNETES_API_URL": env("INFERCAP_KUBERNETES_API_URL", ""),
    "KUBECONFIG": env("INFERCAP_KUBECONFIG", ""),
    # Where endpoints' Deployments live unless their launch options say; empty: the credentials' (a pod's own).
    "KUBERNETES_NAMESPACE": env("INFERCAP_KUBERNETES_NAMESPACE", ""),
    # Gang placement (docs/placement.md): the cluster's gang scheduler (none, kueue, volcano) and its queue; this
    # host's GPUs for the local actuator ("8", "8/2" for NVLink pairs; empty or 0: none, as on a CPU-only host).
    "GANG_SCHEDULER": env("INFERCAP_GANG_SCHEDULER", "none"),
    "GANG_QUEUE": env("INFERCAP_GANG_QUEUE", "infercap"),
    "LOCAL_GPUS": env("INFERCAP_LOCAL_GPUS", ""),
    # MIG slices (placement/mig.py): this host's MIG devices per profile for the local actuator
    # ("1g.10gb=MIG-<uuid>,MIG-<uuid>;3g.40gb=MIG-<uuid>"), and on Kubernetes the NVIDIA device plugin's MIG strategy
    # (mixed: one resource per profile, nvidia.com/mig-1g.10gb; single: nvidia.com/gpu on nodes cut one way).
    "LOCAL_MIG": env("INFERCAP_LOCAL_MIG", ""),
    "KUBERNETES_MIG_STRATEGY": env("INFERCAP_KUBERNETES_MIG_STRATEGY", "mixed"),
    # The defragmenting step on those GPUs (docs/placement.md, "Local"): small replicas moved, make-before-break, to
    # open room for a group that has waited; on by default, off with 0.
    "PLACEMENT_DEFRAG": env_bool("INFERCAP_PLACEMENT_DEFRAG", True),
    # The autoscaler starts at most this many replicas per endpoint per reconcile, and per 5 s tick fleet-wide.
    "AUTOSCALE_MAX_LAUNCHES_PER_TICK": env_int("INFERCAP_AUTOSCALE_MAX_LAUNCHES_PER_TICK", 8),
    "AUTOSCALE_MAX_FLEET_LAUNCHES_PER_TICK": env_int("INFERCAP_AUTOSCALE_MAX_FLEET_LAUNCHES_PER_TICK", 32),
    # Replicas of each endpoint whose /metrics the vertical tick reads (a fixed sample; 0: all):
    # docs/algorithms.md#the-vertical-tick-at-fleet-scale
    "AUTOSCALE_VERTICAL_SAMPLE": env_int("INFERCAP_AUTOSCALE_VERTICAL_SAMPLE", 3),
    # Blackbox health checks (endpoints.health.HealthConfig): probe a replica silent for idle_after_s,
    # fail it after failures_to_fail consecutive failed probes.
    "HEALTH": {
        "idle_after_s": float(env("INFERCAP_HEALTH_IDLE_S", "10")),
        "failures_to_fail": env_int("INFERCAP_HEALTH_FAILURES", 3),
        "ttft_timeout_s": float(env("INFERCAP_HEALTH_TTFT_TIMEOUT_S", "10")),
    },
}
