"""Settings fail closed: with DJANGO_SETTINGS_MODULE unset, manage.py, the ASGI app and the Celery app use the
production settings, which refuse to start without a real secret key, with DEBUG on, or on the embedded
backends; development asks for config.settings.local by name."""

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REAL = {
    "DJANGO_SECRET_KEY": secrets.token_urlsafe(64),
    "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/infercap",
    "REDIS_URL": "redis://127.0.0.1:6379/15",
}


def _run(argv: list[str], **env_changes) -> subprocess.CompletedProcess:
    env = {
        k: v for k, v in os.environ.items() if k not in {"DJANGO_SETTINGS_MODULE", "DJANGO_SECRET_KEY", "DJANGO_DEBUG"}
    }
    env.update(INFERCAP_QUIET="1", **env_changes)
    return subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


SHOW = "from django.conf import settings; print(settings.SETTINGS_MODULE, settings.DEBUG)"


@pytest.mark.parametrize(
    "argv",
    [
        ["manage.py", "check"],
        ["-c", "import config.asgi"],
        ["-c", "from config.celery_app import app; app.loader.import_default_modules()"],
    ],
    ids=["manage.py", "asgi", "celery"],
)
def test_unset_settings_module_refuses_to_start_without_production_secrets(argv):
    result = _run(argv)
    assert result.returncode != 0, result.stdout
    assert "ImproperlyConfigured" in result.stderr and "DJANGO_SECRET_KEY" in result.stderr
    assert "DJANGO_SETTINGS_MODULE=config.settings.local" in result.stderr  # says how to develop


def test_unset_settings_module_is_production_when_its_secrets_are_there():
    result = _run(["manage.py", "shell", "-c", SHOW], **REAL)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].split() == ["config.settings.production", "False"]


def test_development_is_asked_for_by_name():
    result = _run(["manage.py", "shell", "-c", SHOW], DJANGO_SETTINGS_MODULE="config.settings.local")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].split() == ["config.settings.local", "True"]


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"DJANGO_DEBUG": "1"}, "DJANGO_DEBUG must be off"),
        ({"DJANGO_SECRET_KEY": "django-insecure-" + secrets.token_urlsafe(48)}, "DJANGO_SECRET_KEY"),
        ({"DJANGO_SECRET_KEY": "x" * 64}, "DJANGO_SECRET_KEY"),
        ({"DJANGO_SECRET_KEY": "short-" + secrets.token_urlsafe(8)}, "DJANGO_SECRET_KEY"),
        ({"REDIS_URL": ""}, "REDIS_URL"),
    ],
    ids=["debug-on", "django-insecure-key", "one-character-key", "short-key", "no-redis"],
)
def test_production_refuses_debug_and_weak_secrets(changes, message):
    result = _run(
        ["manage.py", "check"], **{**REAL, **changes, "DJANGO_SETTINGS_MODULE": "config.settings.production"}
    )
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and message in result.stderr
