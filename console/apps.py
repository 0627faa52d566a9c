from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"
    verbose_name = "Web console"

    def ready(self) -> None:
        # Receivers that publish live events to the console's WebSocket groups.
        from console import signals  # noqa: F401
