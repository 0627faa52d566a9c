from django.apps import AppConfig
from django.db import connections
from django.db.models.signals import post_migrate

from tenants import change_triggers


def _install_change_triggers(using: str, **kwargs) -> None:
    change_triggers.install(connections[using])


class TenantsConfig(AppConfig):
    name = "tenants"
    verbose_name = "Tenants and access"

    def ready(self) -> None:
        # After every migrate: a migration that rebuilds or alters the tables may have dropped or broken them.
        post_migrate.connect(_install_change_triggers, sender=self, dispatch_uid="tenants.change_triggers")
