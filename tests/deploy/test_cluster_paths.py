"""The kubelet's and Prometheus' paths answer whatever the Host and over plain HTTP; every other path keeps
ALLOWED_HOSTS and the https redirect (config/cluster_paths.py)."""

import pytest

TOKEN = {"HTTP_AUTHORIZATION": "Bearer test-metrics-token"}


@pytest.fixture
def production_hosts(settings):
    settings.ALLOWED_HOSTS = ["infercap.example.internal"]
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")


@pytest.mark.django_db
def test_probes_and_the_platform_scrape_answer_the_pod_ip_over_plain_http(client, production_hosts):
    assert client.get("/healthz", HTTP_HOST="10.42.0.17:8000").status_code == 200
    assert client.get("/healthz", HTTP_HOST="127.0.0.1:8000").status_code == 200
    assert client.get("/metrics/platform", HTTP_HOST="10.42.0.17:8000", **TOKEN).status_code == 200
    assert client.get("/metrics/platform", HTTP_HOST="10.42.0.17:8000").status_code == 404, "still behind the token"


@pytest.mark.django_db
def test_every_other_path_keeps_allowed_hosts_and_the_https_redirect(client, production_hosts):
    assert client.get("/api/v1/", HTTP_HOST="10.42.0.17:8000").status_code == 400
    assert client.get("/healthz/x", HTTP_HOST="10.42.0.17:8000").status_code == 400
    redirect = client.get("/console/", HTTP_HOST="infercap.example.internal")
    assert redirect.status_code == 301 and redirect["Location"].startswith("https://infercap.example.internal/")
    secure = client.get("/api/v1/", HTTP_HOST="infercap.example.internal", HTTP_X_FORWARDED_PROTO="https")
    assert secure.status_code in (200, 401, 403)
