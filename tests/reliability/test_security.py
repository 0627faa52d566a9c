"""Security settings and guards that need no running platform."""

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client

ROOT = Path(__file__).resolve().parents[2]


def test_production_settings_pass_check_deploy():
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.production",
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(64),
        "DATABASE_URL": os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/infercap"),
        "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15"),
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


@pytest.mark.parametrize("missing", ["DJANGO_SECRET_KEY", "DATABASE_URL"])
def test_production_settings_refuse_to_start_without_secrets(missing):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.production",
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(64),
        "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/infercap",
        "REDIS_URL": "redis://127.0.0.1:6379/15",
    }
    env.pop(missing)
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr


@pytest.mark.django_db
def test_console_forms_require_a_csrf_token(operator):
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    response = client.post("/console/endpoints/new/", {"name": "csrf-probe"})
    assert response.status_code == 403
    page = client.get("/console/endpoints/new/")
    assert page.status_code == 200 and b"csrfmiddlewaretoken" in page.content
