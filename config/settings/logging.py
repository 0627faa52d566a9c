"""Logging: structured enough to grep, never a key in clear (the proxy logs key prefixes only). One line per record,
with the request id of the Django request it belongs to; ``INFERCAP_LOG_FORMAT=json`` writes JSON lines
(config/request_log.py), which the Kubernetes ConfigMap sets."""

from .env import env

LOG_FORMAT = env("INFERCAP_LOG_FORMAT", "plain")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"request_id": {"()": "config.request_log.RequestIdFilter"}},
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "config.request_log.JsonFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "json" if LOG_FORMAT == "json" else "plain",
            "filters": ["request_id"],
        }
    },
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {"infercap": {"level": "INFO", "propagate": True}},
}
