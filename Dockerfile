# infercap's image: web + proxy (config.asgi under uvicorn), Celery worker and beat all run from it; the command
# differs (platform/kustomize). The install step is scripts/bootstrap.sh, the script make run and CI run, from the
# hash-checked run lock (requirements/run.txt). GPU vLLM replicas use vLLM's own image: see platform/README.md.
# Build: docker build -t infercap:0.1.0 .

FROM python:3.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
# Compilers for any dependency without a binary wheel for this platform; they stay in this stage.
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY . .
RUN VENV=/opt/venv PYTHON=python3 scripts/bootstrap.sh run
# The console's CSS/JS, collected into STATIC_ROOT (staticfiles/) with gzip and Brotli copies that WhiteNoise serves
# by Accept-Encoding (config/settings/base.py); the development settings only because collectstatic needs no
# secret, database or Redis.
RUN DJANGO_SETTINGS_MODULE=config.settings.local /opt/venv/bin/python manage.py collectstatic --noinput -v 0

FROM python:3.11-slim-bookworm AS runtime
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    DJANGO_SETTINGS_MODULE=config.settings.production PROMETHEUS_MULTIPROC_DIR=/tmp/prometheus
RUN groupadd --system --gid 10001 infercap \
    && useradd --system --uid 10001 --gid infercap --home-dir /app --shell /usr/sbin/nologin infercap
COPY --from=build /opt/venv /opt/venv
COPY --from=build --chown=10001:10001 /app /app
WORKDIR /app
USER 10001:10001
EXPOSE 8000
# /healthz is Django's liveness (no database query); the standard library, since the slim image has no curl.
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2).status != 200)"]
# Every command of the image starts here: it prepares PROMETHEUS_MULTIPROC_DIR (created, a previous run's files
# removed) and then becomes the command (config/entrypoint.py). The manifests give only args, so it runs there too.
ENTRYPOINT ["python", "-m", "config.entrypoint"]
# The protocol bounds header and body time (config/http_server.py); what the ingress bounds: docs/security.md.
CMD ["uvicorn", "config.asgi:application", "--host", "0.0.0.0", "--port", "8000", "--proxy-headers", "--no-access-log", \
     "--http", "config.http_server:BoundedHttpToolsProtocol"]
