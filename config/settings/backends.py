"""Choose database, cache, channel layer and broker from DATABASE_URL / REDIS_URL.

With neither set the platform runs on an embedded default (SQLite, a file-system Celery broker,
in-process cache and channel layer) so that one command shows it working on a laptop.
"""

import os
from dataclasses import dataclass
from pathlib import Path

import dj_database_url


@dataclass(frozen=True)
class Backends:
    database: dict
    cache: dict
    channel_layer: dict
    redis_url: str
    celery_broker_url: str
    celery_broker_options: dict
    celery_result_backend: str
    embedded_database: bool
    embedded_redis: bool
    # A kombu transport class replacing the URL scheme's own (the embedded broker's: config/filesystem_broker.py).
    celery_broker_transport: str | None = None

    def describe(self) -> str:
        db = (
            "SQLite (embedded)"
            if self.embedded_database
            else f"PostgreSQL ({self.database.get('HOST')}:{self.database.get('PORT')}/{self.database.get('NAME')})"
        )
        redis = "embedded (file-system broker, in-memory channel layer and cache)" if self.embedded_redis else "Redis"
        return f"database: {db}; broker/cache/channel layer: {redis}"


def resolve_backends(*, database_url: str, redis_url: str, var_dir: Path) -> Backends:
    embedded_db = not database_url
    if embedded_db:
        var_dir.mkdir(parents=True, exist_ok=True)
        database = {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(var_dir / "infercap.sqlite3"),
            "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"},
        }
    else:
        database = dj_database_url.parse(database_url, conn_max_age=60, conn_health_checks=True)
        # Fail fast when PostgreSQL drops packets: the usage writer spools instead of blocking for minutes.
        database.setdefault("OPTIONS", {}).setdefault("connect_timeout", 3)
    embedded_redis = not redis_url
    if embedded_redis:
        broker_dir = var_dir / "broker"
        for sub in ("in", "processed", "control"):
            (broker_dir / sub).mkdir(parents=True, exist_ok=True)
        (var_dir / "results").mkdir(parents=True, exist_ok=True)
        return Backends(
            database=database,
            cache={"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
            channel_layer={"BACKEND": "channels.layers.InMemoryChannelLayer"},
            redis_url="",
            celery_broker_url="filesystem://localhost//",
            celery_broker_options={
                "data_folder_in": str(broker_dir / "in"),
                "data_folder_out": str(broker_dir / "in"),
                "processed_folder": str(broker_dir / "processed"),
                "control_folder": str(broker_dir / "control"),
                "store_processed": False,
            },
            celery_result_backend=f"file://{var_dir / 'results'}",
            embedded_database=embedded_db,
            embedded_redis=True,
            # kombu's own file-system transport lets a consumer read a message before it is written.
            celery_broker_transport="config.filesystem_broker:Transport",
        )
    return Backends(
        database=database,
        cache={"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": redis_url},
        channel_layer={"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [redis_url]}},
        redis_url=redis_url,
        celery_broker_url=redis_url,
        celery_broker_options=_redis_broker_options(int(os.environ.get("INFERCAP_BROKER_VISIBILITY_TIMEOUT", "3600"))),
        celery_result_backend=redis_url,
        embedded_database=embedded_db,
        embedded_redis=False,
    )


def _redis_broker_options(visibility_timeout_s: int) -> dict:
    """With late acks, a task whose worker died is redelivered once ``visibility_timeout_s`` has passed.

    kombu sweeps for such tasks only every interval × throttle seconds (100 s by default); sweep every
    third of the timeout instead, so redelivery follows the timeout rather than the sweep.
    """
    return {
        "visibility_timeout": visibility_timeout_s,
        "unacked_restore_interval": max(1, min(10, visibility_timeout_s // 3)),
        "unacked_restore_throttle": 1,
    }
