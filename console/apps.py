from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"
    verbose_name = "Web console"

    def ready(self) -> None:
        # Receivers that publish live events to the console's WebSocket groups. Imported here, in ready(): they
        # import models, which exist only once the app registry is loaded.
        from console import signals  # noqa: F401
